#!/usr/bin/python3
"""Generates Tally's bundled demo: a small synthetic dataset and a small TorchScript model.

Run with Debian's Python (it has numpy, PIL and torch):  /usr/bin/python3 examples/demo/make_demo.py
Writes, next to this script:
  images/case_XXX.{png,jpg}   RGB images: red disks (class 1) and blue boxes (class 2) on a noisy
                              grey background; a few are JPEG and a few have another size
  masks/case_XXX.png          8-bit class-index masks; some have a band of 255 (ignore) pixels
  manifest.csv                id,image,mask
  model.pt                    TorchScript: 3x3 smoothing, then hand-set per-pixel colour logits
                              for 3 classes (no training; good but not perfect segmentations)
The output is deterministic (fixed seed).
"""
import os

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(20261121)


def make_case(h, w):
    mask = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(RNG.integers(1, 4)):  # red disks
        cy, cx, r = RNG.uniform(0.2, 0.8) * h, RNG.uniform(0.2, 0.8) * w, RNG.uniform(0.08, 0.2) * min(h, w)
        mask[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = 1
    for _ in range(RNG.integers(0, 3)):  # blue boxes
        y0, x0 = int(RNG.uniform(0, 0.7) * h), int(RNG.uniform(0, 0.7) * w)
        bh, bw = int(RNG.uniform(0.1, 0.3) * h), int(RNG.uniform(0.1, 0.3) * w)
        mask[y0:y0 + bh, x0:x0 + bw] = 2
    colours = np.array([[0.35, 0.35, 0.35], [0.80, 0.25, 0.20], [0.20, 0.30, 0.80]], np.float32)
    img = colours[mask]
    # Smooth shading and noise so the model makes some mistakes near edges and in dark corners.
    shade = 0.15 * np.sin(xx / w * 3.0 + RNG.uniform(0, 6))[..., None]
    img = img + shade + RNG.normal(0, 0.12, img.shape).astype(np.float32)
    img = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    return img, mask


class DemoSegmenter(torch.nn.Module):
    """3x3 mean filter, then logits: background 0, red = f(r - b), blue = f(b - r)."""

    def __init__(self):
        super().__init__()
        self.smooth = torch.nn.Conv2d(3, 3, 3, padding=1, groups=3, bias=False)
        self.head = torch.nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.smooth.weight.fill_(1.0 / 9.0)
            self.head.weight.zero_()
            self.head.bias.zero_()
            # class 1 (red): 8 * (r - b) - 1.5 ; class 2 (blue): 8 * (b - r) - 1.5
            self.head.weight[1, 0, 0, 0] = 8.0
            self.head.weight[1, 2, 0, 0] = -8.0
            self.head.bias[1] = -1.5
            self.head.weight[2, 2, 0, 0] = 8.0
            self.head.weight[2, 0, 0, 0] = -8.0
            self.head.bias[2] = -1.5

    def forward(self, x):
        return self.head(self.smooth(x))


def main():
    os.makedirs(os.path.join(HERE, "images"), exist_ok=True)
    os.makedirs(os.path.join(HERE, "masks"), exist_ok=True)
    rows = ["id,image,mask"]
    for i in range(48):
        h, w = (96, 128) if i % 8 else (128, 128)
        img, mask = make_case(h, w)
        if i % 6 == 5:
            mask[:, :4] = 255  # an unlabelled band: ignored by every count
        name = f"case_{i:03d}"
        ext = "jpg" if i % 10 == 3 else "png"
        if ext == "jpg":
            Image.fromarray(img).save(os.path.join(HERE, "images", f"{name}.jpg"), quality=92)
        else:
            Image.fromarray(img).save(os.path.join(HERE, "images", f"{name}.png"), optimize=True)
        Image.fromarray(mask).save(os.path.join(HERE, "masks", f"{name}.png"), optimize=True)
        rows.append(f"{name},images/{name}.{ext},masks/{name}.png")
    with open(os.path.join(HERE, "manifest.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    model = torch.jit.script(DemoSegmenter().eval())
    model.save(os.path.join(HERE, "model.pt"))
    print(f"wrote 48 cases, manifest.csv and model.pt to {HERE}")


if __name__ == "__main__":
    main()
