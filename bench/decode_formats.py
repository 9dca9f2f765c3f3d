#!/usr/bin/env python3
"""Decode rate per core of every image format Tally reads (docs/data.md "Where your data can be",
BENCHMARKS.md): the same photograph-like 512x512 images (tally-make-dataset: shading, texture,
sensor noise) stored as PNG, JPEG q90, TIFF (none, LZW, deflate), WebP (lossy q90, lossless) and
DICOM (12-bit MONOCHROME2, the images' grey levels x 16 plus noise, native and RLE), each decoded
by Tally's decoder on one thread (tally-bench-cpu --mode decode --images-only: read from the page
cache + decode, as a worker's decode thread does). Fixtures with Debian's python3-pil,
python3-tifffile and python3-pydicom.

  bench/decode_formats.py --bin build/bin [--count 64] [--seconds 5] [--threads 1]
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
from PIL import Image


def dicom(path, grey12, rle=False):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1"  # CR Image Storage.
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID, "CR"
    ds.Rows, ds.Columns = grey12.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.WindowCenter, ds.WindowWidth = "2048", "4096"
    ds.PixelData = grey12.astype("<u2").tobytes()
    if rle:
        ds.compress(RLELossless)
    ds.save_as(path, write_like_original=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "tally-decode-formats"))
    a = ap.parse_args()
    import tifffile
    src = os.path.join(a.dir, "png")
    os.makedirs(a.dir, exist_ok=True)
    if not os.path.exists(os.path.join(src, "manifest.csv")):
        subprocess.run([os.path.join(a.bin, "tally-make-dataset"), "--out", src, "--count", str(a.count), "--size",
                        "512", "--noise", "4"], check=True, capture_output=True)
    rows = [l.strip().split(",") for l in open(os.path.join(src, "manifest.csv")).read().splitlines()[1:]]
    rows = [(os.path.splitext(os.path.basename(image))[0], image, mask) for image, mask in rows]
    images = [np.asarray(Image.open(os.path.join(src, r[1])).convert("RGB")) for r in rows]
    rng = np.random.default_rng(1)
    formats = {
        "png": ("png", lambda p, a: Image.fromarray(a).save(p)),
        "jpeg q90": ("jpg", lambda p, a: Image.fromarray(a).save(p, quality=90)),
        "tiff none": ("tif", lambda p, a: tifffile.imwrite(p, a, photometric="rgb")),
        "tiff lzw": ("tif", lambda p, a: Image.fromarray(a).save(p, compression="tiff_lzw")),
        "tiff deflate": ("tif", lambda p, a: tifffile.imwrite(p, a, photometric="rgb", compression="zlib")),
        "webp lossy q90": ("webp", lambda p, a: Image.fromarray(a).save(p, quality=90)),
        "webp lossless": ("webp", lambda p, a: Image.fromarray(a).save(p, lossless=True)),
        "dicom 12-bit": ("dcm", lambda p, a: dicom(p, grey12(a))),
        "dicom 12-bit rle": ("dcm", lambda p, a: dicom(p, grey12(a), rle=True)),
    }

    def grey12(a):
        return np.clip(a.mean(axis=2) * 16 + rng.integers(0, 16, a.shape[:2]), 0, 4095).astype(np.uint16)

    print(f"| format | bytes per image | images/s per core | MP/s per core |")
    print(f"|---|---|---|---|")
    for name, (ext, write) in formats.items():
        d = os.path.join(a.dir, name.replace(" ", "_"))
        os.makedirs(d, exist_ok=True)
        manifest = os.path.join(d, "manifest.csv")
        lines = ["id,image,mask"]
        size = 0
        for (rid, _, mask), img in zip(rows, images):
            p = os.path.join(d, f"{rid}.{ext}")
            if not os.path.exists(p):
                write(p, img)
            size += os.path.getsize(p)
            lines.append(f"{rid},{p},{os.path.join(src, mask)}")
        with open(manifest, "w") as f:
            f.write("\n".join(lines) + "\n")
        out = subprocess.run([os.path.join(a.bin, "tally-bench-cpu"), "--mode", "decode", "--manifest", manifest,
                              "--threads", str(a.threads), "--seconds", str(a.seconds), "--images_only"],
                             check=True, capture_output=True, text=True).stdout
        rate = float(out.split(",")[1].split()[0]) / a.threads
        print(f"| {name} | {size // len(rows)} | {rate:.0f} | {rate * 512 * 512 / 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    main()
