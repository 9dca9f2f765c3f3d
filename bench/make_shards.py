#!/usr/bin/env python3
"""A manifest's samples as WebDataset tar shards (docs/data.md "Where your data can be"): KEY.EXT for the
image (its own extension), KEY.seg.png for the mask, SAMPLES samples a shard, in the manifest's order;
KEY is the row's id (or the image's stem). Used by the benchmarks to compare shards with loose files.

  bench/make_shards.py MANIFEST OUT_DIR [--samples 256] [--compress gz]
"""
import argparse
import csv
import os
import tarfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("out")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--compress", default="", choices=["", "gz", "xz", "bz2"])
    a = ap.parse_args()
    base = os.path.dirname(os.path.abspath(a.manifest))
    with open(a.manifest) as f:
        rows = list(csv.DictReader(f))
    os.makedirs(a.out, exist_ok=True)
    suffix = ".tar" + ("." + a.compress if a.compress else "")
    n = 0
    for s in range(0, len(rows), a.samples):
        path = os.path.join(a.out, f"shard-{s // a.samples:06d}{suffix}")
        with tarfile.open(path, "w:" + a.compress if a.compress else "w", format=tarfile.USTAR_FORMAT) as t:
            for r in rows[s:s + a.samples]:
                image = os.path.join(base, r["image"])
                key = r.get("id") or os.path.splitext(os.path.basename(image))[0]
                t.add(image, arcname=key + os.path.splitext(image)[1].lower(), recursive=False)
                t.add(os.path.join(base, r["mask"]), arcname=key + ".seg.png", recursive=False)
        n += 1
    print(f"{len(rows)} samples in {n} shards: {os.path.join(a.out, 'shard-*' + suffix)}")


if __name__ == "__main__":
    main()
