"""Lesion-wise metrics (docs/metrics.md "Lesion-wise metrics") through real Tally processes on prediction
manifests, against a re-implementation here of the BraTS 2023 rules (and of IoU matching) with
scipy.ndimage.label / binary_dilation and the scipy surface-distance reference of tallytest: a
hundred random 2D and 3D cases (lesions split, merged, shifted, missed, false ones, small ones),
identical for any number of workers.
"""
import csv
import math
import os
import unittest

import nibabel as nib
import numpy as np
from PIL import Image
from scipy import ndimage

import tallytest as tt

RANK = {4: 1, 8: 2, 6: 1, 18: 2, 26: 3}
LESION_METRICS = ["lesion_dice", "lesion_hd95", "lesion_sensitivity", "lesion_precision", "lesion_f1",
                  "lesion_tp", "lesion_fp", "lesion_fn"]


def lesions_reference(pred, ref, spacing, connectivity=0, dilation=3, min_volume=50.0, max_hd95=374.0, iou=0.0):
    """One class: (summary dict, records) as metrics/lesion.h defines them. Arrays in Tally's axis
    order ((z,) y, x) so that scipy numbers components as Tally does; spacing in the same order."""
    nd = pred.ndim
    conn = connectivity or (26 if nd == 3 else 8)
    st = ndimage.generate_binary_structure(nd, RANK[conn])
    dil = ndimage.generate_binary_structure(nd, 2)
    pl, npred = ndimage.label(pred, st)
    if iou > 0 or dilation == 0:
        rl, nref = ndimage.label(ref, st)
    else:
        grown = ndimage.binary_dilation(ref, dil, iterations=dilation) if ref.any() else ref
        dl, nref = ndimage.label(grown, st)
        rl = np.where(ref, dl, 0)
    sx, sy = spacing[-1], spacing[-2]

    def volume(v):
        out = v * sx * sy
        return out * spacing[0] if nd == 3 else out

    mine = {}
    if iou > 0:
        pairs = []
        for r in range(1, nref + 1):
            g = rl == r
            for p in np.unique(pl[g]):
                if p == 0:
                    continue
                both = np.sum(g & (pl == p))
                value = both / (np.sum(g) + np.sum(pl == p) - both)
                if value >= iou:
                    pairs.append((-value, r, int(p)))
        taken_r, taken_p = set(), set()
        for _, r, p in sorted(pairs):
            if r in taken_r or p in taken_p:
                continue
            taken_r.add(r)
            taken_p.add(p)
            mine[r] = [p]
    else:
        for r in range(1, nref + 1):
            grown = ndimage.binary_dilation(rl == r, dil, iterations=dilation) if dilation else rl == r
            mine[r] = sorted(int(p) for p in np.unique(pl[grown]) if p != 0)
    s = {"lesions": 0, "tp": 0, "fn": 0, "fp": 0, "dice_sum": 0.0, "hd95_sum": 0.0}
    records, used = [], set()
    for r in range(1, nref + 1):
        g = rl == r
        comps = mine.get(r, [])
        used.update(comps)
        p = np.isin(pl, comps) if comps else np.zeros_like(g)
        dice = 2.0 * np.sum(p & g) / (np.sum(p) + np.sum(g))
        hd95 = tt.surface_metrics(p, g, spacing)["hd95"] if comps else math.inf
        vol = volume(int(np.sum(g)))
        counted = vol > min_volume
        kind = "small" if not counted else ("tp" if comps else "fn")
        if counted:
            s["lesions"] += 1
            s["tp" if comps else "fn"] += 1
            s["dice_sum"] += dice
            s["hd95_sum"] += max_hd95 if math.isinf(hd95) else hd95
        records.append({"kind": kind, "lesion": r, "component": 0, "voxels": int(np.sum(g)), "volume": vol,
                        "matched": len(comps), "matched_voxels": int(np.sum(p)), "dice": dice, "hd95": hd95})
    for c in range(1, npred + 1):
        if c in used:
            continue
        s["fp"] += 1
        v = int(np.sum(pl == c))
        records.append({"kind": "fp", "lesion": 0, "component": c, "voxels": v, "volume": volume(v), "matched": 0,
                        "matched_voxels": 0, "dice": 0.0, "hd95": max_hd95})
    n = s["lesions"] + s["fp"]
    tp, fn, fp = s["tp"], s["fn"], s["fp"]
    nan = float("nan")
    values = {
        "lesion_dice": s["dice_sum"] / n if n else 1.0,
        "lesion_hd95": (s["hd95_sum"] + max_hd95 * fp) / n if n else 0.0,
        "lesion_sensitivity": tp / (tp + fn) if tp + fn else nan,
        "lesion_precision": tp / (tp + fp) if tp + fp else nan,
        "lesion_f1": 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else nan,
        "lesion_tp": tp, "lesion_fp": fp, "lesion_fn": fn,
    }
    return values, records, s


