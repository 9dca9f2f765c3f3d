"""COCO mask AP: Tally's COCOeval (tally-coco-eval, metrics/coco_eval.h) against an independent numpy
COCOeval (coco_reference.py) on random cases that hold what makes COCOeval subtle: crowd regions,
ties in scores, duplicate detections, detections of a category the image lacks, images empty on
either side, areas on the range boundaries, `area` fields unlike the mask's pixel count, more than
100 detections on an image, RLE written compressed and uncompressed. Every one of the 12 numbers and
every category's AP must be equal, to the bit.
"""
import json
import os
import subprocess
import unittest

import numpy as np

import coco_reference as ref
import tallytest as tt

H, W = 100, 104


def blob(rng, h=H, w=W):
    """A random rectangle, sometimes with a hole or a notch, sometimes exactly 32x32 or 96x96."""
    m = np.zeros((h, w), bool)
    kind = rng.integers(0, 10)
    if kind == 0:
        y, x = rng.integers(0, h - 32 + 1), rng.integers(0, w - 32 + 1)
        m[y:y + 32, x:x + 32] = True  # 1024 pixels: the small/medium boundary.
        return m
    if kind == 1:
        y, x = rng.integers(0, h - 96 + 1), rng.integers(0, w - 96 + 1)
        m[y:y + 96, x:x + 96] = True  # 9216 pixels: the medium/large boundary.
        return m
    y0, x0 = rng.integers(0, h - 2), rng.integers(0, w - 2)
    y1, x1 = y0 + rng.integers(1, min(60, h - y0)), x0 + rng.integers(1, min(60, w - x0))
    m[y0:y1 + 1, x0:x1 + 1] = True
    if kind == 2 and y1 - y0 > 4 and x1 - x0 > 4:
        m[y0 + 2:y1 - 1, x0 + 2:x1 - 1] = False
    return m


def perturb(rng, m):
    """A detection near a reference: shifted, grown or shrunk."""
    out = np.roll(m, (int(rng.integers(-3, 4)), int(rng.integers(-3, 4))), axis=(0, 1))
    if rng.random() < 0.3:
        out = out | np.roll(out, 1, axis=0)
    if rng.random() < 0.3:
        out = out & np.roll(out, 1, axis=1)
    return out


def segmentation(rng, m):
    counts = ref.rle_counts(m)
    if rng.random() < 0.5:
        return {"counts": counts, "size": [H, W]}
    return {"counts": ref.rle_string(counts), "size": [H, W]}


def random_case(rng):
    n_images = int(rng.integers(1, 6))
    cats = [1, 2, 3][:int(rng.integers(1, 4))] + [7]  # 7: listed, never annotated.
    images, gts, dts = [], [], []
    scores = [0.9, 0.8, 0.5, 0.3] if rng.random() < 0.5 else None  # Ties.
    for i in range(n_images):
        image_id = int(rng.integers(1, 10**6))
        images.append(image_id)
        for cat in cats[:-1]:
            for _ in range(int(rng.integers(0, 4))):
                m = blob(rng)
                if not m.any():
                    continue
                pixels = int(m.sum())
                area = rng.choice([pixels, pixels, 1024, 9216, pixels + 0.5, float(rng.integers(1, 20000))])
                g = {"id": len(gts) + 1, "image_id": image_id, "category_id": cat, "mask": m, "area": float(area),
                     "iscrowd": int(rng.random() < 0.15)}
                gts.append(g)
                for _ in range(int(rng.integers(0, 3))):  # Matches, duplicates among them.
                    d = perturb(rng, m)
                    dts.append({"image_id": image_id, "category_id": cat, "mask": d,
                                "score": float(rng.choice(scores) if scores else rng.random())})
            for _ in range(int(rng.integers(0, 3))):  # False positives, some of another category.
                d = blob(rng)
                dts.append({"image_id": image_id, "category_id": int(rng.choice(cats)), "mask": d,
                            "score": float(rng.choice(scores) if scores else rng.random())})
        if rng.random() < 0.05:  # More than maxDets on one image.
            for _ in range(105):
                dts.append({"image_id": image_id, "category_id": cats[0], "mask": blob(rng),
                            "score": float(rng.random())})
    dts = [d for d in dts if d["mask"].any()]
    for k, d in enumerate(dts):
        d["id"] = k + 1
        d["area"] = float(d["mask"].sum())
    return images, cats, gts, dts


