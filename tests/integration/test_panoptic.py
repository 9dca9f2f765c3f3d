"""Panoptic jobs end to end (docs/instances.md "Panoptic quality"): `tally run --coco-panoptic REF.json
--panoptic-dir DIR --panoptic-predictions PRED.json` on random panoptic PNGs (things and stuff,
crowd regions, void, segments split, merged, shifted and relabelled, `area` fields unlike the pixel
count) give panopticapi's PQ, SQ and RQ (panoptic_reference.py, written from its pq_compute) to the
bit, overall, for things, for stuff and per category, with 1 and 3 workers; a broken prediction
fails only its image, naming it.
"""
import json
import os
import unittest

import numpy as np
from PIL import Image

import panoptic_reference as ref
import tallytest as tt

H, W = 60, 80
THINGS, STUFF = [1, 2, 3], [10, 11]


def random_image(rng):
    gt = np.zeros((H, W), np.int64)
    segs = []
    used = set()

    def new_id():
        while True:
            i = int(rng.integers(1, 1 << 24))
            if i not in used:
                used.add(i)
                return i

    cut = int(rng.integers(10, 50))
    for band, cat in ((slice(0, cut), STUFF[0]), (slice(cut, H), STUFF[1])):
        if rng.random() < 0.9:
            i = new_id()
            gt[band] = i
            segs.append({"id": i, "category_id": cat, "iscrowd": 0})
    for _ in range(int(rng.integers(0, 6))):
        y, x = int(rng.integers(0, H - 4)), int(rng.integers(0, W - 4))
        h, w = int(rng.integers(3, 25)), int(rng.integers(3, 30))
        i = new_id()
        gt[y:y + h, x:x + w] = i
        segs.append({"id": i, "category_id": int(rng.choice(THINGS)), "iscrowd": int(rng.random() < 0.15)})
    if rng.random() < 0.7:  # Void.
        y, x = int(rng.integers(0, H - 5)), int(rng.integers(0, W - 5))
        gt[y:y + int(rng.integers(2, 15)), x:x + int(rng.integers(2, 20))] = 0
    present = set(np.unique(gt).tolist())
    segs = [s for s in segs if s["id"] in present]
    for s in segs:
        area = int((gt == s["id"]).sum())
        s["area"] = area if rng.random() < 0.8 else area + int(rng.integers(-2, 5))
    # The prediction: shifted, relabelled, some categories wrong, a few new segments, some void.
    pred = np.roll(gt, (int(rng.integers(-2, 3)), int(rng.integers(-2, 3))), axis=(0, 1))
    relabel = {0: 0}
    pred_segs = []
    for s in segs:
        j = int(rng.integers(1, 1 << 24))
        relabel[s["id"]] = j
        cat = s["category_id"] if rng.random() < 0.85 else int(rng.choice(THINGS + STUFF))
        pred_segs.append({"id": j, "category_id": cat})
    pred = np.vectorize(lambda v: relabel.get(v, 0))(pred) if pred.size else pred
    for _ in range(int(rng.integers(0, 3))):
        y, x = int(rng.integers(0, H - 4)), int(rng.integers(0, W - 4))
        j = int(rng.integers(1, 1 << 24))
        pred[y:y + int(rng.integers(2, 20)), x:x + int(rng.integers(2, 20))] = j
        pred_segs.append({"id": j, "category_id": int(rng.choice(THINGS + STUFF))})
    if rng.random() < 0.3:
        pred[: int(rng.integers(1, 10)), :] = 0
    present = set(np.unique(pred).tolist())
    pred_segs = [s for s in pred_segs if s["id"] in present]
    return gt, segs, pred, pred_segs


