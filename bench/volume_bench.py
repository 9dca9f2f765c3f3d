#!/usr/bin/env python3
"""3D scoring throughput: Tally's prediction path vs MONAI's way of computing hd95 and nsd.

  python3 bench/volume_bench.py --bin build/bin --work /tmp/vb [--sizes 512x512x300:2,160x192x160:6]
                                [--workers 1,4] [--monai-volumes 1] [--cupy] [--repeats 5]

For each size it writes N reference/prediction pairs of NIfTI-1 volumes (.nii.gz, uint8, 2-5
labels: ellipsoid "organs" with a perturbed prediction, anisotropic spacing) and then measures:
  * Tally, `tally run` on the prediction manifest (end to end: gzip decode, counts, surface
    distances, reports), for counts only (dice,iou) and for all surface metrics, with 1 and N
    workers (each worker uses cores/N threads): volumes/s and voxels/s;
  * MONAI's CPU path, reproduced faithfully (monai.metrics.utils.get_surface_distance with
    distance_transform_edt from scipy over the whole volume, per class and direction; edges by
    binary_erosion XOR, the volume's spacing as sampling), timed per volume for hd95 + nsd only
    (the volume is already in memory: no I/O is charged to it);
  * with --cupy, the same with cupyx.scipy.ndimage.distance_transform_edt on the GPU (MONAI's cuCIM
    path), edges on the GPU too;
and checks that every hd95 and nsd equals Tally's (relative 1e-9). Every Tally figure is the
median of --repeats runs, with their minimum and maximum (s/volume); --monai-volumes 0 skips
MONAI's paths. Prints a Markdown table and
writes results.json in --work. Needs numpy and scipy (and cupy for --cupy); no nibabel: the volumes
are plain NIfTI-1 written and read here.
"""
import argparse
import csv
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
from scipy import ndimage

SPACING_XYZ = (0.8, 0.8, 2.5)  # pixdim 1..3 (x, y, z)


NIFTI_TYPES = {np.dtype(np.uint8): (2, 8), np.dtype(np.float32): (16, 32)}  # datatype code, bitpix


def write_nifti(path, data_xyz, zooms, dtype=np.uint8):
    """Minimal NIfTI-1 (.nii.gz, uint8 or float32, sform = diag(zooms)), data in x-fastest order."""
    code, bitpix = NIFTI_TYPES[np.dtype(dtype)]
    hdr = bytearray(348)
    struct.pack_into("<i", hdr, 0, 348)
    dims = [3] + list(data_xyz.shape) + [1, 1, 1, 1]
    struct.pack_into("<8h", hdr, 40, *dims)
    struct.pack_into("<h", hdr, 70, code)
    struct.pack_into("<h", hdr, 72, bitpix)
    struct.pack_into("<8f", hdr, 76, 1.0, *zooms, 0, 0, 0, 0)
    struct.pack_into("<f", hdr, 108, 352.0)  # vox_offset
    struct.pack_into("<f", hdr, 112, 1.0)    # scl_slope
    struct.pack_into("<B", hdr, 123, 2)      # xyzt_units: mm
    struct.pack_into("<h", hdr, 254, 1)      # sform_code
    struct.pack_into("<4f", hdr, 280, zooms[0], 0, 0, 0)
    struct.pack_into("<4f", hdr, 296, 0, zooms[1], 0, 0)
    struct.pack_into("<4f", hdr, 312, 0, 0, zooms[2], 0)
    hdr[344:348] = b"n+1\0"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(bytes(hdr) + b"\0\0\0\0")
        f.write(np.asfortranarray(data_xyz.astype(dtype, copy=False)).tobytes(order="F"))


def organs(rng, shape, labels):
    """Label volume (x, y, z) with one ellipsoid per label, the larger ones first."""
    v = np.zeros(shape, np.uint8)
    x, y, z = (np.arange(s, dtype=np.float32) for s in shape)
    for c in range(1, labels):
        centre = [rng.uniform(0.3, 0.7) * s for s in shape]
        radii = [rng.uniform(0.06, 0.22) * s for s in shape]
        d = ((x[:, None, None] - centre[0]) / radii[0]) ** 2 + ((y[None, :, None] - centre[1]) / radii[1]) ** 2 + \
            ((z[None, None, :] - centre[2]) / radii[2]) ** 2
        v[d <= 1] = c
    return v


PREDICTION_KINDS = ("smooth", "speckled", "fragmented", "empty-class", "filling")


