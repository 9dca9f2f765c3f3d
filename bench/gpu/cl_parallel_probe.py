#!/usr/bin/env python3
"""Can the channels-last trial's cold pass (cuDNN 9 compiling NHWC kernels at run time, 2-3 s for
LRASPP) be cut by building the convolutions' plans on several threads first? PyTorch keeps cuDNN
plans per thread, so this only helps if cuDNN keeps what it compiled for the whole process.
Each mode in a fresh process: the model's convolution configurations are recorded on a contiguous
pass (forward pre-hooks), then either the channels-last pass runs cold (`serial`) or the recorded
convolutions run first on N threads in channels-last (`parallel`), then the pass is timed.

  python3 bench/gpu/cl_parallel_probe.py [--threads 8]
"""
import argparse
import json
import subprocess
import sys
import time


def child(mode, threads):
    import torch
    import torch.nn.functional as F
    from concurrent.futures import ThreadPoolExecutor
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large
    m = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=2).cuda().eval()
    x = torch.rand(32, 3, 512, 512, device="cuda")
    configs = set()

    def hook(mod, inp):
        configs.add((tuple(inp[0].shape), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation, mod.groups,
                     mod.bias is not None))
    hs = [c.register_forward_pre_hook(hook) for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    with torch.no_grad():
        m(x)
    torch.cuda.synchronize()
    for h in hs:
        h.remove()
    out = {"mode": mode, "configs": len(configs)}
    m = m.to(memory_format=torch.channels_last)
    xc = x.contiguous(memory_format=torch.channels_last)
    if mode == "parallel":
        def warm(c):
            shape, wshape, stride, padding, dilation, groups, bias = c
            with torch.no_grad():
                a = torch.rand(shape, device="cuda").contiguous(memory_format=torch.channels_last)
                w = torch.rand(wshape, device="cuda").contiguous(memory_format=torch.channels_last)
                b = torch.rand(wshape[0], device="cuda") if bias else None
                F.conv2d(a, w, b, stride, padding, dilation, groups)
            torch.cuda.synchronize()
        t0 = time.time()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(warm, sorted(configs)))
        out["parallel_warm"] = round(time.time() - t0, 3)
    times = []
    for _ in range(3):
        t0 = time.time()
        with torch.no_grad():
            m(xc)
        torch.cuda.synchronize()
        times.append(round(time.time() - t0, 4))
    out["channels_last_passes"] = times
    print(json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--mode", default="")
    a = ap.parse_args()
    if a.mode:
        child(a.mode, a.threads)
        return
    for mode in ("serial", "parallel", "serial", "parallel"):
        subprocess.run([sys.executable, __file__, "--mode", mode, "--threads", str(a.threads)], check=False)


if __name__ == "__main__":
    main()
