#!/usr/bin/env python3
"""Model-only ceiling in eager mode: torchvision's LRASPP / DeepLabV3 (as bench/gpu/tools/torchvision_model.py
builds them) with inputs already on the GPU, forward pass only, no_grad, cuDNN benchmark off (as
Tally runs). Also times the same model scripted (TorchScript) in the same process, for the ratio
that no Python-backend pipeline can beat.

  python3 bench/gpu/tools/eager_ceiling.py [--arch lraspp|deeplabv3] [--batch 32] [--size 512]
                                    [--precision fp32|bf16|fp16] [--layouts]

--layouts adds a side-by-side of the layouts: eager and TorchScript, each contiguous and
channels-last (model and input), under the given precision (autocast), and names the best.
"""
import argparse
import json
import statistics

import torch
from torchvision.models.segmentation import deeplabv3_resnet50, lraspp_mobilenet_v3_large


def rate(fn, x, batch, iters=20, precision="fp32"):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    ctx = torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)
    with torch.no_grad(), ctx:
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
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--layouts", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also the model torch.compile'd (dynamic=False)")
    a = ap.parse_args()
    ctor = {"lraspp": lraspp_mobilenet_v3_large, "deeplabv3": deeplabv3_resnet50}[a.arch]
    torch.manual_seed(0)
    model = ctor(weights=None, weights_backbone=None, num_classes=2).eval().cuda()
    x = torch.rand(a.batch, 3, a.size, a.size, device="cuda")
    eager = rate(lambda t: model(t)["out"], x, a.batch, precision=a.precision)
    scripted = torch.jit.script(model)
    ts = rate(lambda t: scripted(t)["out"], x, a.batch, precision=a.precision)
    out = {"arch": a.arch, "batch": a.batch, "precision": a.precision, "eager_images_per_second": eager,
           "torchscript_images_per_second": ts, "eager_over_torchscript": eager / ts}
    if a.compile:  # As Tally's --compile applies it (python/tally/stub.py _compile).
        import time
        compiled = torch.compile(model, dynamic=False)
        t0 = time.time()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            ref, got = model(x)["out"], compiled(x)["out"]
        torch.cuda.synchronize()
        out["compile_first_call_seconds"] = time.time() - t0
        out["compiled_images_per_second"] = rate(lambda t: compiled(t)["out"], x, a.batch, precision=a.precision)
        out["compiled_over_eager"] = out["compiled_images_per_second"] / eager
        out["compiled_max_abs_logit_diff"] = float((ref.float() - got.float()).abs().max())
        out["compiled_argmax_agreement"] = float((ref.argmax(1) == got.argmax(1)).float().mean())
    if a.layouts:
        cl = torch.channels_last
        side = {}
        for name, fn, fmt in (("torchscript", lambda t: scripted(t)["out"], None),
                              ("eager", lambda t: model(t)["out"], None)):
            for layout in ("contiguous", "channels_last"):
                model.to(memory_format=cl if layout == "channels_last" else torch.contiguous_format)
                scripted = torch.jit.script(model)  # Scripted again: its parameters in this layout.
                xi = x.contiguous(memory_format=cl) if layout == "channels_last" else x.contiguous()
                fn = (lambda t: scripted(t)["out"]) if name == "torchscript" else (lambda t: model(t)["out"])
                side[f"{name}_{layout}"] = rate(fn, xi, a.batch, precision=a.precision)
        out.update({"precision": a.precision, "side_by_side_images_per_second": side,
                    "best": max(side, key=side.get), "best_images_per_second": max(side.values())})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
