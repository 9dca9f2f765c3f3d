"""Prediction manifests (no model): 2D PNG and 3D NIfTI label maps scored by real Tally processes,
checked against an independent reference: nibabel reads the volumes, numpy counts, scipy's
distance_transform_edt (with sampling= for anisotropic voxels) computes MONAI's surface distances,
and nnU-Net's compute_metrics / summary logic is re-implemented here from its source.
"""
import csv
import json
import math
import os
import unittest

import nibabel as nib
import numpy as np
from PIL import Image

import tallytest as tt

METRICS = ["dice", "iou", "precision", "recall", "specificity", "accuracy", "hd", "hd95", "assd", "nsd"]


def reference3(pred, ref, k, spacing, tolerance=1.0, ignore=255):
    """Per-class values for one volume pair (nibabel arrays, x/y/z axes)."""
    valid = ref != ignore
    rows = []
    for c in range(k):
        p, r = (pred == c) & valid, (ref == c) & valid
        tp, fp, fn = int(np.sum(p & r)), int(np.sum(p & ~r)), int(np.sum(~p & r))
        tn = int(np.sum(valid)) - tp - fp - fn
        row = {"tp": tp, "fp": fp, "fn": fn, "tn": tn}
        row.update(tt.count_metrics(tp, fp, fn, tn))
        row.update(tt.surface_metrics(p, r, spacing, tolerance))
        rows.append(row)
    return rows


def random_volume(rng, shape, labels):
    """Blobs, thin lines and plates of labels 1..labels-1; some touch the border."""
    v = np.zeros(shape, np.uint8)
    xx, yy, zz = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    for _ in range(rng.integers(0, 5)):
        c = int(rng.integers(1, labels))
        kind = rng.integers(0, 3)
        cx, cy, cz = (rng.uniform(-2, s + 1) for s in shape)
        if kind == 0:
            r = rng.uniform(1, max(2, min(shape) / 2.5))
            v[(xx - cx) ** 2 + (yy - cy) ** 2 + (zz - cz) ** 2 <= r * r] = c
        elif kind == 1:
            v[(np.abs(yy - cy) < 0.6) & (np.abs(zz - cz) < 0.6)] = c  # A one-voxel line along x.
        else:
            v[(np.abs(zz - cz) < 0.6) & (np.abs(xx - cx) < 4) & (np.abs(yy - cy) < 5)] = c
    return v


def perturb(rng, ref, labels):
    mode = rng.integers(0, 5)
    if mode == 0:
        return ref.copy()
    if mode == 1:
        return np.roll(ref, int(rng.integers(-3, 4)), axis=int(rng.integers(0, 3)))
    if mode == 2:
        return np.zeros_like(ref)  # Empty prediction.
    if mode == 3:
        out = ref.copy()
        flip = rng.random(ref.shape) < 0.05
        out[flip] = rng.integers(0, labels, int(flip.sum()))
        return out
    return random_volume(rng, ref.shape, labels)


DTYPES = [np.uint8, np.int16, np.int32, np.uint16, np.int64, np.float32]


def save(path, data, zooms, dtype, nifti2=False, affine=None):
    if affine is None:
        affine = np.diag(list(zooms) + [1.0])
        affine[:3, 3] = [-10.0, 5.0, 2.5]
    cls = nib.Nifti2Image if nifti2 else nib.Nifti1Image
    img = cls(data.astype(dtype), affine, dtype=dtype)
    img.header.set_zooms(zooms)
    nib.save(img, path)


def write_manifest(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "mask", "prediction"])
        w.writerows(rows)
    return path


def load(path):
    img = nib.load(path)
    return np.asarray(img.dataobj).astype(np.int64), tuple(float(z) for z in img.header.get_zooms()[:3])