def write_png(path, ids):
    rgb = np.stack([ids % 256, (ids // 256) % 256, ids // 65536], -1).astype(np.uint8)
    Image.fromarray(rgb).save(path)


def write_set(root, rng, n, categories):
    for d in ("gt", "pred"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    gt_json = {"images": [], "categories": [{"id": c, "name": f"c{c}", "isthing": int(t)} for c, t in categories],
               "annotations": []}
    pred_json = {"annotations": []}
    images = []
    for k in range(n):
        image_id = 100 + k
        gt, segs, pred, pred_segs = random_image(rng)
        write_png(os.path.join(root, "gt", f"{image_id}.png"), gt)
        write_png(os.path.join(root, "pred", f"p{image_id}.png"), pred)
        gt_json["images"].append({"id": image_id, "file_name": f"{image_id}.jpg", "height": H, "width": W})
        gt_json["annotations"].append({"image_id": image_id, "file_name": f"{image_id}.png",
                                       "segments_info": [dict(s, bbox=[0, 0, 1, 1]) for s in segs]})
        pred_json["annotations"].append({"image_id": image_id, "file_name": f"p{image_id}.png", "segments_info": pred_segs})
        images.append((gt, segs, pred, pred_segs))
    with open(os.path.join(root, "gt.json"), "w") as f:
        json.dump(gt_json, f)
    with open(os.path.join(root, "pred.json"), "w") as f:
        json.dump(pred_json, f)
    return images


class PanopticJobTest(unittest.TestCase):
    def run_job(self, root, out, *extra):
        return tt.tally("run", "--coco-panoptic", os.path.join(root, "gt.json"), "--panoptic-dir",
                        os.path.join(root, "gt"), "--panoptic-predictions", os.path.join(root, "pred.json"),
                        "--panoptic-predictions-dir", os.path.join(root, "pred"), "--out", out,
                        "--max-failed-fraction", "1", *extra)

    def test_random_sets_equal_panopticapi_for_1_and_3_workers(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(77)
        for case in range(4):
            folder = os.path.join(root, str(case))
            categories = [(c, c in THINGS) for c in rng.permutation(THINGS + STUFF).tolist()]
            images = write_set(folder, rng, 12, categories)
            want, want_per = ref.pq_compute(images, categories)
            for workers in (1, 3):
                out = os.path.join(folder, f"out{workers}")
                self.run_job(folder, out, "--workers", workers, "--shard-size", "2")
                p = tt.read_report(out)["panoptic"]
                for name in ("all", "things", "stuff"):
                    got = (p[name]["pq"], p[name]["sq"], p[name]["rq"], p[name]["n"])
                    self.assertEqual(got, want[name], (case, workers, name))
                self.assertEqual([c["id"] for c in p["categories"]], [c for c, _ in categories])
                for c in p["categories"]:
                    self.assertEqual((c["pq"], c["sq"], c["rq"], c["tp"], c["fp"], c["fn"]), want_per[c["id"]],
                                     (case, c["id"]))
            self.assertTrue(tt.same_files(os.path.join(folder, "out1"), os.path.join(folder, "out3")))

    def test_a_broken_prediction_fails_only_its_image(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(78)
        categories = [(c, c in THINGS) for c in THINGS + STUFF]
        write_set(root, rng, 5, categories)
        with open(os.path.join(root, "pred.json")) as f:
            pred = json.load(f)
        dropped = pred["annotations"][1]["segments_info"].pop()  # In the PNG, not in the JSON.
        missing = pred["annotations"].pop(3)["image_id"]
        with open(os.path.join(root, "pred.json"), "w") as f:
            json.dump(pred, f)
        out = os.path.join(root, "out")
        self.run_job(root, out)
        report = tt.read_report(out)
        failed = {int(f["id"]): f["reason"] for f in report["failures"]}
        self.assertEqual(set(failed), {101, missing})
        self.assertIn(str(dropped["id"]), failed[101])
        self.assertIn(f"no prediction for image {missing}", failed[missing])
        self.assertEqual(report["images_evaluated"], 3)
        self.assertEqual(report["panoptic"]["images"], 3)
