#!/usr/bin/env python3
"""What users write today: torch.utils.data.DataLoader (num_workers processes, pin_memory) feeding
the same TorchScript model, with the same per-image, per-class Dice as Tally (counts on the GPU).
Decodes with PIL into uint8 tensors (the fast way: 4x fewer bytes than float). Reports the steady
rate after a warm-up of 3 batches, like Tally's worker statistic, and the wall time including the
DataLoader's start.

  python3 bench/gpu/tools/python_reference.py MODEL.pt MANIFEST.csv --workers 16 --pin 1 [--batch 32]
"""
import argparse
import csv
import json
import os
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    def __init__(self, manifest):
        root = os.path.dirname(os.path.abspath(manifest))
        with open(manifest) as f:
            self.rows = [(os.path.join(root, r["image"]), os.path.join(root, r["mask"])) for r in csv.DictReader(f)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        img = np.asarray(Image.open(self.rows[i][0]).convert("RGB"))
        mask = np.asarray(Image.open(self.rows[i][1]))
        return torch.from_numpy(img.copy()), torch.from_numpy(mask.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("manifest")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--pin", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    t_start = time.time()
    torch.backends.cudnn.benchmark = True
    model = torch.jit.load(a.model, map_location="cuda").eval()
    loader = DataLoader(Pairs(a.manifest), batch_size=a.batch, num_workers=a.workers, pin_memory=bool(a.pin),
                        shuffle=False, persistent_workers=False, prefetch_factor=4 if a.workers else None)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float16
    ctx = torch.autocast("cuda", dtype=dtype) if a.precision != "fp32" else torch.autocast("cuda", enabled=False)
    dice_sum = torch.zeros(2, device="cuda", dtype=torch.float64)
    dice_n = torch.zeros(2, device="cuda", dtype=torch.float64)
    images, warm, t0 = 0, 3, None
    with torch.inference_mode(), ctx:
        for i, (img, mask) in enumerate(loader):
            if i == warm:
                torch.cuda.synchronize()
                t0, images = time.time(), 0
            x = img.cuda(non_blocking=True).permute(0, 3, 1, 2).float().div_(255)
            m = mask.cuda(non_blocking=True)
            out = model(x)["out"]
            pred = out.argmax(1)
            for c in range(2):
                p, r = pred == c, m == c
                tp = (p & r).sum((1, 2)).double()
                den = p.sum((1, 2)).double() + r.sum((1, 2)).double()
                ok = den > 0
                dice_sum[c] += torch.where(ok, 2 * tp / den.clamp(min=1), 0).sum()
                dice_n[c] += ok.sum()
            images += img.shape[0]
        torch.cuda.synchronize()
    t1 = time.time()
    print(json.dumps({"model": os.path.basename(a.model), "manifest": a.manifest, "workers": a.workers,
                      "pin_memory": bool(a.pin), "precision": a.precision,
                      "steady_images_per_second": images / (t1 - t0),
                      "wall_images_per_second": len(loader.dataset) / (t1 - t_start),
                      "dice_mean": (dice_sum / dice_n).tolist()}))


if __name__ == "__main__":
    main()