def blobs(rng, shape, labels, count):
    """Balls (or discs) of random labels and radii, some tiny, some touching."""
    m = np.zeros(shape, np.uint8)
    grid = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    for _ in range(count):
        centre = [rng.uniform(0, s) for s in shape]
        radius = rng.choice([0.8, 1.5, 2.5, 3.5, 5.0])
        d2 = sum((g - c) ** 2 for g, c in zip(grid, centre))
        m[d2 <= radius * radius] = int(rng.integers(1, labels))
    return m


def perturb(rng, ref, labels):
    """Shifted, split by a cut, merged by a bridge, thinned, with false blobs or nothing."""
    out = ref.copy()
    for mode in rng.choice(6, size=2, replace=False):
        if mode == 0:
            out = np.roll(out, int(rng.integers(-2, 3)), axis=int(rng.integers(0, ref.ndim)))
        elif mode == 1:  # A cut through the middle splits lesions.
            axis = int(rng.integers(0, ref.ndim))
            idx = [slice(None)] * ref.ndim
            idx[axis] = int(ref.shape[axis] // 2)
            out[tuple(idx)] = 0
        elif mode == 2:  # A bridge merges neighbours.
            idx = [int(rng.integers(0, s)) for s in ref.shape]
            idx[-1] = slice(None)
            out[tuple(idx)] = int(rng.integers(1, labels))
        elif mode == 3:
            out = out * (ndimage.binary_erosion(out > 0))
        elif mode == 4:
            extra = blobs(rng, ref.shape, labels, 2)
            out = np.where(extra > 0, extra, out)
        elif mode == 5 and rng.random() < 0.3:
            out[:] = 0
    return out.astype(np.uint8)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class LesionWiseTest(unittest.TestCase):
    CLASSES = 3

    def make_cases(self, root, rng):
        """60 volumes and 40 images; returns the manifest and, per row, (pred, ref, spacing) in Tally's axes."""
        os.makedirs(os.path.join(root, "v"))
        rows, cases = [], []
        for i in range(100):
            three_d = i < 60
            shape = tuple(int(s) for s in rng.integers(8, 20, 3)) if three_d else tuple(int(s) for s in rng.integers(16, 40, 2))
            ref = blobs(rng, shape, self.CLASSES, int(rng.integers(0, 7)))
            pred = perturb(rng, ref, self.CLASSES)
            if three_d:
                spacing = (1.0, 1.0, 1.0) if i % 2 else tuple(float(z) for z in rng.choice([0.7, 1.0, 2.0], 3))
                paths = []
                for name, a in (("r", ref), ("p", pred)):
                    path = os.path.join(root, "v", f"{name}{i:03d}.nii.gz")
                    zooms = spacing[::-1]  # nibabel: x, y, z
                    img = nib.Nifti1Image(a.transpose(2, 1, 0).copy(), np.diag(list(zooms) + [1.0]))
                    img.header.set_zooms(zooms)
                    nib.save(img, path)
                    paths.append(path)
                # The header keeps float32 spacings, as BraTS's nibabel reads them back.
                spacing = tuple(float(z) for z in nib.load(paths[0]).header.get_zooms()[:3])[::-1]
            else:
                spacing = (1.0, 1.0)
                paths = []
                for name, a in (("r", ref), ("p", pred)):
                    path = os.path.join(root, "v", f"{name}{i:03d}.png")
                    Image.fromarray(a).save(path)
                    paths.append(path)
            rows.append([f"case{i:03d}", paths[0], paths[1]])
            cases.append((pred, ref, spacing))
        manifest = os.path.join(root, "m.csv")
        with open(manifest, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "mask", "prediction"])
            w.writerows(rows)
        return manifest, cases

    def check(self, out, cases, **options):
        per_image = read_csv(os.path.join(out, "per_image.csv"))
        lesions = read_csv(os.path.join(out, "lesions.csv"))
        by_key = {}
        for l in lesions:
            by_key.setdefault((int(l["index"]), int(l["class"])), []).append(l)
        pooled = {c: {"tp": 0, "fn": 0, "fp": 0, "dice": 0.0, "hd95": 0.0} for c in range(1, self.CLASSES)}
        for row in per_image:
            i, c = int(row["index"]), int(row["class"])
            if c == 0:
                self.assertTrue(all(math.isnan(tt.num(row[m])) for m in LESION_METRICS), row)
                continue
            pred, ref, spacing = cases[i]
            want, records, s = lesions_reference(pred == c, ref == c, spacing, **options)
            for m in LESION_METRICS:
                self.assertTrue(tt.same(tt.num(row[m]), want[m]), f"row {i} class {c} {m}: {row[m]} != {want[m]}")
            got = by_key.get((i, c), [])
            self.assertEqual([(g["kind"], int(g["lesion"]), int(g["component"]), int(g["voxels"]), int(g["matched"]),
                               int(g["matched_voxels"])) for g in got],
                             [(r["kind"], r["lesion"], r["component"], r["voxels"], r["matched"], r["matched_voxels"])
                              for r in records], f"row {i} class {c}")
            for g, r in zip(got, records):
                for f in ("volume", "dice", "hd95"):
                    self.assertTrue(tt.same(tt.num(g[f]), r[f]), f"row {i} class {c} lesion {r}: {f} {g[f]}")
            p = pooled[c]
            p["tp"], p["fn"], p["fp"] = p["tp"] + s["tp"], p["fn"] + s["fn"], p["fp"] + s["fp"]
            p["dice"] += s["dice_sum"]
            p["hd95"] += s["hd95_sum"] + options.get("max_hd95", 374.0) * s["fp"]
        report = tt.read_report(out)
        for cls in report["classes"]:
            c = cls["class"]
            if c == 0:
                continue
            p = pooled[c]
            n = p["tp"] + p["fn"] + p["fp"]
            self.assertEqual(cls["lesion_tp_global"], p["tp"])
            self.assertEqual(cls["lesion_fp_global"], p["fp"])
            self.assertTrue(tt.same(cls["lesion_dice_global"], p["dice"] / n if n else 1.0, rel=1e-12))
            self.assertTrue(tt.same(cls["lesion_hd95_global"], p["hd95"] / n if n else 0.0, rel=1e-12))
        return per_image, lesions

    def test_hundred_random_cases_match_scipy_for_any_worker_count(self):
        rng = np.random.default_rng(31)
        root = tt.tmpdir(self)
        manifest, cases = self.make_cases(root, rng)
        outs = []
        for name, extra in (("one", ["--workers", "1"]), ("three", ["--workers", "3", "--shard-size", "3"])):
            out = os.path.join(root, name)
            tt.tally("run", "--manifest", manifest, "--out", out, "--metrics", "lesion", "--num-classes",
                     str(self.CLASSES), *extra)
            outs.append(out)
        per_image, lesions = self.check(outs[0], cases)
        self.assertGreater(sum(l["kind"] == "fp" for l in lesions), 20)
        self.assertGreater(sum(l["kind"] == "small" for l in lesions), 20)
        self.assertGreater(sum(int(l["matched"]) > 1 for l in lesions), 3)  # Split lesions.
        for name in ("per_image.csv", "lesions.csv"):
            self.assertTrue(tt.same_files(outs[0], outs[1], name), name)

    def test_iou_matching_other_connectivity_dilation_and_thresholds(self):
        rng = np.random.default_rng(77)
        root = tt.tmpdir(self)
        manifest, cases = self.make_cases(root, rng)
        for flags, options in (
                (["--lesion-iou", "0.3", "--lesion-min-volume", "0"], {"iou": 0.3, "min_volume": 0.0}),
                (["--connectivity", "6", "--lesion-dilation", "1", "--lesion-min-volume", "2", "--lesion-max-hd95", "100"],
                 {"connectivity": 6, "dilation": 1, "min_volume": 2.0, "max_hd95": 100.0})):
            # 2D rows cannot have 6-connectivity: that run keeps the volumes only.
            m = manifest
            if "connectivity" in options:
                with open(manifest) as f:
                    lines = f.read().splitlines()
                m = os.path.join(root, "m3.csv")
                with open(m, "w") as f:
                    f.write("\n".join(lines[:61]) + "\n")
            out = os.path.join(root, "o" + str(len(flags)))
            tt.tally("run", "--manifest", m, "--out", out, "--metrics", "lesion", "--num-classes", str(self.CLASSES),
                     "--workers", "2", "--shard-size", "5", *flags)
            self.check(out, cases, **options)

    def test_model_jobs_score_lesions_as_their_saved_predictions(self):
        """The 2D model path (labels from the forward pass) gives what the same labels score as files."""
        rng = np.random.default_rng(12)
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(root, rng, 16, [(20, 24), (17, 31)], classes=3)
        model = tt.fixture("three_class.pt")
        flags = ["--metrics", "lesion,hd95", "--lesion-min-volume", "3"]
        out_model = os.path.join(root, "om")
        tt.tally_run(model, manifest, out_model, "--workers", "2", "--shard-size", "4", "--batch-size", "4", *flags)
        pm, k = tt.write_prediction_manifest(model, manifest, root)
        out_pred = os.path.join(root, "op")
        tt.tally("run", "--manifest", pm, "--out", out_pred, "--num-classes", str(k), *flags)
        lesions = read_csv(os.path.join(out_model, "lesions.csv"))
        self.assertGreater(len(lesions), 10)
        self.assertTrue(tt.same_scores(out_model, out_pred))  # Each reads other files: digests aside.
        self.assertTrue(tt.same_files(out_model, out_pred, "lesions.csv"))

    def test_six_connectivity_fails_2d_rows_with_the_reason(self):
        root = tt.tmpdir(self)
        a = np.zeros((8, 8), np.uint8)
        a[2:5, 2:5] = 1
        for name in ("r.png", "p.png"):
            Image.fromarray(a).save(os.path.join(root, name))
        with open(os.path.join(root, "m.csv"), "w") as f:
            f.write("mask,prediction\nr.png,p.png\n")
        out = os.path.join(root, "o")
        p = tt.tally("run", "--manifest", os.path.join(root, "m.csv"), "--out", out, "--metrics", "lesion",
                     "--connectivity", "6", check=False)
        self.assertNotEqual(p.returncode, 0)
        report = tt.read_report(out)
        self.assertIn("connectivity 6", report["failures"][0]["reason"])
        bad = tt.tally("run", "--manifest", os.path.join(root, "m.csv"), "--out", out, "--metrics", "lesion",
                       "--connectivity", "5", check=False)
        self.assertIn("--connectivity: expected 4 or 8 (2D), 6, 18 or 26 (3D), got 5", bad.stderr)


if __name__ == "__main__":
    unittest.main()