def check_rows(test, per_image, expected_by_index):
    by_index = {}
    for r in per_image:
        by_index.setdefault(int(r["index"]), []).append(r)
    test.assertEqual(sorted(by_index), sorted(expected_by_index))
    for i, want_rows in expected_by_index.items():
        got_rows = by_index[i]
        test.assertEqual(len(got_rows), len(want_rows), f"row {i}: classes")
        for c, (got, want) in enumerate(zip(got_rows, want_rows)):
            for f in ("tp", "fp", "fn", "tn"):
                test.assertEqual(int(got[f]), want[f], f"row {i} class {c} {f}")
            for m in METRICS:
                if m in got:
                    test.assertTrue(tt.same(tt.num(got[m]), want[m]),
                                    f"row {i} class {c} {m}: tally {got[m]} reference {want[m]}")


class Volumes3DTest(unittest.TestCase):
    def test_random_volumes_match_the_scipy_reference_for_any_worker_count(self):
        rng = np.random.default_rng(20261122)
        root = tt.tmpdir(self)
        os.makedirs(os.path.join(root, "v"))
        rows, expected = [], {}
        n = 240
        for i in range(n):
            shape = tuple(int(s) for s in rng.integers(6, 26, 3))
            labels = int(rng.integers(2, 5))
            ref = random_volume(rng, shape, labels)
            pred = perturb(rng, ref, labels)
            if i % 7 == 3:
                ref[:, int(rng.integers(0, shape[1])), :] = 255  # An ignored slab.
            if i % 11 == 5:
                ref[:] = 0  # Empty reference.
            zooms = (1.0, 1.0, 1.0) if i % 3 == 0 else tuple(float(z) for z in rng.choice([0.5, 0.8, 1.0, 2.5, 3.0], 3))
            dtype = DTYPES[i % len(DTYPES)]
            mp, pp = os.path.join(root, "v", f"r{i:03d}.nii.gz"), os.path.join(root, "v", f"p{i:03d}.nii")
            save(mp, ref, zooms, dtype, nifti2=(i % 5 == 0))
            save(pp, pred, zooms, DTYPES[(i + 1) % len(DTYPES)], nifti2=(i % 4 == 0))
            rows.append([f"case{i:03d}", mp, pp])
            # The reference reads the files back, as any user of nibabel would.
            r, z = load(mp)
            p, _ = load(pp)
            expected[i] = reference3(p, r, 5, z)
        manifest = write_manifest(os.path.join(root, "m.csv"), rows)
        out1, out3 = os.path.join(root, "o1"), os.path.join(root, "o3")
        tt.tally("run", "--manifest", manifest, "--out", out1, "--metrics", "all", "--num-classes", "5")
        tt.tally("run", "--manifest", manifest, "--out", out3, "--metrics", "all", "--num-classes", "5",
                 "--workers", "3", "--shard-size", "7", "--worker-threads", "1")
        check_rows(self, tt.read_per_image(out1), expected)
        self.assertTrue(tt.same_files(out1, out3), "per_image.csv differs between 1 and 3 workers")
        report = tt.read_report(out1)
        self.assertEqual(report["images_evaluated"], n)
        self.assertEqual(report["num_classes"], 5)

    def test_class_count_from_the_data_pads_absent_classes(self):
        rng = np.random.default_rng(3)
        root = tt.tmpdir(self)
        rows, expected = [], {}
        for i, top in enumerate([1, 3, 0, 2]):
            ref = np.zeros((10, 9, 8), np.uint8)
            ref[2:6, 2:6, 2:6] = top
            pred = ref.copy()
            pred[3, 3, 3] = 1 if top != 1 else 0
            mp, pp = os.path.join(root, f"r{i}.nii.gz"), os.path.join(root, f"p{i}.nii.gz")
            save(mp, ref, (1.0, 2.0, 1.5), np.uint8)
            save(pp, pred, (1.0, 2.0, 1.5), np.uint8)
            rows.append([f"c{i}", mp, pp])
            expected[i] = reference3(pred.astype(np.int64), ref.astype(np.int64), 4, (1.0, 2.0, 1.5))
        manifest = write_manifest(os.path.join(root, "m.csv"), rows)
        out = os.path.join(root, "o")
        tt.tally("run", "--manifest", manifest, "--out", out, "--metrics", "all", "--shard-size", "1",
                 "--workers", "2")
        self.assertEqual(tt.read_report(out)["num_classes"], 4)  # Largest label 3, plus one.
        check_rows(self, tt.read_per_image(out), expected)

    def test_geometry_mismatches_fail_the_row_naming_both(self):
        root = tt.tmpdir(self)
        ref = np.zeros((8, 8, 8), np.uint8)
        ref[2:5, 2:5, 2:5] = 1
        good_r, good_p = os.path.join(root, "r.nii.gz"), os.path.join(root, "p.nii.gz")
        save(good_r, ref, (1.0, 1.0, 2.0), np.uint8)
        save(good_p, ref, (1.0, 1.0, 2.0), np.uint8)
        dims_p = os.path.join(root, "dims.nii.gz")
        save(dims_p, np.zeros((8, 8, 9), np.uint8), (1.0, 1.0, 2.0), np.uint8)
        spacing_p = os.path.join(root, "spacing.nii.gz")
        save(spacing_p, ref, (1.0, 1.0, 3.0), np.uint8)
        affine = np.diag([1.0, 1.0, 2.0, 1.0])
        affine[:3, 3] = [40.0, 0.0, 0.0]
        affine_p = os.path.join(root, "affine.nii.gz")
        save(affine_p, ref, (1.0, 1.0, 2.0), np.uint8, affine=affine)
        png_p = os.path.join(root, "flat.png")
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(png_p)
        float_p = os.path.join(root, "float.nii.gz")
        save(float_p, ref.astype(np.float32) * 0.5, (1.0, 1.0, 2.0), np.float32)
        manifest = write_manifest(os.path.join(root, "m.csv"), [
            ["ok", good_r, good_p], ["dims", good_r, dims_p], ["spacing", good_r, spacing_p],
            ["affine", good_r, affine_p], ["png", good_r, png_p], ["float", good_r, float_p],
            ["missing", good_r, os.path.join(root, "nope.nii.gz")]])
        out = os.path.join(root, "o")
        p = tt.tally("run", "--manifest", manifest, "--out", out, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)  # Rows failed: more than --max-failed-fraction 0.
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 1)
        failures = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertIn("8x8x9", failures["dims"])
        self.assertIn("8x8x8", failures["dims"])
        for key in ("dims", "spacing", "affine", "png"):
            self.assertIn(good_r, failures[key], key)
        self.assertIn("spacing", failures["spacing"])
        self.assertIn("affine", failures["affine"])
        self.assertIn("PNG", failures["png"])
        self.assertIn("not an integer", failures["float"])
        self.assertIn("nope.nii.gz", failures["missing"])

    def test_spacing_flag_is_refused_against_the_header_unless_forced(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(5)
        ref = random_volume(rng, (14, 12, 10), 3)
        pred = np.roll(ref, 1, axis=2)
        mp, pp = os.path.join(root, "r.nii.gz"), os.path.join(root, "p.nii.gz")
        save(mp, ref, (0.8, 0.8, 2.5), np.uint8)
        save(pp, pred, (0.8, 0.8, 2.5), np.uint8)
        manifest = write_manifest(os.path.join(root, "m.csv"), [["a", mp, pp]])
        out = os.path.join(root, "o")
        p = tt.tally("run", "--manifest", manifest, "--out", out, "--spacing", "1,1,1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--force-spacing", p.stdout + p.stderr)
        # Agreeing with the header (z,y,x = pixdim 3,2,1) is fine; forcing uses the given spacing.
        tt.tally("run", "--manifest", manifest, "--out", out, "--spacing", "2.5,0.8,0.8", "--metrics", "all")
        want = reference3(pred.astype(np.int64), ref.astype(np.int64), 3, (0.8, 0.8, 2.5))
        check_rows(self, tt.read_per_image(out), {0: want})
        tt.tally("run", "--manifest", manifest, "--out", out, "--spacing", "1,2,3", "--force-spacing",
                 "--metrics", "all", "--nsd-tolerance", "2")
        # z,y,x = 1,2,3 is nibabel's (x, y, z) sampling (3, 2, 1).
        want = reference3(pred.astype(np.int64), ref.astype(np.int64), 3, (3.0, 2.0, 1.0), tolerance=2.0)
        check_rows(self, tt.read_per_image(out), {0: want})
        p = tt.tally("run", "--manifest", manifest, "--out", out, "--spacing", "1,1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("three (z,y,x)", p.stdout + p.stderr)


def nnunet_compute_metrics(ref, pred, regions, ignore_label=None):
    """nnU-Net v2's compute_metrics (nnunetv2/evaluation/evaluate_predictions.py), re-implemented."""
    ignore_mask = ref == ignore_label if ignore_label is not None else None
    use = np.ones_like(ref, dtype=bool) if ignore_mask is None else ~ignore_mask
    out = {}
    for key, labels in regions:
        mr, mp = np.isin(ref, labels), np.isin(pred, labels)
        tp, fp = int(np.sum(mr & mp & use)), int(np.sum(~mr & mp & use))
        fn, tn = int(np.sum(mr & ~mp & use)), int(np.sum(~mr & ~mp & use))
        d = float("nan") if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
        j = float("nan") if tp + fp + fn == 0 else tp / (tp + fp + fn)
        out[key] = {"Dice": d, "IoU": j, "FP": fp, "TP": tp, "FN": fn, "TN": tn, "n_pred": fp + tp, "n_ref": fn + tp}
    return out


class NnunetParityTest(unittest.TestCase):
    def test_folder_convention_regions_and_summary_json(self):
        rng = np.random.default_rng(11)
        root = tt.tmpdir(self)
        pred_dir, ref_dir = os.path.join(root, "pred"), os.path.join(root, "ref")
        os.makedirs(pred_dir)
        os.makedirs(ref_dir)
        names = [f"case_{i:03d}.nii.gz" for i in range(12)]
        cases = {}
        for i, name in enumerate(names):
            ref = random_volume(rng, (16, 14, 12), 4)
            pred = perturb(rng, ref, 4)
            save(os.path.join(ref_dir, name), ref, (1.0, 1.0, 1.0), np.uint8)
            save(os.path.join(pred_dir, name), pred, (1.0, 1.0, 1.0), np.uint8)
            cases[name] = (ref.astype(np.int64), pred.astype(np.int64))
        save(os.path.join(pred_dir, "stray.nii.gz"), np.zeros((4, 4, 4)), (1.0, 1.0, 1.0), np.uint8)
        out = os.path.join(root, "o")
        p = tt.tally("run", "--predictions", pred_dir, "--references", ref_dir, "--out", out, "--regions",
                     "1,2,3;2,3;3", "--nnunet-summary", "--metrics", "dice,iou,hd95")
        self.assertIn("stray.nii.gz", p.stderr)  # Unpaired predictions are named, and skipped.
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        regions = [("(1, 2, 3)", [1, 2, 3]), ("(2, 3)", [2, 3]), ("3", [3])]
        self.assertEqual(sorted(summary), ["foreground_mean", "mean", "metric_per_case"])
        self.assertEqual(len(summary["metric_per_case"]), len(names))
        per_case = []
        for entry, name in zip(summary["metric_per_case"], names):
            self.assertEqual(entry["reference_file"], os.path.join(ref_dir, name))
            self.assertEqual(entry["prediction_file"], os.path.join(pred_dir, name))
            want = nnunet_compute_metrics(*cases[name], regions)
            per_case.append(want)
            self.assertEqual(sorted(entry["metrics"]), sorted(k for k, _ in regions))
            for key, _ in regions:
                for m, v in want[key].items():
                    self.assertTrue(tt.same(entry["metrics"][key][m], v), f"{name} {key} {m}")
        for key, _ in regions:
            for m in per_case[0][key]:
                vals = [c[key][m] for c in per_case]
                want = float(np.nanmean(vals)) if not all(math.isnan(v) for v in vals) else float("nan")
                self.assertTrue(tt.same(summary["mean"][key][m], want, rel=1e-12), f"mean {key} {m}")
        for m in per_case[0]["3"]:
            want = float(np.mean([summary["mean"][k][m] for k, _ in regions]))
            self.assertTrue(tt.same(summary["foreground_mean"][m], want, rel=1e-12), f"foreground {m}")
        # Region surface distances: the union masks, as for classes.
        rows = tt.read_per_image(out)
        self.assertEqual([r["class"] for r in rows[:3]], ["1+2+3", "2+3", "3"])
        ref, pred = cases[names[0]]
        for r, (key, labels) in zip(rows[:3], regions):
            want = tt.surface_metrics(np.isin(pred, labels), np.isin(ref, labels), (1.0, 1.0, 1.0), 1.0)
            self.assertTrue(tt.same(tt.num(r["hd95"]), want["hd95"]), key)
        report = tt.read_report(out)
        self.assertEqual([c["region"] for c in report["classes"]], [[1, 2, 3], [2, 3], [3]])

    def test_a_reference_without_prediction_fails_before_starting(self):
        root = tt.tmpdir(self)
        pred_dir, ref_dir = os.path.join(root, "pred"), os.path.join(root, "ref")
        os.makedirs(pred_dir)
        os.makedirs(ref_dir)
        for name in ("a.nii.gz", "b.nii.gz"):
            save(os.path.join(ref_dir, name), np.zeros((4, 4, 4)), (1.0, 1.0, 1.0), np.uint8)
        save(os.path.join(pred_dir, "a.nii.gz"), np.zeros((4, 4, 4)), (1.0, 1.0, 1.0), np.uint8)
        out = os.path.join(root, "o")
        p = tt.tally("run", "--predictions", pred_dir, "--references", ref_dir, "--out", out, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("b.nii.gz", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "report.json")))


class Predictions2DTest(unittest.TestCase):
    def test_predictions_of_the_model_score_exactly_as_the_model_path(self):
        rng = np.random.default_rng(9)
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(root, rng, 24, [(20, 24), (17, 31)], classes=3)
        model = tt.fixture("three_class.pt")
        out_model = os.path.join(root, "om")
        tt.tally_run(model, manifest, out_model, "--metrics", "all")
        pm, k = tt.write_prediction_manifest(model, manifest, root)
        out_pred = os.path.join(root, "op")
        tt.tally("run", "--manifest", pm, "--out", out_pred, "--metrics", "all", "--num-classes", str(k))
        # The same rows, but for the files they were scored from (an image there, a prediction here).
        def scores(out):
            return [{k: v for k, v in r.items() if not k.endswith("_xxh128")} for r in tt.read_per_image(out)]
        self.assertEqual(scores(out_model), scores(out_pred), "per_image.csv of predictions != model path")

    def test_labels_beyond_num_classes_and_label_map_on_predictions(self):
        root = tt.tmpdir(self)
        ref = np.zeros((6, 7), np.uint8)
        ref[1:4, 1:4] = 255  # A 0/255 binary mask.
        pred = ref.copy()
        pred[1, 1] = 0
        for name, arr in (("r.png", ref), ("p.png", pred), ("bad.png", np.full((6, 7), 9, np.uint8))):
            Image.fromarray(arr).save(os.path.join(root, name))
        with open(os.path.join(root, "m.csv"), "w") as f:
            f.write("mask,prediction\nr.png,p.png\nr.png,bad.png\n")
        out = os.path.join(root, "o")
        tt.tally("run", "--manifest", os.path.join(root, "m.csv"), "--out", out, "--label-map", "0:0,255:1",
                 "--num-classes", "2", "--max-failed-fraction", "0.5")
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 1)
        self.assertIn("prediction value 9", report["failures"][0]["reason"])
        rows = tt.read_per_image(out)
        self.assertEqual((int(rows[1]["tp"]), int(rows[1]["fn"]), int(rows[1]["fp"])), (8, 1, 0))

    def test_a_manifest_without_prediction_column_needs_a_model(self):
        root = tt.tmpdir(self)
        with open(os.path.join(root, "m.csv"), "w") as f:
            f.write("image,mask\na.png,b.png\n")
        p = tt.tally("run", "--manifest", os.path.join(root, "m.csv"), "--out", os.path.join(root, "o"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("prediction", p.stderr)


if __name__ == "__main__":
    unittest.main()
