#!/usr/bin/env python3
"""Volumes into a 3D model: Tally's volume job against the plain PyTorch loop a researcher
writes for the same evaluation.

  python3 bench/volume_model_bench.py --bin build-gpu/bin --work /tmp/vmb [--volumes 8]
      [--size 240x240x155] [--channels 4] [--roi 128,128,128] [--overlap 0.5] [--sw-batch 4]

Writes N multi-channel image volumes (float32 .nii.gz, BraTS-like 240x240x155, 4 channels) with
their 4-label references and a scripted 3D CNN (4 conv layers, random weights), then measures:
  * the loop: per volume, read every channel (gzip + NIfTI), z-score it, sliding windows on the GPU
    as MONAI's sliding_window_inference (Gaussian blending, the windows batched), argmax, back to the
    host, Dice per class and hd95 + nsd with scipy's distance_transform_edt over the whole volume
    (MONAI's CPU path), one volume after the other;
  * Tally: `tally run --gpus 0 --sliding-window ... --intensity zscore --metrics dice,hd95,nsd`, end to
    end (start-up, model load and reports included), and its steady rate from report.json;
and checks that the labels agree (Tally's --save-predictions against the loop's argmax, voxels whose
two best scores are within 1e-3 aside) and that Dice agrees to 1e-9 where the labels are equal.
Prints a Markdown table; writes results.json in --work. Needs numpy, scipy and torch (CUDA).
"""
import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from volume_bench import monai_hd95_nsd, organs, write_nifti  # noqa: E402

SPACING = (1.0, 1.0, 1.0)