def predicted(rng, ref, kind="smooth", speckle=0.002):
    """A prediction of `ref` as models make them. smooth: per label shifted by a
    voxel or two, eroded or dilated; speckled: smooth plus `speckle` of all voxels (isolated)
    mislabelled at random, as a weak model or a thresholded probability map gives; fragmented:
    smooth plus 400 small components (1-3 voxels a side) of random labels; empty-class: smooth
    without its last label (absent on one side); filling: the last label fills the volume wherever
    the smooth prediction has background."""
    out = np.zeros_like(ref)
    labels = int(ref.max())
    for c in range(1, labels + 1):
        m = ref == c
        m = np.roll(m, int(rng.integers(-2, 3)), axis=int(rng.integers(0, 3)))
        op = rng.integers(0, 3)
        if op == 1:
            m = ndimage.binary_dilation(m)
        elif op == 2:
            m = ndimage.binary_erosion(m)
        out[m] = c
    if kind == "speckled":
        flat = out.reshape(-1)
        idx = rng.choice(flat.size, int(speckle * flat.size), replace=False)
        flat[idx] = rng.integers(0, labels + 1, idx.size).astype(out.dtype)
    elif kind == "fragmented":
        for _ in range(400):
            size = [int(rng.integers(1, 4)) for _ in range(3)]
            at = [int(rng.integers(0, s - k)) for s, k in zip(out.shape, size)]
            out[at[0]:at[0] + size[0], at[1]:at[1] + size[1], at[2]:at[2] + size[2]] = rng.integers(1, labels + 1)
    elif kind == "empty-class":
        out[out == labels] = 0
    elif kind == "filling":
        out[out == 0] = labels
    elif kind != "smooth":
        raise ValueError(f"prediction kind {kind!r}: expected one of {', '.join(PREDICTION_KINDS)}")
    return out


CROSS = ndimage.generate_binary_structure(3, 1)


def monai_hd95_nsd(pred, ref, labels, spacing, tolerance, xp=np, edt=ndimage.distance_transform_edt,
                   erode=ndimage.binary_erosion):
    """MONAI's get_mask_edges + get_surface_distance (whole volume, per class and direction)."""
    out = []
    for c in range(labels):
        p, r = pred == c, ref == c
        if not p.any() and not r.any():
            out.append((float("nan"), float("nan")))
            continue
        if not p.any() or not r.any():
            out.append((float("inf"), 0.0))
            continue
        cross = xp.asarray(CROSS)
        ep = p ^ erode(p, structure=cross, border_value=0)
        er = r ^ erode(r, structure=cross, border_value=0)
        d_pg = edt(~er, sampling=spacing)[ep]
        d_gp = edt(~ep, sampling=spacing)[er]
        hd95 = max(float(xp.percentile(d_pg, 95)), float(xp.percentile(d_gp, 95)))
        nsd = float((xp.sum(d_pg <= tolerance) + xp.sum(d_gp <= tolerance)) / (d_pg.size + d_gp.size))
        out.append((hd95, nsd))
    return out


