#!/usr/bin/env python3
"""Model-only ceiling in eager mode: torchvision's LRASPP / DeepLabV3 (as bench/gpu/torchvision_model.py
builds them) with inputs already on the GPU, forward pass only, no_grad, cuDNN benchmark off (as
Tally runs). Also times the same model scripted (TorchScript) in the same process, for the ratio
that no Python-backend pipeline can beat.

  python3 bench/gpu/eager_ceiling.py [--arch lraspp|deeplabv3] [--batch 32] [--size 512]
"""
import argparse
import json
import statistics

import torch
from torchvision.models.segmentation import deeplabv3_resnet50, lraspp_mobilenet_v3_large


def rate(fn, x, batch, iters=20):
    with torch.no_grad():
        for _ in range(8):
            fn(x)
        torch.cuda.synchronize()
        rates = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn(x)
            end.record()
            end.synchronize()
            rates.append(batch * iters / (start.elapsed_time(end) / 1000.0))
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="lraspp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=512)
    a = ap.parse_args()
    ctor = {"lraspp": lraspp_mobilenet_v3_large, "deeplabv3": deeplabv3_resnet50}[a.arch]
    torch.manual_seed(0)
    model = ctor(weights=None, weights_backbone=None, num_classes=2).eval().cuda()
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda")
    eager = rate(lambda t: model(t)["out"], x, a.batch)
    scripted = torch.jit.script(model)
    ts = rate(lambda t: scripted(t)["out"], x, a.batch)
    print(json.dumps({"arch": a.arch, "batch": a.batch, "eager_images_per_second": eager,
                      "torchscript_images_per_second": ts, "eager_over_torchscript": eager / ts}))


if __name__ == "__main__":
    main()
