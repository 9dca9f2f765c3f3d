"""--metrics calibration: ECE, classwise ECE, the reliability bins and the equal-mass ACE of the report
against numpy over every pixel of the test set (the probabilities from the same TorchScript file run
here by torch, the counting written here), per_image.csv's ece and confidence per row, identical for 1
and 3 workers in random order, and the refusals that name calibration."""
import json
import math
import os
import time
import unittest

import numpy as np
import torch
from PIL import Image

import tallytest as tt

BINS = 15
FINE = 65536


def pixels_of(model, manifest):
    """Per row (in manifest order): the probabilities [K, H, W] float32, the argmax and the valid
    reference labels, as torch computes them from the decoded PNG."""
    root = os.path.dirname(manifest)
    net = torch.jit.load(model).eval()
    rows = []
    with open(manifest) as f:
        next(f)
        for line in f:
            _, img, msk = line.strip().split(",")
            x = np.asarray(Image.open(os.path.join(root, img)).convert("RGB"))
            ref = np.asarray(Image.open(os.path.join(root, msk))).astype(np.int64)
            with torch.no_grad():
                t = torch.from_numpy(x.copy()).permute(2, 0, 1)[None].float() / 255.0
                logits = net(t)
                if logits.shape[1] == 1:
                    p = torch.sigmoid(logits)
                    probs = torch.cat([1 - p, p], 1)[0]
                    pred = (logits[0, 0] > 0).long()
                else:
                    probs = torch.softmax(logits, 1)[0]
                    pred = logits[0].argmax(0)
            rows.append((probs.numpy(), pred.numpy(), ref))
    return rows


def histograms(rows):
    """Per histogram h (classes, then the top label): the values v and correct flags of every valid pixel."""
    k = rows[0][0].shape[0]
    values = [[] for _ in range(k + 1)]
    correct = [[] for _ in range(k + 1)]
    for probs, pred, ref in rows:
        valid = (ref >= 0) & (ref < k)
        for c in range(k):
            values[c].append(probs[c][valid])
            correct[c].append(ref[valid] == c)
        top = np.take_along_axis(probs, pred[None], 0)[0]
        values[k].append(top[valid])
        correct[k].append(pred[valid] == ref[valid])
    return [np.concatenate(v).astype(np.float64) for v in values], [np.concatenate(c) for c in correct]


def ece_and_bins(v, ok):
    b = np.minimum(np.floor(v * BINS), BINS - 1).astype(int)
    bins = []
    gap = 0.0
    for i in range(BINS):
        sel = b == i
        n = int(sel.sum())
        if n:
            gap += abs(ok[sel].sum() - v[sel].sum())
        bins.append((n, ok[sel].mean() if n else math.nan, v[sel].mean() if n else math.nan))
    return gap / len(v), bins


def ace(v, ok, exact=False):
    """docs/metrics.md "Calibration": equal-mass bins of whole 1/65536-wide bins, v at the fine bin's
    centre (exact: at the pixels' own mean v, to show the centres' resolution)."""
    f = np.minimum(np.floor(v * FINE), FINE - 1).astype(np.int64)
    counts = np.bincount(f, minlength=FINE)
    right = np.bincount(f, weights=ok.astype(np.float64), minlength=FINE)
    sums = np.bincount(f, weights=v, minlength=FINE)
    n = counts.sum()
    total, bins, r = 0.0, 0, 0
    px = good = centre = 0.0
    cum = 0
    for i in np.nonzero(counts)[0]:
        cum += counts[i]
        px += counts[i]
        good += right[i]
        centre += sums[i] if exact else counts[i] * (i + 0.5) / FINE
        if cum * BINS >= n * (r + 1):
            total += abs(good / px - centre / px)
            bins += 1
            px = good = centre = 0.0
            while r < BINS and cum * BINS >= n * (r + 1):
                r += 1
    return total / bins


