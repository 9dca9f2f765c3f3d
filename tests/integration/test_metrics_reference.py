"""Every metric of Tally's per-image output against an independent numpy/scipy implementation, on
hundreds of random label-map pairs of varied sizes plus the edge cases, through the real binaries.

The echo4.pt fixture predicts, at every pixel, the value of the red channel (0..3), so any
predicted label map can be written into an image and fed through the whole pipeline.
"""
import math
import os
import unittest

import numpy as np

import tallytest as tt

METRICS = ["dice", "iou", "precision", "recall", "specificity", "accuracy", "hd", "hd95", "assd", "nsd"]


def random_pairs(rng, n):
    pairs = []
    for i in range(n):
        h, w = int(rng.integers(5, 65)), int(rng.integers(5, 65))
        kind = i % 5
        if kind == 0:  # Blobs, shifted for the prediction.
            ref = tt.blob_mask(rng, h, w, 4)
            pred = np.roll(ref, (int(rng.integers(-3, 4)), int(rng.integers(-3, 4))), axis=(0, 1))
        elif kind == 1:  # Speckle.
            ref = rng.integers(0, 4, (h, w)).astype(np.uint8)
            pred = np.where(rng.random((h, w)) < 0.3, rng.integers(0, 4, (h, w)), ref).astype(np.uint8)
        elif kind == 2:  # Independent blobs (often empty classes on one side).
            ref, pred = tt.blob_mask(rng, h, w, 4), tt.blob_mask(rng, h, w, 4)
        elif kind == 3:  # Blobs with ignore pixels in the reference.
            ref = tt.blob_mask(rng, h, w, 4, ignore=True)
            pred = tt.blob_mask(rng, h, w, 4)
            ref[rng.random((h, w)) < 0.05] = 255
        else:  # Eroded/dilated versions of each other.
            from scipy import ndimage
            ref = tt.blob_mask(rng, h, w, 3)
            pred = ref.copy()
            grown = ndimage.binary_dilation(ref == 1)
            pred[grown & (ref == 0)] = 1
        pairs.append((pred.astype(np.uint8), ref.astype(np.uint8)))
    return pairs


def edge_cases():
    z = lambda h=12, w=10: np.zeros((h, w), np.uint8)  # noqa: E731
    cases = []
    cases.append((z(), z()))                                    # both empty for classes 1..3
    one = z(); one[3:6, 2:5] = 1
    cases.append((one, z()))                                    # reference empty, prediction not
    cases.append((z(), one.copy()))                             # prediction empty, reference not
    full = np.ones((9, 11), np.uint8)
    cases.append((full, full.copy()))                           # full image, identical
    box = np.zeros((9, 11), np.uint8); box[2:5, 3:9] = 1
    cases.append((full, box))                                   # full image vs a box
    a, b = z(), z(); a[0, 0] = 2; b[11, 9] = 2
    cases.append((a, b))                                        # single pixels in opposite corners
    a, b = z(), z(); a[5, 5] = 3; b[5, 5] = 3
    cases.append((a, b))                                        # the same single pixel
    border_p, border_r = z(16, 16), z(16, 16)
    border_p[:, :3] = 1; border_r[:, :4] = 1; border_r[0, :] = 2; border_p[15, :] = 2
    cases.append((border_p, border_r))                          # masks along the image border
    ign_p, ign_r = one.copy(), one.copy()
    ign_r[4, :] = 255; ign_p[4, 7] = 2
    cases.append((ign_p, ign_r))                                # ignore pixels, with a prediction on one
    all_ignored = np.full((6, 6), 255, np.uint8)
    cases.append((z(6, 6), all_ignored))                        # every pixel ignored
    multi_p = np.tile(np.arange(4, dtype=np.uint8), (8, 2))
    multi_r = np.tile(np.array([0, 1, 2, 3, 3, 2, 1, 0], np.uint8), (8, 1))
    cases.append((multi_p, multi_r))                            # four classes, stripes
    one_px_img_p, one_px_img_r = np.ones((1, 1), np.uint8), np.ones((1, 1), np.uint8)
    cases.append((one_px_img_p, one_px_img_r))                  # a 1x1 image
    return cases