def read_nifti(path):
    """(z, y, x) array of a NIfTI-1 .nii.gz written above (uint8 or float32)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = struct.unpack_from("<8h", raw, 40)
    dtype = {2: np.uint8, 16: np.float32, 512: np.uint16}[struct.unpack_from("<h", raw, 70)[0]]
    offset = int(struct.unpack_from("<f", raw, 108)[0])
    x, y, z = dims[1:4]
    return np.frombuffer(raw, dtype, count=x * y * z, offset=offset).reshape(z, y, x)


class Net(torch.nn.Module):
    def __init__(self, cin, classes):
        super().__init__()
        self.a = torch.nn.Conv3d(cin, 16, 3, padding=1)
        self.b = torch.nn.Conv3d(16, 32, 3, padding=1)
        self.c = torch.nn.Conv3d(32, 16, 3, padding=1)
        self.d = torch.nn.Conv3d(16, classes, 1)

    def forward(self, x):
        return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))


def starts(size, roi, overlap):
    interval = roi if roi == size else max(int(roi * (1 - overlap)), 1)
    out, i = [], 0
    while True:
        s = i * interval
        out.append(min(s, size - roi))
        if s + roi >= size:
            return out
        i += 1


def gaussian(roi, device):
    m = None
    for n in roi:
        x = torch.arange(-(n - 1) / 2.0, (n - 1) / 2.0 + 1, dtype=torch.float)
        x = torch.exp(x ** 2 / (-2 * (n * 0.125) ** 2))
        m = x if m is None else m.unsqueeze(-1) * x
    return torch.clamp(m, min=max(m.min().item(), 1e-3)).to(device)


def sliding_window(net, image, roi, overlap, sw_batch, device):
    """MONAI's algorithm on a 1 x C x D x H x W tensor already on the device."""
    size = image.shape[2:]
    pads = [max(r - s, 0) for r, s in zip(roi, size)]
    x = torch.nn.functional.pad(image, [p for d in (2, 1, 0) for p in (pads[d] // 2, pads[d] - pads[d] // 2)])
    padded = x.shape[2:]
    w = gaussian(roi, device)
    windows = [(a, b, c) for a in starts(padded[0], roi[0], overlap) for b in starts(padded[1], roi[1], overlap)
               for c in starts(padded[2], roi[2], overlap)]
    total, weight = None, torch.zeros(padded, device=device)
    for k in range(0, len(windows), sw_batch):
        group = windows[k:k + sw_batch]
        out = net(torch.cat([x[:, :, a:a + roi[0], b:b + roi[1], c:c + roi[2]] for a, b, c in group]))
        if total is None:
            total = torch.zeros((out.shape[1],) + tuple(padded), device=device)
        for j, (a, b, c) in enumerate(group):
            total[:, a:a + roi[0], b:b + roi[1], c:c + roi[2]] += w * out[j]
            weight[a:a + roi[0], b:b + roi[1], c:c + roi[2]] += w
    scores = total / weight
    b = [p // 2 for p in pads]
    return scores[:, b[0]:b[0] + size[0], b[1]:b[1] + size[1], b[2]:b[2] + size[2]]


def zscore(a):
    a64 = a.astype(np.float64)
    sd = a64.std()
    return ((a64 - a64.mean()) / (sd if sd else 1.0)).astype(np.float32)


def make_data(work, rng, n, shape_xyz, channels, classes):
    rows = ["id,image,mask"]
    for i in range(n):
        ref = organs(rng, shape_xyz, classes)
        files = []
        for c in range(channels):
            img = ref.astype(np.float32) * (20 + 10 * c) + rng.normal(100, 25, shape_xyz).astype(np.float32)
            files.append(os.path.join(work, f"v{i:03d}_c{c}.nii.gz"))
            write_nifti(files[-1], img, SPACING, np.float32)
        mask = os.path.join(work, f"v{i:03d}_seg.nii.gz")
        write_nifti(mask, ref, SPACING)
        rows.append(f"v{i:03d},{';'.join(files)},{mask}")
    with open(os.path.join(work, "m.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")


def loop(model_path, work, n, roi, overlap, sw_batch, classes, device):
    net = torch.jit.load(model_path, map_location=device).eval()
    with open(os.path.join(work, "m.csv")) as f:
        rows = [line.strip().split(",") for line in f.readlines()[1:]]
    results, times = {}, []
    t_all = time.perf_counter()
    for rid, image, mask in rows:
        t0 = time.perf_counter()
        chans = [zscore(read_nifti(p)) for p in image.split(";")]
        x = torch.from_numpy(np.stack(chans))[None].to(device)
        with torch.inference_mode():
            scores = sliding_window(net, x, roi, overlap, sw_batch, device)
            labels = scores.argmax(0).to(torch.uint8).cpu().numpy()
            top2 = torch.topk(scores, 2, dim=0).values
            margin = (top2[0] - top2[1]).cpu().numpy()
        ref = read_nifti(mask)
        dice = []
        for c in range(classes):
            p, r = labels == c, ref == c
            tp, s = int(np.sum(p & r)), int(p.sum() + r.sum())
            dice.append(2 * tp / s if s else float("nan"))
        surf = monai_hd95_nsd(labels, ref, classes, SPACING[::-1], 1.0)
        times.append(time.perf_counter() - t0)
        results[rid] = {"labels": labels, "margin": margin, "dice": dice, "surface": surf}
    return results, time.perf_counter() - t_all, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--volumes", type=int, default=8)
    ap.add_argument("--size", default="240x240x155")
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--roi", default="128,128,128")
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--sw-batch", type=int, default=4)
    ap.add_argument("--device", default="cuda", help="cuda (Tally: --gpus 0) or cpu (a CPU worker)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rng = np.random.default_rng(31)
    shape = tuple(int(v) for v in args.size.split("x"))
    roi = tuple(int(v) for v in args.roi.split(","))
    t0 = time.perf_counter()
    make_data(args.work, rng, args.volumes, shape, args.channels, args.classes)
    print(f"data: {time.perf_counter() - t0:.1f} s", flush=True)
    torch.manual_seed(0)
    model = os.path.join(args.work, "net.pt")
    torch.jit.script(Net(args.channels, args.classes).eval()).save(model)
    base, base_wall, base_times = loop(model, args.work, args.volumes, roi, args.overlap, args.sw_batch, args.classes,
                                       args.device)
    out, saved = os.path.join(args.work, "tally"), os.path.join(args.work, "saved")
    cmd = [os.path.join(args.bin, "tally"), "run", "--model", model, "--manifest", os.path.join(args.work, "m.csv"),
           "--out", out, *(["--gpus", "0"] if args.device == "cuda" else []), "--sliding-window", args.roi.replace(",", ","), "--overlap", str(args.overlap),
           "--sw-batch-size", str(args.sw_batch), "--intensity", "zscore", "--metrics", "dice,hd95,nsd",
           "--save-predictions", saved, "--shard-size", "1"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    tally_wall = time.perf_counter() - t0
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(1)
    report = json.load(open(os.path.join(out, "report.json")))
    mismatched, decided_total = 0, 0
    for rid, b in base.items():
        got = read_nifti(os.path.join(saved, f"{rid}.nii.gz")).astype(np.int64)
        decided = b["margin"] > 1e-3
        mismatched += int(np.sum(got[decided] != b["labels"][decided]))
        decided_total += int(decided.sum())
    per_image = {}
    with open(os.path.join(out, "per_image.csv")) as f:
        header = f.readline().strip().split(",")
        for line in f:
            r = dict(zip(header, line.strip().split(",")))
            per_image[(r["id"], int(r["class"]))] = r
    dice_diff = max(abs(float(per_image[(rid, c)]["dice"]) - b["dice"][c]) for rid, b in base.items()
                    for c in range(args.classes) if not np.isnan(b["dice"][c]))
    w = report["workers"][0]
    result = {
        "volumes": args.volumes, "size": args.size, "channels": args.channels, "roi": roi,
        "loop_wall_s": base_wall, "loop_volumes_per_s": args.volumes / base_wall,
        "loop_s_per_volume_median": float(np.median(base_times)),
        "tally_wall_s": tally_wall, "tally_volumes_per_s_end_to_end": args.volumes / tally_wall,
        "tally_worker_images_per_second": w.get("images_per_second"), "tally_worker_seconds": w.get("seconds"),
        "label_mismatches_on_decided_voxels": mismatched, "decided_voxels": decided_total,
        "max_dice_difference": dice_diff, "gpu": w.get("gpu_name"),
    }
    json.dump(result, open(os.path.join(args.work, "results.json"), "w"), indent=1)
    print("| run | volumes/s | s/volume |")
    print("|---|---|---|")
    print(f"| plain PyTorch loop (read, z-score, sliding window on GPU, argmax, scipy metrics) | "
          f"{args.volumes / base_wall:.3f} | {np.median(base_times):.2f} (median) |")
    print(f"| tally run, end to end (start-up, model load, reports) | {args.volumes / tally_wall:.3f} | "
          f"{tally_wall / args.volumes:.2f} |")
    print(f"| tally run, worker's steady rate (report.json workers[0]) | {w.get('images_per_second')} | |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