def worker_peak(cmd):
    """Runs `cmd` (a tally run) and returns the largest VmHWM of its tally-worker processes."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "tally-worker":
                        continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
        time.sleep(0.05)
    assert proc.returncode == 0, cmd
    return peak


def same(a, b):
    if np.isnan(a) or np.isnan(b):
        return np.isnan(a) and np.isnan(b)
    if np.isinf(a) or np.isinf(b):
        return a == b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default="/tmp/tally-volume-bench")
    ap.add_argument("--sizes", default="512x512x300:2,160x192x160:6")
    ap.add_argument("--prediction", default="smooth", choices=PREDICTION_KINDS,
                    help="what the predictions look like (speckled, fragmented, ...)")
    ap.add_argument("--speckle", type=float, default=0.002, help="--prediction speckled: the share of voxels")
    ap.add_argument("--workers", default=f"1,{min(4, os.cpu_count())}")
    ap.add_argument("--monai-volumes", type=int, default=1)
    ap.add_argument("--cupy", action="store_true")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each Tally configuration (min/median/max)")
    ap.add_argument("--memory-check", default="",
                    help="XxYxZ: first score one pair of this size with 1 worker x 1 thread, report peak RSS")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.memory_check:
        shape = tuple(int(s) for s in args.memory_check.split("x"))
        d = os.path.join(args.work, "memory")
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(1)
        ref = organs(rng, shape, 5)
        write_nifti(os.path.join(d, "ref.nii.gz"), ref, SPACING_XYZ)
        write_nifti(os.path.join(d, "pred.nii.gz"), predicted(rng, ref, args.prediction, args.speckle), SPACING_XYZ)
        del ref
        with open(os.path.join(d, "m.csv"), "w") as f:
            f.write("mask,prediction\nref.nii.gz,pred.nii.gz\n")
        # A tiny pair first: the processes' own footprint (the worker links LibTorch).
        tiny = organs(rng, (8, 8, 8), 2)
        write_nifti(os.path.join(d, "tiny.nii.gz"), tiny, SPACING_XYZ)
        with open(os.path.join(d, "tiny.csv"), "w") as f:
            f.write("mask,prediction\ntiny.nii.gz,tiny.nii.gz\n")
        base = worker_peak([os.path.join(args.bin, "tally"), "run", "--manifest", os.path.join(d, "tiny.csv"),
                            "--out", os.path.join(d, "tiny-out"), "--metrics", "all", "--worker-threads", "1"])
        t = time.time()
        peak = worker_peak([os.path.join(args.bin, "tally"), "run", "--manifest", os.path.join(d, "m.csv"), "--out",
                            os.path.join(d, "out"), "--metrics", "all", "--worker-threads", "1"])
        pair = 2 * int(np.prod(shape))  # uint8 on disk (uncompressed)
        print(f"memory: {args.memory_check} uint8 pair = {pair / 2**20:.0f} MiB; the worker's peak RSS "
              f"= {peak / 2**20:.0f} MiB, {base / 2**20:.0f} MiB with a tiny volume "
              f"(+{(peak - base) / pair:.1f}x the pair); {time.time() - t:.1f} s, all metrics")
    cores = os.cpu_count()
    results = []
    rows_md = ["| volume (x,y,z) | labels | volumes | metrics | workers x threads | volumes/s | Mvoxels/s | "
               "s/volume median (min-max) | command wall s median |", "|---|---|---|---|---|---|---|---|---|"]

    def tally_runs(cmd, out, count):
        """--repeats runs of `cmd`: (job walls, command walls, steady seconds per volume, the last
        report); steady: one worker's, after its first result (start-up excluded)."""
        jobs, walls, steady = [], [], []
        for _ in range(args.repeats):
            t = time.time()
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            walls.append(time.time() - t)
            with open(os.path.join(out, "report.json")) as f:
                report = json.load(f)
            assert report["images_evaluated"] == count, report
            jobs.append(report["wall_seconds"])  # Submitted -> last result, without starting the processes.
            if len(report["workers"]) == 1 and report["workers"][0]["images_per_second"] > 0:
                steady.append(1.0 / report["workers"][0]["images_per_second"])
        return jobs, walls, steady, report

    compare_md = ["| volume (x,y,z) | path | s/volume (hd95+nsd) | Tally is faster by | values equal to Tally's |",
                  "|---|---|---|---|---|"]
    for spec in args.sizes.split(","):
        dims, count = spec.split(":")
        shape = tuple(int(s) for s in dims.split("x"))
        count = int(count)
        d = os.path.join(args.work, dims)
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(len(shape) + shape[0])
        manifest = os.path.join(d, "manifest.csv")
        cases = []
        t0 = time.time()
        for i in range(count):
            labels = 2 + i % 4
            ref = organs(rng, shape, labels)
            pred = predicted(rng, ref, args.prediction, args.speckle)
            rp, pp = os.path.join(d, f"ref{i}.nii.gz"), os.path.join(d, f"pred{i}.nii.gz")
            if not os.path.exists(pp):
                write_nifti(rp, ref, SPACING_XYZ)
                write_nifti(pp, pred, SPACING_XYZ)
            cases.append((ref, pred, labels))
        with open(manifest, "w") as f:
            f.write("id,mask,prediction\n")
            for i in range(count):
                f.write(f"case{i},ref{i}.nii.gz,pred{i}.nii.gz\n")
        print(f"{dims}: {count} pairs ready in {time.time() - t0:.1f} s", file=sys.stderr)
        voxels = int(np.prod(shape))
        tally_per_volume = None
        tally_values = None
        for metrics in ("dice,iou", "dice,iou,hd95,nsd"):
            for w in (int(x) for x in args.workers.split(",")):
                threads = max(1, cores // w)
                out = os.path.join(d, f"out-{metrics.count(',')}-{w}")
                cmd = [os.path.join(args.bin, "tally"), "run", "--manifest", manifest, "--out", out, "--metrics",
                       metrics, "--workers", str(w), "--worker-threads", str(threads), "--num-classes", "5"]
                jobs, walls, _, report = tally_runs(cmd, out, count)
                job, wall = statistics.median(jobs), statistics.median(walls)
                r = {"shape_xyz": shape, "volumes": count, "metrics": metrics, "workers": w, "threads": threads,
                     "command_wall_s": walls, "job_wall_s": jobs, "volumes_per_s": count / job,
                     "mvoxels_per_s": count * voxels / job / 1e6}
                results.append(r)
                rows_md.append(f"| {dims} | 2-5 | {count} | {metrics} | {w} x {threads} | {count / job:.2f} | "
                               f"{count * voxels / job / 1e6:.0f} | {job / count:.3f} ({min(jobs) / count:.3f}-"
                               f"{max(jobs) / count:.3f}) | {wall:.1f} |")
                print(rows_md[-1], file=sys.stderr, flush=True)
                if metrics.endswith("nsd") and w == 1:
                    # One worker, all cores: per-volume time (I/O included) vs MONAI's per volume.
                    tally_per_volume = job / count
                    with open(os.path.join(out, "per_image.csv")) as f:
                        tally_values = list(csv.DictReader(f))
        # One thread, one volume at a time: like for like with MONAI's single-threaded path.
        out = os.path.join(d, "out-single")
        jobs, _, steady, _ = tally_runs([os.path.join(args.bin, "tally"), "run", "--manifest", manifest, "--out", out,
                                 "--metrics", "dice,iou,hd95,nsd", "--workers", "1", "--worker-threads", "1",
                                 "--num-classes", "5"], out, count)
        tally_single = statistics.median(jobs) / count
        single_range = f"{tally_single:.3f} ({min(jobs) / count:.3f}-{max(jobs) / count:.3f})"
        single_steady = (f"{statistics.median(steady):.3f} ({min(steady):.3f}-{max(steady):.3f})" if steady else "")
        # MONAI's path on the first volumes, in memory.
        # numpy arrays are (x, y, z) here, as nibabel gives them; the header holds float32 pixdims.
        spacing = tuple(float(np.float32(z)) for z in SPACING_XYZ)
        paths = [("scipy (MONAI CPU)", np, ndimage.distance_transform_edt, ndimage.binary_erosion)]
        if args.cupy:
            import cupy as cp
            from cupyx.scipy import ndimage as cnd
            paths.append(("cupyx (MONAI cuCIM/GPU)", cp, cnd.distance_transform_edt, cnd.binary_erosion))
        if args.monai_volumes == 0:
            paths = []
        for name, xp, edt, erode in paths:
            total, equal = 0.0, True
            for i in range(min(args.monai_volumes, count)):
                ref, pred, labels = cases[i]
                rx, px = xp.asarray(ref), xp.asarray(pred)
                if xp is not np:
                    xp.cuda.Device().synchronize()
                t = time.time()
                vals = monai_hd95_nsd(px, rx, 5, spacing, 1.0, xp, edt, erode)
                if xp is not np:
                    xp.cuda.Device().synchronize()
                total += time.time() - t
                got = [r for r in tally_values if r["id"] == f"case{i}"]
                for c, (hd95, nsd) in enumerate(vals):
                    equal &= same(float(got[c]["hd95"]), hd95) and same(float(got[c]["nsd"]), nsd)
            per = total / max(1, min(args.monai_volumes, count))
            results.append({"shape_xyz": shape, "path": name, "s_per_volume": per, "equal": bool(equal),
                            "tally_s_per_volume": tally_per_volume, "tally_single_thread_s_per_volume": tally_single})
            compare_md.append(f"| {dims} | {name} | {per:.3f} | {per / tally_single:.1f}x (1 thread), "
                              f"{per / tally_per_volume:.1f}x ({cores} threads) | {equal} |")
            print(compare_md[-1], file=sys.stderr, flush=True)
        compare_md.append(f"| {dims} | Tally, 1 thread, end to end (gzip read included) | {single_range} | | |")
        compare_md.append(f"| {dims} | Tally, 1 thread, steady (after the first volume: start-up excluded) | "
                          f"{single_steady} | | |")
        compare_md.append(f"| {dims} | Tally, {cores} threads, end to end | {tally_per_volume:.3f} | | |")
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n".join(rows_md))
    print()
    print("\n".join(compare_md))


if __name__ == "__main__":
    main()
