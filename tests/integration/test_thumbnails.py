"""Thumbnails of the worst images in report.html and --save-predictions.

The saved label maps are checked against per_image.csv's counts (recounted here with numpy) and
against the demo model run by torch; the worst rows against a ranking of per_image.csv; each
thumbnail's overlay against outcomes computed here from the saved prediction and the mask. The
same thumbnails must come out whatever the number of workers (the worker renders a row when it
enters its shard's running worst, the coordinator keeps the job's worst: common/formats/thumbnail.h).
"""
import base64
import csv
import io
import math
import os
import re
import subprocess
import unittest

import numpy as np
from PIL import Image

import tallytest as tt

DEMO = os.path.join(tt.SRC, "examples", "demo")
MODEL = os.path.join(DEMO, "model.pt")
MANIFEST = os.path.join(DEMO, "manifest.csv")
FIGURE = re.compile(r'<figure data-index="(\d+)" data-class="(\d+)"><img src="data:image/jpeg;base64,([A-Za-z0-9+/=]+)"')


def figures(out):
    with open(os.path.join(out, "report.html")) as f:
        html = f.read()
    return {(int(c), int(i)): base64.b64decode(b) for i, c, b in FIGURE.findall(html)}


def demo_rows():
    with open(MANIFEST) as f:
        return list(csv.DictReader(f))


def load(path):
    return np.asarray(Image.open(path)).astype(np.int64)


class ThumbnailTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-thumbs-")
        cls.out = os.path.join(cls.root, "one")
        cls.preds = os.path.join(cls.root, "preds")
        # Six shards of 8 rows: thumbnails come from several shards and are pruned across them.
        tt.tally_run(MODEL, MANIFEST, cls.out, "--workers", "1", "--batch-size", "4", "--shard-size", "8",
                     "--save-predictions", cls.preds)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.root, True)

    def test_saved_predictions_are_what_was_scored(self):
        rows = demo_rows()
        self.assertEqual(sorted(os.listdir(self.preds)), sorted(r["id"] + ".png" for r in rows))
        per_image = tt.read_per_image(self.out)
        by_row = {}
        for r in per_image:
            by_row.setdefault(r["id"], {})[int(r["class"])] = (int(r["tp"]), int(r["fp"]), int(r["fn"]), int(r["tn"]))
        agree = []
        for r in rows:
            img = Image.open(os.path.join(self.preds, r["id"] + ".png"))
            self.assertEqual(img.mode, "L")  # 8-bit: 3 classes.
            pred = np.asarray(img).astype(np.int64)
            ref = load(os.path.join(DEMO, r["mask"]))
            self.assertEqual(pred.shape, ref.shape)
            got = tt.counts(pred, ref, 3)
            self.assertEqual([by_row[r["id"]][c] for c in range(3)], got, r["id"])
            torch_pred, _ = tt.predict(MODEL, os.path.join(DEMO, r["image"]))
            agree.append(np.mean(torch_pred == pred))
        self.assertGreater(min(agree), 0.999)

    def test_thumbnails_are_the_worst_rows_with_their_outcomes(self):
        report = tt.read_report(self.out)
        self.assertEqual(report["thumbnails"], 5)
        per_image = tt.read_per_image(self.out)
        figs = figures(self.out)
        shown = set()
        for cls in report["classes"]:
            c = cls["class"]
            ranked = sorted((float(r["dice"]), int(r["index"])) for r in per_image
                            if int(r["class"]) == c and not math.isnan(float(r["dice"])))[:10]
            self.assertEqual([(w["dice"], w["index"]) for w in cls["worst"]], ranked, f"class {c}")
            for k, w in enumerate(cls["worst"]):
                self.assertEqual(w["id"], f"case_{w['index']:03d}")
                self.assertEqual(w["thumbnail"], cls["foreground"] and k < 5, f"class {c} row {w['index']}")
                if w["thumbnail"]:
                    shown.add((c, w["index"]))
        self.assertEqual(set(figs), shown)
        self.assertEqual(len(shown), 10)  # Classes 1 and 2, five each.
        rows = demo_rows()
        colours = {1: "green", 2: "red", 3: "blue"}
        for (c, index), jpeg in figs.items():
            thumb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).astype(np.int64)
            ref = load(os.path.join(DEMO, rows[index]["mask"]))
            pred = load(os.path.join(self.preds, rows[index]["id"] + ".png"))
            h, w = ref.shape
            self.assertEqual(thumb.shape, (h * 128 // max(h, w), 2 * (w * 128 // max(h, w)) + 4, 3))
            # Demo images are 96x128: panels at full size, the overlay on the right.
            right = thumb[:, w + 4:]
            outcome = np.zeros(ref.shape, np.int64)
            valid = ref != 255
            outcome[(pred == c) & (ref == c) & valid] = 1
            outcome[(pred == c) & (ref != c) & valid] = 2
            outcome[(pred != c) & (ref == c) & valid] = 3
            checked = 0
            for o, name in colours.items():
                # Pixels inside a 3x3 block of one outcome (JPEG blurs edges).
                same = np.ones(ref.shape, bool)
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        same &= np.roll(np.roll(outcome, dy, 0), dx, 1) == o
                same[[0, -1], :] = False
                same[:, [0, -1]] = False
                ys, xs = np.nonzero(same)
                if len(ys) == 0:
                    continue
                px = right[ys, xs]
                channel = {"red": 0, "green": 1, "blue": 2}[name]
                others = [k for k in range(3) if k != channel]
                dominant = np.all(px[:, [channel]] > px[:, others] + 30, axis=1)
                self.assertGreater(np.mean(dominant), 0.95, f"row {index} class {c}: {name}")
                checked += len(ys)
            if checked == 0:
                # Only scattered pixels (a few false positives): each still shows its colour.
                ys, xs = np.nonzero(outcome > 0)
                self.assertGreater(len(ys), 0)
                for y, x, o in zip(ys, xs, outcome[ys, xs]):
                    channel = {1: 1, 2: 0, 3: 2}[int(o)]
                    px = right[y, x]
                    self.assertGreater(px[channel], max(px[k] for k in range(3) if k != channel) + 20,
                                       f"row {index} class {c} pixel ({y}, {x})")

    def test_the_same_thumbnails_whatever_the_number_of_workers(self):
        out = os.path.join(tt.tmpdir(self), "three")
        tt.tally_run(MODEL, MANIFEST, out, "--workers", "3", "--batch-size", "4", "--shard-size", "8")
        self.assertTrue(tt.same_files(self.out, out))
        self.assertEqual(figures(self.out), figures(out))

    def test_thumbnail_count_and_none(self):
        root = tt.tmpdir(self)
        tt.tally_run(MODEL, MANIFEST, os.path.join(root, "none"), "--thumbnails", "0")
        self.assertEqual(figures(os.path.join(root, "none")), {})
        report = tt.read_report(os.path.join(root, "none"))
        self.assertFalse(any(w["thumbnail"] for c in report["classes"] for w in c["worst"]))
        tt.tally_run(MODEL, MANIFEST, os.path.join(root, "ten"), "--thumbnails", "10")
        self.assertEqual(len(figures(os.path.join(root, "ten"))), 20)
        p = tt.tally_run(MODEL, MANIFEST, os.path.join(root, "bad"), "--thumbnails", "11", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--thumbnails: 11 is not in 0..10", p.stderr)

    def test_prediction_jobs_score_the_saved_predictions_and_show_thumbnails(self):
        root = tt.tmpdir(self)
        manifest = os.path.join(root, "pairs.csv")
        with open(manifest, "w") as f:
            f.write("id,image,mask,prediction\n")
            for r in demo_rows():
                f.write(f"{r['id']},{os.path.join(DEMO, r['image'])},{os.path.join(DEMO, r['mask'])},"
                        f"{os.path.join(self.preds, r['id'] + '.png')}\n")
        out = os.path.join(root, "scored")
        tt.tally("run", "--manifest", manifest, "--out", out, "--num-classes", "3", "--workers", "2",
                 "--shard-size", "8")
        model_rows = tt.read_per_image(self.out)
        scored_rows = tt.read_per_image(out)
        key = lambda r: (r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["tn"])
        self.assertEqual([key(r) for r in scored_rows], [key(r) for r in model_rows])
        self.assertEqual(set(figures(out)), set(figures(self.out)))
        p = tt.tally("run", "--manifest", manifest, "--out", os.path.join(root, "x"), "--save-predictions",
                     os.path.join(root, "p"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--save-predictions is for jobs with a model", p.stderr)

    def test_python_models_save_the_same_predictions(self):
        preds = os.path.join(tt.tmpdir(self), "py-preds")
        out = os.path.join(os.path.dirname(preds), "py")
        tt.tally_run(os.path.join(tt.SRC, "examples", "python-model", "colour_segmenter.py"), MANIFEST, out,
                     "--python", "/usr/bin/python3", "--workers", "2", "--save-predictions", preds)
        for name in os.listdir(self.preds):
            self.assertTrue(np.array_equal(load(os.path.join(preds, name)), load(os.path.join(self.preds, name))),
                            name)

    def test_an_unwritable_folder_fails_the_rows_with_the_reason(self):
        root = tt.tmpdir(self)
        blocker = os.path.join(root, "file")
        open(blocker, "w").close()
        p = tt.tally_run(MODEL, MANIFEST, os.path.join(root, "out"), "--save-predictions",
                         os.path.join(blocker, "preds"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--save-predictions", p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
