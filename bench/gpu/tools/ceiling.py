#!/usr/bin/env python3
"""Model-only ceiling: the same TorchScript model in one process with inputs already on the GPU.
Times the forward pass alone (CUDA events, median of 5 runs of 20 batches after warm-up).

  python3 bench/gpu/tools/ceiling.py MODEL.pt [--batch 32] [--size 512] [--precision fp32|bf16]
"""
import argparse
import json
import statistics

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    model = torch.jit.load(a.model, map_location="cuda").eval()
    inputs = [torch.rand(a.batch, 3, a.size, a.size, device="cuda") for _ in range(3)]
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float16
    ctx = torch.autocast("cuda", dtype=dtype) if a.precision != "fp32" else torch.autocast("cuda", enabled=False)
    with torch.inference_mode(), ctx:
        for i in range(8):
            model(inputs[i % 3])
        torch.cuda.synchronize()
        rates = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(a.iters):
                model(inputs[i % 3])
            end.record()
            end.synchronize()
            rates.append(a.batch * a.iters / (start.elapsed_time(end) / 1000.0))
    print(json.dumps({"model": a.model, "precision": a.precision, "batch": a.batch,
                      "ceiling_images_per_second": statistics.median(rates)}))


if __name__ == "__main__":
    main()
