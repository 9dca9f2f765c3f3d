#!/usr/bin/env python3
"""Exports the benchmark models as TorchScript: torchvision's LRASPP-MobileNetV3-Large (light,
data-path bound) and DeepLabV3-ResNet50 (compute bound), 2 classes, random weights (seeded).
Both return {"out": logits}; Tally and the Python reference read "out".

  python3 bench/gpu/tools/export_models.py OUT_DIR [lraspp|deeplabv3 ...]
"""
import os
import sys

import torch
from torchvision.models.segmentation import deeplabv3_resnet50, lraspp_mobilenet_v3_large


def main(out, names):
    os.makedirs(out, exist_ok=True)
    for name, ctor in (("lraspp", lraspp_mobilenet_v3_large), ("deeplabv3", deeplabv3_resnet50)):
        if names and name not in names:
            continue
        torch.manual_seed(0)
        model = ctor(weights=None, weights_backbone=None, num_classes=2).eval()
        scripted = torch.jit.script(model)
        path = os.path.join(out, name + ".pt")
        scripted.save(path)
        print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models", sys.argv[2:])
