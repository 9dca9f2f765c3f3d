#!/usr/bin/env python3
"""Cross-checks Tally's per-image Dice and IoU (per_image.csv of a finished run) against
torchmetrics on the same predictions, computed here on the GPU with the same TorchScript model.
Images with ignore pixels (255) are skipped: torchmetrics' segmentation metrics have no ignore
index. Prints how many values agree and where the conventions differ.

  python3 bench/gpu/tools/torchmetrics_crosscheck.py MODEL.pt MANIFEST.csv TALLY_OUT_DIR
"""
import collections
import csv
import inspect
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchmetrics
from PIL import Image
from torchmetrics.functional.segmentation import dice_score, mean_iou


def call(fn, **kw):
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kw.items() if k in params})


def main(model_path, manifest, out):
    root = os.path.dirname(os.path.abspath(manifest))
    with open(manifest) as f:
        rows = list(csv.DictReader(f))
    tally = collections.defaultdict(dict)
    with open(os.path.join(out, "per_image.csv")) as f:
        for r in csv.DictReader(f):
            tally[int(r["index"])][int(r["class"])] = (float(r["dice"]), float(r["iou"]))
    model = torch.jit.load(model_path, map_location="cuda").eval()
    stats = collections.Counter()
    worst = {"dice": 0.0, "iou": 0.0}
    for i, row in enumerate(rows):
        mask = np.asarray(Image.open(os.path.join(root, row["mask"])))
        if (mask == 255).any() or i not in tally:
            stats["skipped (ignore pixels or failed)"] += 1
            continue
        img = np.asarray(Image.open(os.path.join(root, row["image"])).convert("RGB"))
        with torch.inference_mode():
            x = torch.from_numpy(img.copy()).cuda().permute(2, 0, 1)[None].float() / 255
            logits = model(x)
            logits = logits["out"] if isinstance(logits, dict) else logits
            if logits.shape[-2:] != x.shape[-2:]:
                logits = F.interpolate(logits.float(), size=x.shape[-2:], mode="bilinear", align_corners=False)
            k = logits.shape[1]
            pred = logits.argmax(1)
            target = torch.from_numpy(mask.astype(np.int64)).cuda()[None]
            d = call(dice_score, preds=pred, target=target, num_classes=k, include_background=True, average="none",
                     input_format="index", aggregation_level="samplewise")
            j = call(mean_iou, preds=pred, target=target, num_classes=k, include_background=True, per_class=True,
                     input_format="index")
        d, j = d.reshape(-1).tolist(), j.reshape(-1).tolist()
        for c in range(k):
            td, ti = tally[i][c]
            for name, t, m in (("dice", td, d[c]), ("iou", ti, j[c])):
                if math.isnan(t) and math.isnan(m):
                    stats[f"{name}: both NaN"] += 1
                elif math.isnan(t):
                    stats[f"{name}: Tally NaN (class absent in both), torchmetrics {m:g}"] += 1
                elif math.isnan(m):
                    stats[f"{name}: torchmetrics NaN, Tally {t:g}"] += 1
                elif abs(t - m) <= 1e-6:
                    stats[f"{name}: equal within 1e-6"] += 1
                    worst[name] = max(worst[name], abs(t - m))
                else:
                    stats[f"{name}: differ (Tally {t:.4f}, torchmetrics {m:.4f})"] += 1
    print(json.dumps({"torchmetrics": torchmetrics.__version__, "model": os.path.basename(model_path),
                      "max_abs_diff_where_both_defined": worst, "counts": dict(stats)}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
