"""Warnings that catch wrong numbers (docs/reports.md "Warnings") and the exit codes that go with them,
against an independent reference (PIL + torch + numpy, tallytest.py)."""
import csv
import os
import unittest

import numpy as np
from PIL import Image

import tallytest as tt


def ignored(mask):
    return mask == 255  # The default --ignore-index.


class WrongNumbersTest(unittest.TestCase):
    def test_three_class_model_on_two_class_masks(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(7)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 12, [(24, 32), (20, 20)], classes=2)
        out = os.path.join(root, "out")
        p = tt.tally("run", "--model", tt.fixture("three_class.pt"), "--manifest", manifest, "--out", out,
                     "--metrics", "dice,iou,hd95")
        report = tt.read_report(out)
        # Reference: the images where the model predicts class 2 somewhere (no mask holds it).
        data = os.path.join(root, "data")
        predicted2, dice1, hd_defined = 0, [], 0
        with open(manifest) as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            pred, _ = tt.predict(tt.fixture("three_class.pt"), os.path.join(data, r["image"]))
            ref = np.asarray(Image.open(os.path.join(data, r["mask"])))
            valid = ~ignored(ref)
            predicted2 += bool(((pred == 2) & valid).any())
            tp, fp, fn, tn = tt.counts(pred, ref, 3)[1]
            if tp + fp + fn > 0:
                dice1.append(2 * tp / (2 * tp + fp + fn))
        self.assertGreater(predicted2, 0)
        warnings = report["warnings"]
        self.assertIn(f"class 2 is in no reference mask, but the model predicts it in {predicted2} of 12 images; "
                      "it is left out of the foreground means", " ".join(warnings))
        self.assertIn("the model has 3 classes, but the reference masks hold labels 0..1 only", warnings)
        by_class = {c["class"]: c for c in report["classes"]}
        self.assertEqual(by_class[2]["reference_images"], 0)
        self.assertEqual(by_class[2]["predicted_images"], predicted2)
        self.assertEqual([c["in_foreground_mean"] for c in report["classes"]], [False, True, False])
        # One rule for every metric: the foreground means are class 1's means.
        self.assertTrue(tt.same(report["foreground_dice_mean"], float(np.mean(dice1)), 1e-12))
        for m in ("dice", "iou", "hd95"):
            self.assertEqual(report[f"foreground_{m}_mean"], by_class[1][f"{m}_mean"])
        # Said where the user looks: the CLI's output and summary.md.
        self.assertIn("Warning: class 2 is in no reference mask", p.stdout)
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("foreground means over 1 (foreground classes present", f.read())

    def test_failed_rows_exit_3_grouped_by_reason_unless_allowed(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(8)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 10, [(16, 16)], classes=3)
        # Independent: the rows whose mask holds label 2 (beyond a 2-class model) must fail.
        data = os.path.join(root, "data")
        with open(manifest) as f:
            bad = sum(bool((np.asarray(Image.open(os.path.join(data, r["mask"]))) == 2).any()) for r in csv.DictReader(f))
        self.assertGreater(bad, 0)
        out = os.path.join(root, "out")
        p = tt.tally("run", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--out", out, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(f"{bad} of 10 rows failed", p.stderr)
        self.assertIn("Failed rows by reason:", p.stdout)
        self.assertIn(f"{bad} x mask value # at (y=#, x=#) >= number of classes #", p.stdout)
        report = tt.read_report(out)
        self.assertEqual(report["images_failed"], bad)
        self.assertEqual(report["failure_reasons"][0]["count"], bad)
        self.assertTrue(any(w.startswith(f"{bad} of 10 rows failed") for w in report["warnings"]))
        # Allowed: the same job exits 0, and the warning goes.
        fraction = str(bad / 10)
        ok = os.path.join(root, "ok")
        p = tt.tally("run", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--out", ok,
                     "--max-failed-fraction", fraction)
        self.assertEqual(p.returncode, 0)
        self.assertFalse(any("rows failed" in w for w in tt.read_report(ok)["warnings"]))
        p = tt.tally("run", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--out", ok,
                     "--max-failed-fraction", "1.5", check=False)
        self.assertEqual(p.returncode, 2)

    def test_status_of_a_cancelled_job_and_an_unreachable_server(self):
        root = tt.tmpdir(self)
        p = tt.tally("jobs", "--server", "127.0.0.1:1", check=False)
        self.assertEqual(p.returncode, 5, p.stderr)
        self.assertIn("cannot reach tallyd", p.stderr)
        c = tt.Cluster(self, os.path.join(root, "c"))
        rng = np.random.default_rng(9)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 4, [(16, 16)], classes=2)
        job = c.submit(tt.fixture("red_vs_rest.pt"), manifest)  # No worker: it stays queued.
        c.cli("cancel", job)
        self.assertEqual(c.cli("watch", job, check=False).returncode, 4)


if __name__ == "__main__":
    unittest.main()


class ProvenanceTest(unittest.TestCase):
    def test_report_records_versions_hashes_and_dice_ties(self):
        import hashlib
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(21), 30, [(12, 12)], classes=3)
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("three_class.pt"), manifest, out, "--metrics", "dice")
        report = tt.read_report(out)
        prov = report["provenance"]
        with open(tt.fixture("three_class.pt"), "rb") as f:
            self.assertEqual(prov["model_sha256"], hashlib.sha256(f.read()).hexdigest())
        with open(manifest, "rb") as f:
            self.assertEqual(prov["manifest_sha256"], hashlib.sha256(f.read()).hexdigest())
        version = tt.tally("--version").stdout
        self.assertIn(f"tally {prov['tally_version']} (git {prov['git_revision']})", version)
        # Dice 0 ties, counted by the reference from per_image.csv.
        rows = tt.read_per_image(out)
        for c in report["classes"]:
            zeros = sum(1 for r in rows if r["class"] == str(c["class"]) and r["dice"] != "" and tt.num(r["dice"]) == 0)
            self.assertEqual(c["dice_zero_images"], zeros)
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn(f"(sha256 {prov['model_sha256']})", md)
        with open(os.path.join(out, "report.html")) as f:
            self.assertIn(prov["manifest_sha256"], f.read())