class CalibrationTest(unittest.TestCase):
    def setUp(self):
        self.root = tt.tmpdir(self)
        rng = np.random.default_rng(11)
        self.manifest = tt.write_dataset(os.path.join(self.root, "data"), rng, 23, [(24, 32), (17, 20), (32, 32)])

    def check(self, model, out, rows):
        report = tt.read_report(out)
        cal = report["calibration"]
        values, correct = histograms(rows)
        k = len(values) - 1
        self.assertEqual(cal["rows"], len(rows))
        self.assertEqual(cal["fine_rows"], len(rows))
        top_ece, top_bins = ece_and_bins(values[k], correct[k])
        self.assertTrue(tt.same(cal["ece"], top_ece, rel=1e-9), (cal["ece"], top_ece))
        self.assertEqual(cal["top_label"]["pixels"], len(values[k]))
        for got, (n, acc, conf) in zip(cal["top_label"]["reliability"], top_bins):
            self.assertEqual(got["pixels"], n)
            if n:
                self.assertTrue(tt.same(got["accuracy"], acc, rel=1e-12))
                self.assertTrue(tt.same(got["confidence"], conf, rel=1e-9))
        classwise = []
        for c in range(k):
            e, bins = ece_and_bins(values[c], correct[c])
            classwise.append(e)
            got = cal["classes"][c]
            self.assertTrue(tt.same(got["ece"], e, rel=1e-9), (c, got["ece"], e))
            self.assertEqual([b["pixels"] for b in got["reliability"]], [b[0] for b in bins])
            self.assertTrue(tt.same(got["ace"], ace(values[c], correct[c]), rel=1e-9))
        self.assertTrue(tt.same(cal["classwise_ece"], float(np.mean(classwise)), rel=1e-9))
        self.assertTrue(tt.same(cal["ace"], ace(values[k], correct[k]), rel=1e-9))
        # The documented resolution: within half a fine bin of the same bins at the pixels' own values.
        self.assertLessEqual(abs(cal["ace"] - ace(values[k], correct[k], exact=True)), 0.5 / FINE + 1e-12)
        # Per row: the top label's ECE and mean confidence.
        per_row = {}
        for r in tt.read_per_image(out):
            per_row[int(r["index"])] = (float(r["ece"]), float(r["confidence"]))
        for i, (probs, pred, ref) in enumerate(rows):
            valid = (ref >= 0) & (ref < k)
            v = np.take_along_axis(probs, pred[None], 0)[0][valid].astype(np.float64)
            e, _ = ece_and_bins(v, (pred == ref)[valid])
            self.assertTrue(tt.same(per_row[i][0], e, rel=1e-9), (i, per_row[i][0], e))
            self.assertTrue(tt.same(per_row[i][1], v.mean(), rel=1e-9))
        with open(os.path.join(out, "report.html")) as f:
            html = f.read()
        self.assertIn("<h2>Calibration</h2>", html)
        self.assertEqual(html.count('class="bin"'), sum(1 for b in cal["top_label"]["reliability"] if b["pixels"]) +
                         sum(1 for c in cal["classes"] for b in c["reliability"] if b["pixels"]))
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("## Calibration", f.read())

    def test_three_classes_against_numpy(self):
        model = tt.fixture("three_class.pt")
        out = os.path.join(self.root, "out")
        tt.tally_run(model, self.manifest, out, "--metrics", "dice,calibration", "--batch-size", "4")
        self.check(model, out, pixels_of(model, self.manifest))

    def test_single_logit_against_numpy(self):
        model = tt.fixture("single_logit.pt")
        out = os.path.join(self.root, "out")
        manifest = tt.write_dataset(os.path.join(self.root, "two"), np.random.default_rng(5), 9, [(20, 28)], classes=2)
        tt.tally_run(model, manifest, out, "--metrics", "calibration")
        self.check(model, out, pixels_of(model, manifest))
        self.assertIn("hd95", tt.read_per_image(out)[0])  # calibration alone keeps the default metrics

    def test_one_and_three_workers_in_random_order_agree(self):
        model = tt.fixture("three_class.pt")
        outs = []
        for workers, extra in ((1, ()), (3, ("--order", "random"))):
            c = tt.Cluster(self, os.path.join(self.root, f"c{workers}"))
            for _ in range(workers):
                c.start_worker()
            c.wait_registered(workers)
            job = c.submit(model, self.manifest, "--metrics", "dice,calibration", "--batch-size", "2", "--shard-size", "4", *extra)
            c.wait(job)
            out = os.path.join(self.root, f"o{workers}")
            c.fetch(job, out)
            c.stop()
            outs.append(out)
        a, b = (tt.read_report(o)["calibration"] for o in outs)
        self.assertEqual(a, b)
        self.assertTrue(tt.same_files(outs[0], outs[1]))

    def test_speculative_copies_count_each_batch_once(self):
        # A straggler (batches of 2, each row's result held back) and a fast worker's speculative copy
        # (batches of 4) commit rows of the same shards: batches that came apart are refused and
        # evaluated again alone, and the figures equal one worker's to the bit.
        model = tt.fixture("three_class.pt")
        manifest = tt.write_dataset(os.path.join(self.root, "many"), np.random.default_rng(8), 96, [(16, 16)])
        plain = os.path.join(self.root, "plain")
        c = tt.Cluster(self, os.path.join(self.root, "c0"))
        c.start_worker()
        job = c.submit(model, manifest, "--metrics", "calibration")
        self.assertEqual(c.wait(job)["state"], "succeeded")
        c.fetch(job, plain)
        c.stop()
        c = tt.Cluster(self, os.path.join(self.root, "c1"))
        c.start_worker("--batch-size", "2", env={"TALLY_TEST_THROTTLE_MS": "40"})
        c.wait_registered(1)
        job = c.submit(model, manifest, "--metrics", "calibration", "--speculate-after", "1")
        while c.job(job)["state"] == "queued":
            time.sleep(0.05)
        time.sleep(1.0)
        c.start_worker("--batch-size", "4")
        self.assertEqual(c.wait(job, timeout=300)["state"], "succeeded")
        out = os.path.join(self.root, "spec")
        c.fetch(job, out)
        a, b = tt.read_report(plain), tt.read_report(out)
        self.assertEqual((b["images_evaluated"], b["images_failed"]), (96, 0))
        self.assertEqual(a["calibration"], b["calibration"])
        self.assertTrue(tt.same_files(plain, out))

    def test_rows_grouped_by_their_calibration(self):
        # Each row's ECE and confidence are derived properties: grouped by (quantile bins of
        # per_image.csv's columns) and searched by --find-slices as tally slices does.
        model = tt.fixture("three_class.pt")
        out = os.path.join(self.root, "out")
        tt.tally_run(model, self.manifest, out, "--metrics", "dice,calibration", "--group-by",
                     "derived:confidence:2,derived:ece", "--find-slices", "--min-group-rows", "5")
        report = tt.read_report(out)
        rows = {}
        for r in tt.read_per_image(out):
            rows[int(r["index"])] = float(r["confidence"])
        conf = np.array([rows[i] for i in sorted(rows)])
        edges = np.quantile(conf, [0, 0.5, 1])
        low = int(sum(1 for v in conf if np.searchsorted(edges, v, side="left") <= 1))
        tables = {t["by"]: t for t in report["groups"]["tables"]}
        self.assertEqual(sorted(g["rows"] for g in tables["derived:confidence:2"]["groups"]), sorted([low, len(conf) - low]))
        self.assertEqual(sum(g["rows"] for g in tables["derived:ece"]["groups"]), len(conf))
        self.assertIn("derived:ece (4 quantile bins)", report["slices"]["attributes"])
        self.assertEqual(report["slices"], json.loads(tt.tally("slices", out, "--json").stdout))
        p = tt.tally("run", "--model", model, "--manifest", self.manifest, "--out", os.path.join(self.root, "z"),
                     "--group-by", "derived:ece", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("add --metrics calibration", p.stderr + p.stdout)

    def check_predictions(self, manifest, rows, bad_map_reason):
        """A prediction manifest's calibration against `rows`; its one bad map fails its row for the reason."""
        out = os.path.join(self.root, "out")
        tt.tally("run", "--manifest", manifest, "--out", out, "--metrics", "calibration", "--max-failed-fraction", "1")
        report = tt.read_report(out)
        self.assertEqual(report["images_failed"], 1)
        self.assertIn(bad_map_reason, report["failures"][0]["reason"])
        self.check(None, out, rows)

    def test_prediction_manifest_with_probability_maps(self):
        # Predictions already on disk with their probability maps (16-bit PNG: class 1's probability
        # times 65535), a failed row among them: the same figures, over every pixel, as numpy's.
        root = os.path.join(self.root, "pm")
        os.makedirs(root)
        rng = np.random.default_rng(21)
        lines = ["id,mask,prediction,probabilities"]
        rows = []
        for i in range(14):
            h, w = (24, 30) if i % 2 else (17, 17)
            ref = tt.blob_mask(rng, h, w, 2, ignore=(i % 3 == 0)).astype(np.int64)
            soft = np.clip(np.where(ref == 1, 0.7, 0.25) + rng.normal(0, 0.2, (h, w)), 0, 1)
            if i == 5:
                soft[:] = 1.0  # Exactly 1 everywhere: the last bins.
            v = np.round(soft * 65535).astype(np.uint16)
            pred = (v >= 32768).astype(np.uint8)
            Image.fromarray(ref.astype(np.uint8)).save(os.path.join(root, f"m{i}.png"))
            Image.fromarray(pred).save(os.path.join(root, f"p{i}.png"))
            Image.fromarray(v).save(os.path.join(root, f"q{i}.png"))
            lines.append(f"r{i},m{i}.png,p{i}.png,q{i}.png")
            p1 = v.astype(np.float32) / np.float32(65535)
            probs = np.stack([np.float32(1) - p1, p1])
            ref_ok = np.where(ref == 255, -1, ref)
            rows.append((probs, pred.astype(np.int64), ref_ok))
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(os.path.join(root, "q_bad.png"))  # 8-bit: refused.
        lines.append("bad,m0.png,p0.png,q_bad.png")
        self.check_predictions(tt.write_manifest(root, lines), rows, "16-bit grayscale PNG")

    def test_prediction_volumes_with_float_probability_maps(self):
        # 3D: NIfTI volumes (float32 and float64 maps, read as float32), ignored voxels; a map with a
        # value past 1 fails its row, naming it.
        import nibabel as nib
        root = os.path.join(self.root, "vol")
        os.makedirs(root)
        rng = np.random.default_rng(4)
        affine = np.diag([0.8, 0.8, 2.0, 1.0])
        lines = ["id,mask,prediction,probabilities"]
        rows = []
        for i in range(4):
            shape = (12, 10, 6 + i)
            ref = (rng.random(shape) < 0.3).astype(np.int64)
            ref[0, 0, :] = 255
            soft = np.clip(np.where(ref == 1, 0.65, 0.3) + rng.normal(0, 0.25, shape), 0, 1)
            dtype = np.float64 if i % 2 else np.float32
            pred = (soft > 0.5).astype(np.uint8)
            nib.save(nib.Nifti1Image(ref.astype(np.uint8), affine), os.path.join(root, f"m{i}.nii.gz"))
            nib.save(nib.Nifti1Image(pred, affine), os.path.join(root, f"p{i}.nii.gz"))
            nib.save(nib.Nifti1Image(soft.astype(dtype), affine), os.path.join(root, f"q{i}.nii.gz"))
            lines.append(f"v{i},m{i}.nii.gz,p{i}.nii.gz,q{i}.nii.gz")
            p1 = soft.astype(dtype).astype(np.float32)
            rows.append((np.stack([np.float32(1) - p1, p1]), pred.astype(np.int64), np.where(ref == 255, -1, ref)))
        bad = np.full((12, 10, 6), 1.2, np.float32)
        nib.save(nib.Nifti1Image(bad, affine), os.path.join(root, "bad.nii.gz"))
        lines.append("bad,m0.nii.gz,p0.nii.gz,bad.nii.gz")
        self.check_predictions(tt.write_manifest(root, lines), rows, "probabilities are in [0, 1]")

    def test_prediction_store_keeps_the_scores_it_counts(self):
        # A single-score model with --prediction-store: probabilities at the store's precision
        # (round(p * 65535) / 65535) for every row, whether the model ran (empty store) or the store
        # answered (full store): the same figures, and numpy's. A model of three classes: the store
        # keeps its labels only, so its rows are run again and count as without the store.
        model = tt.fixture("single_logit.pt")
        manifest = tt.write_dataset(os.path.join(self.root, "two"), np.random.default_rng(6), 10, [(20, 28)], classes=2)
        store = os.path.join(self.root, "store")
        outs = []
        for run in range(2):
            out = os.path.join(self.root, f"s{run}")
            tt.tally_run(model, manifest, out, "--metrics", "calibration", "--prediction-store", store)
            outs.append(out)
        self.assertEqual(tt.read_report(outs[1])["rows_from_store"], 10)
        self.assertEqual(tt.read_report(outs[0])["calibration"], tt.read_report(outs[1])["calibration"])
        rows = []
        for probs, pred, ref in pixels_of(model, manifest):
            q = np.round(probs[1] * np.float32(65535)).astype(np.float32) / np.float32(65535)
            rows.append((np.stack([np.float32(1) - q, q]), pred, ref))
        for out in outs:
            self.check(model, out, rows)
        three = tt.fixture("three_class.pt")
        plain = os.path.join(self.root, "plain3")
        tt.tally_run(three, self.manifest, plain, "--metrics", "calibration")
        for run in range(2):
            out = os.path.join(self.root, f"t{run}")
            tt.tally_run(three, self.manifest, out, "--metrics", "calibration", "--prediction-store", store)
            self.assertEqual(tt.read_report(out)["rows_from_store"], 0)
            self.assertEqual(tt.read_report(out)["calibration"], tt.read_report(plain)["calibration"])

    def test_merge_of_two_halves_equals_the_whole(self):
        # tally merge sums the parts' exact counts: the whole set's figures, the fine histogram too.
        model = tt.fixture("three_class.pt")
        with open(self.manifest) as f:
            lines = f.read().splitlines()
        halves = []
        for k, part in enumerate((lines[1:12], lines[12:])):
            halves.append(tt.write_manifest(os.path.dirname(self.manifest), [lines[0]] + part, f"half{k}.csv"))
        c = tt.Cluster(self, os.path.join(self.root, "cm"))
        c.start_worker()
        jobs = [c.submit(model, m, "--metrics", "dice,calibration") for m in halves + [self.manifest]]
        for j in jobs:
            self.assertEqual(c.wait(j)["state"], "succeeded")
        merged, whole = os.path.join(self.root, "merged"), os.path.join(self.root, "whole")
        c.cli("merge", jobs[0], jobs[1], "--out", merged)
        c.fetch(jobs[2], whole)
        self.assertEqual(tt.read_report(merged)["calibration"], tt.read_report(whole)["calibration"])

    def test_refused_without_probabilities(self):
        py = tt.write_text(os.path.join(self.root, "m.py"), "class Model:\n    def predict(self, images):\n        return images\n")
        p = tt.tally("run", "--manifest", self.manifest, "--out", os.path.join(self.root, "x"), "--model", py,
                     "--metrics", "calibration", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--metrics calibration: Python models", p.stderr + p.stdout)
        pm, _ = tt.write_prediction_manifest(tt.fixture("three_class.pt"), self.manifest, os.path.join(self.root, "data"))
        p = tt.tally("run", "--manifest", pm, "--out", os.path.join(self.root, "x"), "--metrics", "calibration", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("has no 'probabilities' column", p.stderr + p.stdout)


if __name__ == "__main__":
    unittest.main()
