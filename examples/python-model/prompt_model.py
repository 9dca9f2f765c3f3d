"""A prompt-driven model: the manifest's `prompt` column names what to segment ("red" or "blue"),
as a referring-segmentation model takes one expression per row. Several rows may share one image,
each with its own prompt and mask. Returns one foreground score per image (a logit: > 0 is
foreground), so --thresholds sweeps it:

    tally run --model examples/python-model/prompt_model.py --manifest refs.csv --out results/ \
        --python /usr/bin/python3 --thresholds 0.3,0.5,0.7 --empty-score one --iou-thresholds 0.5,0.7,0.9

Needs numpy only.
"""
import numpy as np


class Model:
    def __init__(self, devices, options):
        self.gain = float(options.get("gain", "8"))

    def predict(self, images, rows):
        outs = []
        for image, row in zip(images, rows):
            rgb = image.astype(np.float32) / 255.0
            r, b = rgb[..., 0], rgb[..., 2]
            diff = r - b if row["prompt"].strip().lower() == "red" else b - r
            outs.append(self.gain * diff - 1.5)  # H x W float logits
        return outs