def write_case(folder, rng, images, cats, gts, dts):
    os.makedirs(folder, exist_ok=True)
    gt = {"images": [{"id": i, "file_name": f"{i}.png", "height": H, "width": W} for i in images],
          "categories": [{"id": c, "name": f"c{c}"} for c in cats],
          "annotations": [{"id": g["id"], "image_id": g["image_id"], "category_id": g["category_id"],
                           "segmentation": segmentation(rng, g["mask"]), "area": g["area"], "iscrowd": g["iscrowd"]}
                          for g in gts]}
    results = [{"image_id": d["image_id"], "category_id": d["category_id"], "score": d["score"],
                "segmentation": segmentation(rng, d["mask"])} for d in dts]
    with open(os.path.join(folder, "gt.json"), "w") as f:
        json.dump(gt, f)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(results, f)


class CocoEvalTest(unittest.TestCase):
    def tally_eval(self, folder, threads=1):
        out = os.path.join(folder, "stats.json")
        p = subprocess.run([os.path.join(tt.BIN, "tally-coco-eval"), "--gt", os.path.join(folder, "gt.json"),
                            "--results", os.path.join(folder, "results.json"), "--threads", str(threads),
                            "--out", out], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            return json.load(f)

    def test_random_cases_equal_an_independent_cocoeval_to_the_bit(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(30)
        checked = nontrivial = 0
        for case in range(200):
            images, cats, gts, dts = random_case(rng)
            folder = os.path.join(root, str(case))
            write_case(folder, rng, images, cats, gts, dts)
            want_stats, want_ap = ref.coco_eval(images, cats, gts, dts)
            got = self.tally_eval(folder, threads=1 + case % 3)
            self.assertEqual(got["stats"], want_stats, (case, got["stats"], want_stats))
            self.assertEqual({int(k): v for k, v in got["category_ap"].items()}, want_ap, case)
            checked += 1
            nontrivial += any(0 < s < 1 for s in want_stats)
        self.assertEqual(checked, 200)
        self.assertGreater(nontrivial, 150)  # The cases exercise partial matches, not only 0, 1 and -1.

    def test_rle_strings_round_trip_through_tally(self):
        # Masks written as compressed strings and as counts give the same numbers.
        root = tt.tmpdir(self)
        rng = np.random.default_rng(31)
        images, cats, gts, dts = random_case(rng)
        a, b = os.path.join(root, "a"), os.path.join(root, "b")
        write_case(a, np.random.default_rng(1), images, cats, gts, dts)
        write_case(b, np.random.default_rng(2), images, cats, gts, dts)
        self.assertEqual(self.tally_eval(a)["stats"], self.tally_eval(b)["stats"])

    def test_malformed_annotations_are_named(self):
        root = tt.tmpdir(self)
        os.makedirs(root, exist_ok=True)
        gt = {"images": [{"id": 1, "file_name": "1.png", "height": 4, "width": 5}],
              "categories": [{"id": 1, "name": "a"}],
              "annotations": [{"id": 9, "image_id": 1, "category_id": 1, "area": 3, "iscrowd": 0,
                               "segmentation": {"counts": [3, 2], "size": [4, 5]}}]}
        cases = {
            "RLE counts sum to 5, not height x width = 4 x 5 = 20": {"counts": [3, 2], "size": [4, 5]},
            "polygon 0: a polygon has an odd number of coordinates (7)": [[1, 1, 3, 1, 3, 3, 1]],
            "segmentation size 4 x 4 is not the image's 4 x 5": {"counts": [16], "size": [4, 4]},
            "has a character outside '0'..'o'": {"counts": "3~", "size": [4, 5]},
        }
        for want, seg in cases.items():
            gt["annotations"][0]["segmentation"] = seg
            with open(os.path.join(root, "gt.json"), "w") as f:
                json.dump(gt, f)
            with open(os.path.join(root, "results.json"), "w") as f:
                json.dump([], f)
            p = subprocess.run([os.path.join(tt.BIN, "tally-coco-eval"), "--gt", os.path.join(root, "gt.json"),
                                "--results", os.path.join(root, "results.json")], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("annotation 9", p.stderr)
            self.assertIn(want, p.stderr)


if __name__ == "__main__":
    unittest.main()