class MetricsReferenceTest(unittest.TestCase):
    def compare(self, pairs, spacing, tolerance, extra=()):
        root = tt.tmpdir(self)
        manifest = tt.write_pairs(os.path.join(root, "data"), pairs)
        out = os.path.join(root, "out")
        args = ["--workers", "2", "--metrics", "all", "--nsd-tolerance", str(tolerance)]
        if spacing != (1.0, 1.0):
            args += ["--spacing", f"{spacing[0]},{spacing[1]}"]
        tt.tally_run(tt.fixture("echo4.pt"), manifest, out, *args, *extra)
        rows = tt.read_per_image(out)
        by_key = {(int(r["index"]), int(r["class"])): r for r in rows}
        compared, worst = 0, 0.0
        for i, (pred, ref) in enumerate(pairs):
            want = tt.reference_rows(pred.astype(np.int64), ref, 4, spacing, tolerance)
            for c in range(4):
                got = by_key[(i, c)]
                for f in ("tp", "fp", "fn", "tn"):
                    self.assertEqual(int(got[f]), want[c][f], f"pair {i} class {c} {f}")
                for m in METRICS:
                    g, w = tt.num(got[m]), want[c][m]
                    self.assertTrue(tt.same(g, w, 1e-12), f"pair {i} class {c} {m}: tally {g} reference {w}")
                    if math.isfinite(g) and math.isfinite(w):
                        worst = max(worst, abs(g - w) / max(1.0, abs(w)))
                    compared += 1
        return compared, worst, tt.read_report(out), rows

    def test_random_pairs_and_edge_cases(self):
        pairs = random_pairs(np.random.default_rng(2026), 220) + edge_cases()
        compared, worst, report, rows = self.compare(pairs, (1.0, 1.0), 1.0)
        print(f"\nmetrics reference: {len(pairs)} pairs, {compared} values compared, "
              f"largest relative deviation {worst:.3g}")
        self.assertGreaterEqual(len(pairs), 200)
        self.assertEqual(compared, len(pairs) * 4 * len(METRICS))
        self.check_aggregates(report, rows)

    def test_anisotropic_spacing_and_tolerance(self):
        pairs = random_pairs(np.random.default_rng(7), 60) + edge_cases()
        compared, worst, _, _ = self.compare(pairs, (0.5, 2.0), 1.5)
        print(f"\nmetrics reference (spacing 0.5,2, tolerance 1.5): {compared} values, "
              f"largest relative deviation {worst:.3g}")

    def check_aggregates(self, report, rows):
        """report.json's per-class aggregates against numpy over the per-image values."""
        for cls in report["classes"]:
            c = cls["class"]
            mine = [r for r in rows if int(r["class"]) == c]
            for m in METRICS:
                v = np.array([tt.num(r[m]) for r in mine])
                finite = v[np.isfinite(v)]
                want_mean = float(finite.mean()) if finite.size else float("nan")
                got = cls[m + "_mean"]
                self.assertTrue(tt.same(float("nan") if got is None else got, want_mean, 1e-12), (c, m, got, want_mean))
                self.assertEqual(cls[m + "_inf_count"], int(np.sum(np.isinf(v))), (c, m))
            tp, fp, fn, tn = (sum(int(r[f]) for r in mine) for f in ("tp", "fp", "fn", "tn"))
            self.assertEqual((cls["tp"], cls["fp"], cls["fn"], cls["tn"]), (tp, fp, fn, tn))
            for m, want in tt.count_metrics(tp, fp, fn, tn).items():
                self.assertTrue(tt.same(cls[m + "_global"], want, 1e-12), (c, m))
            for m in ("hd", "hd95", "assd", "nsd"):
                v = np.sort(np.array([tt.num(r[m]) for r in mine]))
                v = v[~np.isnan(v)]
                for q, key in ((0.5, "_median"), (0.95, "_p95")):
                    want = percentile_keeping_inf(v, q)
                    got = cls[m + key]
                    self.assertTrue(tt.same(float("nan") if got is None else got, want, 1e-12), (c, m, key, got, want))
            lo, hi = cls["dice_mean_ci95"]
            self.assertLessEqual(lo, cls["dice_mean"])
            self.assertGreaterEqual(hi, cls["dice_mean"])
        fg = [cls["dice_mean"] for cls in report["classes"] if cls["class"] != 0]
        self.assertTrue(tt.same(report["foreground_dice_mean"], float(np.mean(fg)), 1e-12))

    def test_hand_worked_values(self):
        # 4x4 images, class 1: prediction = left half, reference = top half.
        pred = np.zeros((4, 4), np.uint8); pred[:, :2] = 1
        ref = np.zeros((4, 4), np.uint8); ref[:2, :] = 1
        _, _, report, rows = self.compare([(pred, ref)], (1.0, 1.0), 1.0)
        r = {m: tt.num(x[m]) for x in rows if x["class"] == "1" for m in METRICS}
        # TP 4, FP 4, FN 4, TN 4.
        self.assertEqual(r["dice"], 0.5)
        self.assertAlmostEqual(r["iou"], 1 / 3, places=15)
        self.assertEqual(r["precision"], 0.5)
        self.assertEqual(r["specificity"], 0.5)
        # Edges: both 2-pixel-thick bands are all edge (8 pixels each). The farthest pred edge
        # pixel from every ref edge pixel is (3,0) or (3,1): 2 rows below row 1 -> hd = 2.
        self.assertEqual(r["hd"], 2.0)
        # d_pg = [0,0,0,0, 1,1, 2,2] sorted; p95 = 2. Same for d_gp by symmetry.
        self.assertEqual(r["hd95"], 2.0)
        self.assertEqual(r["assd"], 0.75)   # (0*4 + 1*2 + 2*2) * 2 / 16
        self.assertEqual(r["nsd"], 0.75)    # 12 of the 16 distances are <= 1

    def test_include_background_changes_only_the_foreground_means(self):
        pairs = random_pairs(np.random.default_rng(3), 10)
        _, _, plain, _ = self.compare(pairs, (1.0, 1.0), 1.0)
        _, _, with_bg, _ = self.compare(pairs, (1.0, 1.0), 1.0, ("--include-background",))
        # Background is foreground now: it gets thumbnails too; the worst rows themselves stay.
        strip = lambda classes: [  # noqa: E731
            {k: ([{f: x for f, x in w.items() if f != "thumbnail"} for w in v] if k == "worst" else v)
             for k, v in c.items() if k not in ("foreground", "in_foreground_mean")} for c in classes]
        self.assertEqual(strip(plain["classes"]), strip(with_bg["classes"]))
        self.assertTrue(with_bg["classes"][0]["foreground"])
        self.assertTrue(with_bg["classes"][0]["worst"][0]["thumbnail"])
        self.assertFalse(plain["classes"][0]["worst"][0]["thumbnail"])
        means = [c["dice_mean"] for c in with_bg["classes"]]
        self.assertTrue(tt.same(with_bg["foreground_dice_mean"], float(np.mean(means)), 1e-12))
        self.assertTrue(with_bg["include_background"])


def percentile_keeping_inf(v, q):
    """Linear-interpolated percentile of sorted v (NaN already removed), inf kept: an infinite
    neighbour makes the result infinite (docs/metrics.md 'Aggregation')."""
    if v.size == 0:
        return float("nan")
    pos = q * (v.size - 1)
    lo = int(math.floor(pos))
    t = pos - lo
    a = v[lo]
    if lo + 1 >= v.size or t == 0:
        return float(a)
    b = v[lo + 1]
    if math.isinf(a) or math.isinf(b):
        return float(b)
    return float(np.percentile(v, q * 100))


if __name__ == "__main__":
    unittest.main()
