"""Writes input sequences that once crashed a fuzz target only in that order, in one process (a
per-thread buffer carries state from input to input), into DIR/<target>/NN_name: run.sh replays each
target's sequence after fuzzing it. Too large to commit as seeds (megabytes), so written at test
time. Run with Debian's python3 (PIL, numpy).
    python3 tests/fuzz/make_sequences.py DIR"""
import io
import os
import sys

import numpy as np
from PIL import Image


def webp(pixels):
    b = io.BytesIO()
    Image.fromarray(pixels).save(b, format="WEBP", lossless=True)
    return b.getvalue()


def main(out):
    rng = np.random.default_rng(0)
    d = os.path.join(out, "webp")
    os.makedirs(d, exist_ok=True)
    # webp (fixed in d446e6d): two truncated lossless WebPs of noise, within the fuzz targets'
    # pixel limit, each failing to decode after the mask buffer was sized for it: the second grows
    # it past the 16 MiB a buffer keeps. Then a small colour mask: its error message read its first
    # colour pixel from the buffer after releasing it (ASan: heap-use-after-free).
    for i, (h, w) in enumerate(((1500, 2048), (2048, 2048))):
        data = webp(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        with open(os.path.join(d, f"{i:02d}_truncated_{h}x{w}.webp"), "wb") as f:
            f.write(data[: len(data) // 2])
    colour = np.full((9, 11, 3), 7, np.uint8)
    colour[3, 4] = (1, 2, 3)
    with open(os.path.join(d, "02_colour_mask.webp"), "wb") as f:
        f.write(webp(colour))


if __name__ == "__main__":
    main(sys.argv[1])
