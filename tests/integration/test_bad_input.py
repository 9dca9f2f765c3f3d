"""Bad input gets a clear error naming the file, row or field, and nothing is lost: row problems
fail their row (with a reason in the report), model problems fail the job fast."""
import os
import time
import unittest

import numpy as np
from PIL import Image

import tallytest as tt


def write_rows(root, rows, header="image,mask"):
    path = os.path.join(root, "manifest.csv")
    with open(path, "w") as f:
        f.write(header + "\n" + "\n".join(rows) + "\n")
    return path


def red_image(h=8, w=8):
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2, 0] = 220  # class 1 for red_vs_rest.pt on the left half
    return img


class ManifestErrorsTest(unittest.TestCase):
    def test_missing_manifest_names_the_file(self):
        root = tt.tmpdir(self)
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), os.path.join(root, "nope.csv"), os.path.join(root, "out"),
                         check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nope.csv", p.stderr)
        self.assertIn("No such file", p.stderr)

    def test_manifest_that_is_a_directory(self):
        root = tt.tmpdir(self)
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), root, os.path.join(root, "out"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is a directory", p.stderr)

    def test_missing_required_columns(self):
        root = tt.tmpdir(self)
        for header, missing in (("image,label", "'mask'"), ("file,mask", "'image'")):
            path = write_rows(root, ["a.png,b.png"], header=header)
            p = tt.tally_run(tt.fixture("red_vs_rest.pt"), path, os.path.join(root, "out"), check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(missing, p.stderr)
            self.assertIn("manifest.csv", p.stderr)


    def test_nul_and_control_bytes_in_any_column_refuse_the_manifest_at_submit(self):
        """Found by probing: the worker opened the path cut at a NUL while the reports carried the whole
        string. Every column, through `tally run` and `tally submit`: refused, naming file, line, column."""
        root = tt.tmpdir(self)
        Image.fromarray(red_image()).save(os.path.join(root, "case_000.png"))
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(os.path.join(root, "m.png"))
        good = ["case_a", "case_000.png", "m.png", "the left half"]
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        for column, name in enumerate(["id", "image", "mask", "prompt"]):
            for bad, shown in (("\0../../etc/passwd", "a NUL byte"), ("\x1b[2J", "control character 0x1B"),
                               ("\x7f", "control character 0x7F")):
                fields = list(good)
                fields[column] += bad
                path = os.path.join(root, f"m_{name}_{ord(bad[0])}.csv")
                with open(path, "wb") as f:
                    f.write(("id,image,mask,prompt\ncase_ok,case_000.png,m.png,p\n" + ",".join(fields) + "\n").encode())
                expected = f"manifest '{path}' line 3, column {column + 1} ('{name}'): {shown}"
                p = tt.tally_run(tt.fixture("red_vs_rest.pt"), path, os.path.join(root, "out"), check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(expected, p.stderr)
                p = cluster.cli("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", path, check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(expected, p.stderr)
        self.assertIn("JOB", cluster.cli("jobs").stdout)
        self.assertNotIn("case_a", cluster.cli("jobs").stdout)  # Nothing was stored.
        self.assertEqual(len(cluster.cli("jobs").stdout.strip().splitlines()), 1)


class RowErrorsTest(unittest.TestCase):
    def test_each_bad_row_fails_alone_with_a_reason(self):
        root = tt.tmpdir(self)
        good = red_image()
        mask = np.zeros((8, 8), np.uint8)
        mask[:4] = 1
        Image.fromarray(good).save(os.path.join(root, "good.png"))
        Image.fromarray(mask).save(os.path.join(root, "good_mask.png"))
        with open(os.path.join(root, "good.png"), "rb") as f:
            png = f.read()
        with open(os.path.join(root, "truncated.png"), "wb") as f:
            f.write(png[: len(png) // 2])
        Image.fromarray(good).save(os.path.join(root, "good.jpg"), quality=95)
        with open(os.path.join(root, "good.jpg"), "rb") as f:
            jpg = f.read()
        with open(os.path.join(root, "truncated.jpg"), "wb") as f:
            f.write(jpg[: len(jpg) // 2])
        with open(os.path.join(root, "text.png"), "w") as f:
            f.write("not an image at all")
        Image.fromarray(np.zeros((6, 8), np.uint8)).save(os.path.join(root, "small_mask.png"))
        bad_value = mask.copy()
        bad_value[2, 3] = 9
        Image.fromarray(bad_value).save(os.path.join(root, "value9_mask.png"))
        Image.fromarray(red_image()).save(os.path.join(root, "rgb_mask.png"))
        rows = [
            "good.png,good_mask.png",          # 0 ok
            "missing.png,good_mask.png",       # 1 image file missing
            "good.png,missing_mask.png",       # 2 mask file missing
            "truncated.png,good_mask.png",     # 3 corrupt PNG
            "truncated.jpg,good_mask.png",     # 4 corrupt JPEG
            "text.png,good_mask.png",          # 5 not an image
            "good.png,small_mask.png",         # 6 image 8x8, mask 6x8
            "good.png,value9_mask.png",        # 7 mask value >= number of classes
            "good.png,rgb_mask.png",           # 8 RGB mask
            "good.png",                        # 9 malformed row
            "good.jpg,good_mask.png",          # 10 ok (JPEG)
        ]
        manifest = write_rows(root, rows)
        out = os.path.join(root, "out")
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), manifest, out, "--workers", "2", "--shard-size", "3")
        self.assertIn("9 failed", p.stdout)
        report = tt.read_report(out)
        self.assertEqual(report["images_total"], 11)
        self.assertEqual(report["images_evaluated"], 2)
        self.assertEqual(report["images_failed"], 9)
        self.assertTrue(report["complete"])
        reasons = {f["index"]: f["reason"] for f in report["failures"]}
        self.assertEqual(sorted(reasons), [1, 2, 3, 4, 5, 6, 7, 8, 9])
        self.assertIn("missing.png", reasons[1])
        self.assertIn("No such file", reasons[1])
        self.assertIn("missing_mask.png", reasons[2])
        self.assertIn("truncated.png", reasons[3])
        self.assertIn("truncated.jpg", reasons[4])
        self.assertIn("is not an image Tally reads (unrecognised file signature", reasons[5])
        self.assertIn("8x8", reasons[6])
        self.assertIn("6x8", reasons[6])
        self.assertIn("mask value 9 at (y=2, x=3) >= number of classes 2", reasons[7])
        self.assertIn("single-channel", reasons[8])
        self.assertIn("line 11", reasons[9])
        self.assertEqual({f["image"] for f in report["failures"] if f["index"] == 3}, {"truncated.png"})
        # Failed rows are not in per_image.csv; the good ones are, with the right counts.
        rows_out = tt.read_per_image(out)
        self.assertEqual(sorted({int(r["index"]) for r in rows_out}), [0, 10])
        r0 = [r for r in rows_out if r["index"] == "0" and r["class"] == "1"][0]
        # pred 1 on x < 4, ref 1 on y < 4: TP 16, FP 16, FN 16, TN 16.
        self.assertEqual((r0["tp"], r0["fp"], r0["fn"], r0["tn"]), ("16", "16", "16", "16"))

    def test_palette_and_16_bit_masks_are_class_indices(self):
        root = tt.tmpdir(self)
        Image.fromarray(red_image()).save(os.path.join(root, "img.png"))
        mask = np.zeros((8, 8), np.uint8)
        mask[:4] = 1
        pal = Image.fromarray(mask, mode="P")
        pal.putpalette([0, 0, 0, 128, 0, 0] + [0] * 762)  # VOC-style colours, indices are labels
        pal.save(os.path.join(root, "pal.png"))
        Image.fromarray(mask.astype(np.uint16)).save(os.path.join(root, "m16.png"))
        manifest = write_rows(root, ["img.png,pal.png", "img.png,m16.png"])
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("red_vs_rest.pt"), manifest, out)
        rows = [r for r in tt.read_per_image(out) if r["class"] == "1"]
        self.assertEqual(len(rows), 2)
        for r in rows:
            self.assertEqual((r["tp"], r["fp"], r["fn"], r["tn"]), ("16", "16", "16", "16"))


class MaskConventionsTest(unittest.TestCase):
    """A binary mask stored as 0/255 (a very common format) loses its whole foreground to the default
    ignore value 255; Tally warns and --label-map / --ignore-index fix it."""

    def setUp(self):
        self.root = tt.tmpdir(self)
        rng = np.random.default_rng(4)
        rows = []
        self.masks = []
        for i in range(6):
            img = np.zeros((12, 10, 3), np.uint8)
            img[:, : 3 + i % 5, 0] = 220  # red_vs_rest.pt predicts class 1 on these columns.
            mask = np.where(rng.random((12, 10)) < 0.4, 255, 0).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(self.root, f"i{i}.png"))
            Image.fromarray(mask).save(os.path.join(self.root, f"m{i}.png"))
            rows.append(f"i{i}.png,m{i}.png")
            self.masks.append(((img[..., 0] > 127).astype(np.int64), mask))
        self.manifest = write_rows(self.root, rows)

    def test_binary_255_masks_warn_and_label_map_evaluates_them(self):
        out = os.path.join(self.root, "default")
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), self.manifest, out)
        report = tt.read_report(out)
        # The cause first, then what it does to the numbers.
        self.assertIn("every reference mask holds only 0 and the ignore value 255", report["warnings"][0])
        self.assertTrue(any(w.startswith("class 1 is in no reference mask, but the model predicts it in")
                            for w in report["warnings"][1:]), report["warnings"])
        self.assertIn("--label-map 0:0,255:1", report["warnings"][0])
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("**Warning**: every reference mask holds only 0", f.read())
        with open(os.path.join(out, ".tally", "tallyd.log")) as f:
            self.assertEqual(f.read().count("warning: every reference mask"), 1)
        self.assertEqual(report["classes"][1]["tp"] + report["classes"][1]["fn"], 0)  # Foreground lost.

        mapped = os.path.join(self.root, "mapped")
        tt.tally_run(tt.fixture("red_vs_rest.pt"), self.manifest, mapped, "--label-map", "0:0,255:1")
        report = tt.read_report(mapped)
        self.assertEqual(report["warnings"], [])
        self.assertEqual(report["label_map"], {"0": 0, "255": 1})
        rows = {(int(r["index"]), int(r["class"])): r for r in tt.read_per_image(mapped)}
        for i, (pred, mask) in enumerate(self.masks):
            ref = (mask == 255).astype(np.int64)
            for c, (tp, fp, fn, tn) in enumerate(tt.counts(pred, ref, 2)):
                r = rows[(i, c)]
                self.assertEqual((int(r["tp"]), int(r["fp"]), int(r["fn"]), int(r["tn"])), (tp, fp, fn, tn))

    def test_ignore_index_none_and_other_values(self):
        out = os.path.join(self.root, "none")
        tt.tally_run(tt.fixture("red_vs_rest.pt"), self.manifest, out, "--ignore-index", "none")
        report = tt.read_report(out)
        self.assertIsNone(report["ignore_index"])
        self.assertEqual(report["images_failed"], 6)  # 255 is a label now, >= 2 classes.
        self.assertIn("mask value 255", report["failures"][0]["reason"])
        zero = os.path.join(self.root, "zero")
        tt.tally_run(tt.fixture("red_vs_rest.pt"), self.manifest, zero, "--ignore-index", "0",
                     "--label-map", "255:1")
        rows = {(int(r["index"]), int(r["class"])): r for r in tt.read_per_image(zero)}
        for i, (pred, mask) in enumerate(self.masks):
            valid = mask == 255  # Background pixels (0) are ignored: only the foreground counts.
            tp = int(np.sum((pred == 1) & valid))
            fn = int(np.sum((pred == 0) & valid))
            r = rows[(i, 1)]
            self.assertEqual((int(r["tp"]), int(r["fp"]), int(r["fn"]), int(r["tn"])), (tp, 0, fn, 0))
        bad = tt.tally_run(tt.fixture("red_vs_rest.pt"), self.manifest, zero, "--label-map", "255-1", check=False)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--label-map", bad.stderr)


class ModelErrorsTest(unittest.TestCase):
    def setUp(self):
        self.root = tt.tmpdir(self)
        Image.fromarray(red_image()).save(os.path.join(self.root, "img.png"))
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(os.path.join(self.root, "mask.png"))
        self.manifest = write_rows(self.root, ["img.png,mask.png"] * 6)

    def run_model(self, model):
        start = time.time()
        p = tt.tally_run(model, self.manifest, os.path.join(self.root, "out"), "--workers", "2", check=False)
        return p, time.time() - start

    def test_missing_model(self):
        p, _ = self.run_model(os.path.join(self.root, "no_model.pt"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("no_model.pt", p.stderr)
        self.assertIn("does not exist", p.stderr)

    def test_not_torchscript_fails_the_job_fast(self):
        p, seconds = self.run_model(tt.fixture("not_torchscript.pt"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("not_torchscript.pt", p.stderr)
        self.assertIn("TorchScript", p.stderr)
        self.assertIn("failed", p.stderr)

    def test_wrong_output_rank_names_model_and_shape(self):
        p, _ = self.run_model(tt.fixture("bad_rank.pt"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("bad_rank.pt", p.stderr)
        self.assertIn("returned logits of shape [", p.stderr)
        self.assertIn("expected [N, C, H, W]", p.stderr)
        # The job says it did not account for the rows.
        report = tt.read_report(os.path.join(self.root, "out"))
        self.assertEqual(report["state"], "failed")
        self.assertFalse(report["complete"])

    def test_wrong_output_batch(self):
        p, _ = self.run_model(tt.fixture("bad_batch.pt"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("bad_batch.pt", p.stderr)
        self.assertIn("N = ", p.stderr)


class FlagErrorsTest(unittest.TestCase):
    def test_bad_flags_are_named(self):
        root = tt.tmpdir(self)
        cases = [(("--metrics", "dice,volume"), "volume"), (("--input-size", "512"), "--input-size"),
                 (("--batch-size", "zero"), "--batch-size"), (("--precision", "fp8"), "--precision"),
                 (("--mean", "0.5,0.5"), "--mean")]
        for extra, needle in cases:
            p = tt.tally_run(tt.fixture("red_vs_rest.pt"), "m.csv", os.path.join(root, "o"), *extra, check=False)
            self.assertEqual(p.returncode, 2, extra)
            self.assertIn(needle, p.stderr, extra)


if __name__ == "__main__":
    unittest.main()
