#!/usr/bin/env python3
"""Trains torchvision's LRASPP-MobileNetV3-Large (2 classes) briefly on a `tally-make-dataset`
folder and saves it as TorchScript, so benchmarks see a model whose predictions look like a real
model's (shapes with boundaries near the reference's), not the all-foreground or speckled output
of random weights: surface metrics cost what they cost on real predictions.

  python3 bench/gpu/tools/train_lraspp.py DATASET_DIR OUT.pt [--steps 300] [--images 256]

Seeded; takes ~20 s on an H100. Prints the held-out Dice of the foreground class.
"""
import argparse
import csv
import os
import time

import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, read_image
from torchvision.models.segmentation import lraspp_mobilenet_v3_large


def load(root, rows, device):
    images, masks = [], []
    for image, mask in rows:
        images.append(read_image(os.path.join(root, image), ImageReadMode.RGB))
        masks.append(read_image(os.path.join(root, mask), ImageReadMode.GRAY)[0])
    x = torch.stack(images).to(device)  # uint8 N x 3 x H x W
    y = torch.stack(masks).to(device).long().clamp(max=1)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with open(os.path.join(args.dataset, "manifest.csv")) as f:
        rows = [(r["image"], r["mask"]) for r in csv.DictReader(f)]
    train_x, train_y = load(args.dataset, rows[: args.images], device)
    test_x, test_y = load(args.dataset, rows[args.images : args.images + 64], device)
    model = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    start = time.time()
    model.train()
    g = torch.Generator(device="cpu").manual_seed(0)
    for step in range(args.steps):
        idx = torch.randint(0, train_x.shape[0], (args.batch,), generator=g).to(device)
        x = train_x[idx].float().div(255)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = F.cross_entropy(model(x)["out"].float(), train_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    # MobileNetV3's batch norms keep running statistics with momentum 0.01: after a few hundred
    # steps they still lag the weights, and eval-mode predictions come out all background.
    # Recompute them as plain averages over the training images.
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        for i in range(0, train_x.shape[0], args.batch):
            model(train_x[i : i + args.batch].float().div(255))
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(test_x[i : i + 16].float().div(255))["out"].argmax(1) for i in range(0, test_x.shape[0], 16)])
    tp = ((pred == 1) & (test_y == 1)).sum().item()
    dice = 2 * tp / max(1, (pred == 1).sum().item() + (test_y == 1).sum().item())
    print(f"trained {args.steps} steps in {time.time() - start:.1f} s; held-out foreground Dice {dice:.3f}")
    torch.jit.script(model.cpu()).save(args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
