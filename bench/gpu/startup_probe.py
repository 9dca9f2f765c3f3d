#!/usr/bin/env python3
"""Where a TorchScript model's first passes spend their time on the GPU (issue 14's start-up tax):
CUDA initialisation, loading, then each of the first passes over one batch, contiguous and then
channels-last (what --channels-last auto's trial runs), and the steady rate of each layout, under
one JIT setting per fresh process:

  default   TorchScript as LibTorch runs it out of the box (profiling executor, NNC fusion)
  nofuse    the profiling executor without the tensor-expression fuser
  noopt     graph executor optimisation off (the interpreter runs the graph op by op)
  legacy    the legacy executor (optimises once, no profiling runs)

  python3 bench/gpu/startup_probe.py MODEL.pt [--batch 32] [--size 512] [--precision fp32|bf16]
"""
import argparse
import json
import subprocess
import sys
import time


def child(a):
    t0 = time.time()
    import torch
    t_import = time.time() - t0
    if a.mode == "nofuse":
        torch._C._jit_set_texpr_fuser_enabled(False)
    elif a.mode == "noopt":
        torch._C._set_graph_executor_optimize(False)
    elif a.mode == "legacy":
        torch._C._jit_set_profiling_executor(False)
    t0 = time.time()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t_cuda = time.time() - t0
    t0 = time.time()
    m = torch.jit.load(a.model, map_location="cuda").eval()
    torch.cuda.synchronize()
    t_load = time.time() - t0
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    ctx = (lambda: torch.autocast("cuda", dtype=dtype)) if dtype else (lambda: torch.autocast("cuda", enabled=False))
    out = {"mode": a.mode, "import": t_import, "cuda_init": t_cuda, "load": t_load}

    def passes(t, n):
        times = []
        for _ in range(n):
            s = time.time()
            with torch.no_grad(), ctx():
                r = m(t)
            torch.cuda.synchronize()
            times.append(round(time.time() - s, 4))
        return times

    out["contiguous_first"] = passes(x, 6)
    out["contiguous_steady_ms"] = 1000 * min(passes(x, 10))
    xc = x.contiguous(memory_format=torch.channels_last)
    m.to(memory_format=torch.channels_last)
    out["channels_last_first"] = passes(xc, 6)
    out["channels_last_steady_ms"] = 1000 * min(passes(xc, 10))
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--mode", default="")
    a = ap.parse_args()
    if a.mode:
        child(a)
        return
    for mode in ("default", "nofuse", "noopt", "legacy"):
        subprocess.run([sys.executable, __file__, a.model, "--batch", str(a.batch), "--size", str(a.size),
                        "--precision", a.precision, "--mode", mode], check=False)


if __name__ == "__main__":
    main()
