#!/usr/bin/env python3
"""What a TorchScript model's first forward pass on the GPU spends its time on (issue 14, goal 4:
the 0.4 s first pass that follows the model load in a fresh worker), under one setting per fresh
process:

  default    as tally-worker runs it (graph executor optimisation off, cuDNN benchmark off)
  v7         TORCH_CUDNN_V8_API_DISABLED=1: cuDNN's older convolution API
  nocudnn    cuDNN off: LibTorch's own convolution kernels (how much of the first pass is cuDNN's)
  eager      CUDA_MODULE_LOADING=EAGER: every kernel loaded at CUDA's initialisation
  profile    the default, with torch.profiler over the first pass: the ops that took its CPU time
  prewarm    the default after a generic warm-up (no model: common layers on a small input) run
             before the model is loaded: what a worker could do while it reads the model
  small      the model once on 1x3x64x64 first: how much of the first pass depends on the shape
  reserve    2 GiB taken from the caching allocator and given back before the first pass

Per setting: import, CUDA initialisation, torch.jit.load onto the CPU, .to(cuda), the first three
passes contiguous and channels-last (what --channels-last auto's trial runs), the steady pass.

  python3 bench/gpu/first_pass_probe.py MODEL.pt [--batch 32] [--size 512] [--modes default,v7]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ENV = {"default": {}, "profile": {}, "prewarm": {}, "small": {}, "reserve": {}, "v7": {"TORCH_CUDNN_V8_API_DISABLED": "1"}, "nocudnn": {},
       "eager": {"CUDA_MODULE_LOADING": "EAGER"}}


def generic_warm_up(torch):
    """Layers common to segmentation networks, on a small input, with no model."""
    import torch.nn.functional as F
    with torch.no_grad():
        x = torch.rand(2, 3, 64, 64, device="cuda")
        w3 = torch.rand(16, 3, 3, 3, device="cuda")
        dw = torch.rand(16, 1, 3, 3, device="cuda")
        w1 = torch.rand(8, 16, 1, 1, device="cuda")
        g, b = torch.ones(16, device="cuda"), torch.zeros(16, device="cuda")
        y = F.conv2d(x, w3, padding=1, stride=2)
        y = F.batch_norm(y, b, g, g, b, False)
        y = F.hardswish(F.relu(y))
        y = F.conv2d(y, dw, padding=1, groups=16)
        y = y * F.hardsigmoid(y.mean((2, 3), keepdim=True)) + torch.sigmoid(y)
        y = F.conv2d(F.adaptive_avg_pool2d(y, 1) + y, w1)
        y = F.interpolate(y, size=(64, 64), mode="bilinear", align_corners=False)
        torch.cat([y, y], 1).softmax(1).argmax(1)
    torch.cuda.synchronize()


def child(a):
    t0 = time.time()
    import torch
    out = {"mode": a.mode, "import": round(time.time() - t0, 3)}
    torch._C._set_graph_executor_optimize(False)
    if a.mode == "nocudnn":
        torch.backends.cudnn.enabled = False
    t0 = time.time()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out["cuda_init"] = round(time.time() - t0, 3)
    if a.mode == "prewarm":
        t0 = time.time()
        generic_warm_up(torch)
        out["prewarm"] = round(time.time() - t0, 3)
    t0 = time.time()
    m = torch.jit.load(a.model, map_location="cpu").eval()
    out["load_cpu"] = round(time.time() - t0, 3)
    t0 = time.time()
    m.to("cuda")
    torch.cuda.synchronize()
    out["to_cuda"] = round(time.time() - t0, 3)
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda")
    if a.mode == "small":
        t0 = time.time()
        with torch.no_grad():
            m(torch.rand(1, 3, 64, 64, device="cuda"))
        torch.cuda.synchronize()
        out["small_pass"] = round(time.time() - t0, 3)
    if a.mode == "reserve":
        t0 = time.time()
        del_me = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        del del_me
        out["reserve"] = round(time.time() - t0, 3)

    def passes(t, n):
        times = []
        for _ in range(n):
            s = time.time()
            with torch.no_grad():
                m(t)
            torch.cuda.synchronize()
            times.append(round(time.time() - s, 4))
        return times

    if a.mode == "profile":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            first = passes(x, 1)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        out["contiguous_first"] = first + passes(x, 2)
    else:
        table = None
        out["contiguous_first"] = passes(x, 3)
    out["contiguous_steady_ms"] = round(1000 * min(passes(x, 10)), 2)
    libs = lambda: sorted({l.rsplit("/", 1)[-1] for l in open("/proc/self/maps").read().splitlines()
                           if "nvrtc" in l or "cudnn" in l})
    out["libraries_contiguous"] = libs()
    xc = x.contiguous(memory_format=torch.channels_last)
    m.to(memory_format=torch.channels_last)
    out["channels_last_first"] = passes(xc, 3)
    out["channels_last_steady_ms"] = round(1000 * min(passes(xc, 10)), 2)
    out["libraries_added_by_channels_last"] = sorted(set(libs()) - set(out["libraries_contiguous"]))
    print(json.dumps(out), flush=True)
    if table:
        print(table, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--modes", default="default,prewarm,small,reserve,v7,nocudnn,profile")
    ap.add_argument("--mode", default="")
    a = ap.parse_args()
    if a.mode:
        child(a)
        return
    for mode in a.modes.split(","):
        env = dict(os.environ, **ENV[mode])
        subprocess.run([sys.executable, __file__, a.model, "--batch", str(a.batch), "--size", str(a.size),
                        "--mode", mode], env=env, check=False)


if __name__ == "__main__":
    main()
