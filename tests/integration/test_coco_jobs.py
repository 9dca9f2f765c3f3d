"""COCO instance jobs end to end (docs/instances.md "Instances"): `tally run|submit --coco FILE --images DIR`
with detections from a results file (--coco-results) or from a Python model returning
torchvision's detection dicts. Every one of COCOeval's 12 numbers and every category's AP equal an
independent numpy COCOeval (coco_reference.py) to the bit, for 1 and 3 workers, after a worker is
SIGKILLed mid-job, and whether the detections come from a file or a model; per_image.csv's instance
counts at IoU 0.5 equal the reference's matching; bad annotations fail only their image's row,
naming them. Referring rows (coco_ann_ids) give the counts of the same masks written as PNGs.
"""
import csv
import json
import os
import signal
import time
import unittest

import numpy as np
from PIL import Image

import coco_reference as ref
import tallytest as tt
import test_coco as tc

PY = "/usr/bin/python3"
STATS = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"]


def merged_case(rng, parts):
    """Several random cases as one set (image and annotation ids kept distinct)."""
    images, cats, gts, dts = [], set(), [], []
    for p in range(parts):
        i, c, g, d = tc.random_case(rng)
        base = (p + 1) * 10**6
        for x in g + d:
            x["image_id"] += base
        images += [x + base for x in i]
        cats |= set(c)
        for x in g:
            x["id"] = len(gts) + 1
            gts.append(x)
        for x in d:
            x["id"] = len(dts) + 1
            dts.append(x)
    return images, sorted(cats), gts, dts


def write_images(folder, images):
    rng = np.random.default_rng(0)
    for i in images:
        Image.fromarray(rng.integers(0, 255, (tc.H, tc.W, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i}.png"))


def write_detections(path, dts):
    """The replay model's file: each image's detections as uncompressed counts, in file order."""
    by = {}
    for d in dts:
        by.setdefault(str(d["image_id"]), []).append(
            {"counts": ref.rle_counts(d["mask"]), "score": d["score"], "category_id": d["category_id"]})
    with open(path, "w") as f:
        json.dump(by, f)


def stats_of(out):
    inst = tt.read_report(out)["instances"]
    return [inst["stats"][k] for k in STATS], {c["id"]: c["ap"] for c in inst["categories"]}


def reference_counts(images, cats, gts, dts):
    """(image id, category) -> (references, detections, tp, fp, fn) at IoU 0.5, all areas, 100
    detections, from the reference's own matching."""
    out = {}
    for i in images:
        for c in cats:
            g = [x for x in gts if x["image_id"] == i and x["category_id"] == c]
            d = [x for x in dts if x["image_id"] == i and x["category_id"] == c]
            e = ref._evaluate_image(g, d, ref.AREA_RNG[0], ref.MAX_DETS[-1])
            if e is None:
                continue
            match, ignore = e["match"][0], e["ignore"][0]
            tp = int(np.count_nonzero(match & ~ignore))
            fp = int(np.count_nonzero(~match & ~ignore))
            fn = int(np.count_nonzero(e["gt_ignore"] == 0)) - tp
            out[(i, c)] = (len(g), len(d), tp, fp, fn)
    return out


class CocoJobTest(unittest.TestCase):
    def make(self, root, seed, parts):
        rng = np.random.default_rng(seed)
        images, cats, gts, dts = merged_case(rng, parts)
        tc.write_case(root, rng, images, cats, gts, dts)
        write_images(root, images)
        return images, cats, gts, dts

    def run_job(self, root, out, *extra):
        return tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--out", out,
                        "--max-failed-fraction", "1", *extra)

    def test_results_file_jobs_equal_an_independent_cocoeval_for_1_and_3_workers(self):
        root = tt.tmpdir(self)
        for case in range(6):
            folder = os.path.join(root, str(case))
            os.makedirs(folder)
            images, cats, gts, dts = self.make(folder, 300 + case, parts=4)
            want_stats, want_ap = ref.coco_eval(images, cats, gts, dts)
            got = {}
            for workers in (1, 3):
                out = os.path.join(folder, f"out{workers}")
                self.run_job(folder, out, "--coco-results", os.path.join(folder, "results.json"),
                             "--workers", workers, "--shard-size", "2")
                got[workers] = stats_of(out)
                self.assertEqual(got[workers][0], want_stats, (case, workers))
                self.assertEqual(got[workers][1], want_ap, (case, workers))
            self.assertTrue(tt.same_files(os.path.join(folder, "out1"), os.path.join(folder, "out3")))

    def test_per_image_instance_counts_equal_the_reference_matching(self):
        root = tt.tmpdir(self)
        images, cats, gts, dts = self.make(root, 41, parts=3)
        out = os.path.join(root, "out")
        self.run_job(root, out, "--coco-results", os.path.join(root, "results.json"), "--workers", "2")
        want = reference_counts(images, cats, gts, dts)
        with open(os.path.join(out, "per_image.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), len(images) * len(cats))  # Every image and category, none twice.
        got = {}
        for r in rows:
            key = (int(r["id"]), int(r["class"]))
            self.assertEqual(r["category"], f"c{key[1]}")
            counts = tuple(int(r[k]) for k in ("gt_instances", "dt_instances", "instance_tp50", "instance_fp50",
                                               "instance_fn50"))
            if counts != (0, 0, 0, 0, 0):
                got[key] = counts
        self.assertEqual(got, {k: v for k, v in want.items() if v != (0, 0, 0, 0, 0)})
        report = tt.read_report(out)
        # The worst rows by instance F1, each with a thumbnail of its matching in report.html.
        worst = report["instances"]["worst_images"]
        self.assertEqual(len(worst), min(10, len(images)))
        self.assertEqual([w["f1"] for w in worst], sorted(w["f1"] for w in worst))
        with open(os.path.join(out, "report.html")) as f:
            html = f.read()
        self.assertEqual(html.count('data-instances="1"'), min(5, len(worst)))  # --thumbnails 5 by default.
        for c in report["instances"]["categories"]:
            self.assertEqual(c["tp50"], sum(v[2] for k, v in want.items() if k[1] == c["id"]))
            self.assertEqual(len(c["precision_iou50"]), 101)

    def test_a_python_model_returning_detections_equals_the_results_file(self):
        root = tt.tmpdir(self)
        images, cats, gts, dts = self.make(root, 42, parts=3)
        write_detections(os.path.join(root, "dets.json"), dts)
        want_stats, want_ap = ref.coco_eval(images, cats, gts, dts)
        for probabilities in ("0", "1"):
            out = os.path.join(root, "out" + probabilities)
            self.run_job(root, out, "--model", tt.fixture("replay_instances.py"), "--python", PY,
                         "--model-option", f"detections={os.path.join(root, 'dets.json')}",
                         "--model-option", f"probabilities={probabilities}", "--workers", "2")
            self.assertEqual(stats_of(out), (want_stats, want_ap), probabilities)
        files = os.path.join(root, "files")
        self.run_job(root, files, "--coco-results", os.path.join(root, "results.json"))
        # The semantic counts (detections painted by score) agree too.
        a, b = tt.read_per_image(files), tt.read_per_image(os.path.join(root, "out0"))
        self.assertEqual([(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["instance_tp50"]) for r in a],
                         [(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["instance_tp50"]) for r in b])

    def test_sigkill_of_a_worker_mid_job_changes_nothing(self):
        root = tt.tmpdir(self)
        images, cats, gts, dts = self.make(root, 43, parts=8)
        write_detections(os.path.join(root, "dets.json"), dts)
        want_stats, want_ap = ref.coco_eval(images, cats, gts, dts)
        cluster = tt.Cluster(self, os.path.join(root, "cluster"), lease_seconds=2.0)
        for _ in range(3):
            cluster.start_worker()
        cluster.wait_registered(3)
        job = cluster.cli("submit", "--coco", os.path.join(root, "gt.json"), "--images", root,
                          "--model", tt.fixture("replay_instances.py"), "--python", PY, "--model-option",
                          f"detections={os.path.join(root, 'dets.json')}", "--model-option", "sleep=0.3",
                          "--shard-size", "2", "--batch-size", "1").stdout.strip()
        at_kill = cluster.wait_for_progress(job, 0.2)
        self.assertLess(at_kill["done"], len(images), "the job finished before the kill; make it slower")
        cluster.workers[0].send_signal(signal.SIGKILL)
        cluster.workers[0].wait(10)
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertEqual(stats_of(out), (want_stats, want_ap))
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], len(images))
        self.assertEqual(report["instances"]["images"], len(images))

    def test_workers_get_their_images_detections_from_tallyd_and_a_killed_lease_holder_changes_nothing(self):
        """tallyd parses the results file once; each row carries its image's detections:
        the file moved away after the submission changes nothing, and a worker SIGKILLed while it
        holds leases (frozen first, so that it surely does) loses nothing."""
        root = tt.tmpdir(self)
        images, cats, gts, dts = self.make(root, 44, parts=8)
        want_stats, want_ap = ref.coco_eval(images, cats, gts, dts)
        cluster = tt.Cluster(self, os.path.join(root, "cluster"), lease_seconds=2.0)
        frozen = cluster.start_worker(name="frozen")
        cluster.wait_registered(1)
        time.sleep(0.5)  # Its long poll for work is open now...
        frozen.send_signal(signal.SIGSTOP)  # ...and stays open while it cannot run.
        job = cluster.cli("submit", "--coco", os.path.join(root, "gt.json"), "--images", root, "--coco-results",
                          os.path.join(root, "results.json"), "--shard-size", "2").stdout.strip()
        os.rename(os.path.join(root, "results.json"), os.path.join(root, "results.moved"))
        deadline = time.time() + 10
        while time.time() < deadline:
            held = [w for w in json.loads(cluster.cli("workers", "--json").stdout).get("workers", [])
                    if w.get("name") == "frozen" and job in w.get("jobs", [])]
            if held:
                break
            time.sleep(0.1)
        self.assertTrue(held, "the frozen worker was granted nothing: " + cluster.log("tallyd.log")[-2000:])
        frozen.send_signal(signal.SIGKILL)
        frozen.wait(10)
        for _ in range(3):
            cluster.start_worker()
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertEqual(stats_of(out), (want_stats, want_ap))
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], len(images))
        self.assertEqual(report["images_failed"], 0)
        rows = tt.read_per_image(out)
        keys = [(r["index"], r["class"]) for r in rows]
        self.assertEqual(len(keys), len(set(keys)))
        # The same rows as one worker reading them with the file in place.
        os.rename(os.path.join(root, "results.moved"), os.path.join(root, "results.json"))
        one = os.path.join(root, "one")
        self.run_job(root, one, "--coco-results", os.path.join(root, "results.json"), "--workers", "1",
                     "--shard-size", "2")
        self.assertTrue(tt.same_files(out, one))

    def test_bad_annotations_fail_only_their_image_naming_them(self):
        root = tt.tmpdir(self)
        images, cats, gts, dts = self.make(root, 44, parts=2)
        with open(os.path.join(root, "gt.json")) as f:
            gt = json.load(f)
        with open(os.path.join(root, "results.json")) as f:
            results = json.load(f)
        bad = {}
        a = gt["annotations"]
        a[0]["segmentation"] = {"counts": [3, 2], "size": [tc.H, tc.W]}  # Counts not summing to h * w.
        bad[a[0]["image_id"]] = f"annotation {a[0]['id']}: RLE counts sum to 5"
        other = next(x for x in a if x["image_id"] not in bad)
        other["segmentation"] = [[1, 1, 3, 1, 3, 3, 1]]  # An odd number of coordinates.
        bad[other["image_id"]] = f"annotation {other['id']}: polygon 0: a polygon has an odd number of coordinates"
        third = next(x for x in a if x["image_id"] not in bad)
        third["category_id"] = 99  # Not a category.
        bad[third["image_id"]] = f"annotation {third['id']}: category 99 is not in the annotation file's categories"
        a.append({"id": 10**7, "image_id": 5, "category_id": cats[0], "area": 4, "iscrowd": 0,
                  "segmentation": {"counts": [0, 4], "size": [2, 2]}})  # An image the file does not list.
        free = [i for i in images if i not in bad]
        # A results job reads no image: one without a file_name is evaluated all the same.
        next(im for im in gt["images"] if im["id"] == free[-1])["file_name"] = ""
        r = next((k for k, x in enumerate(results) if x["image_id"] in free), None)
        if r is not None:
            results[r]["category_id"] = 98
            bad[results[r]["image_id"]] = f"result {r + 1}: category 98 is not in the annotation file's categories"
        with open(os.path.join(root, "gt.json"), "w") as f:
            json.dump(gt, f)
        with open(os.path.join(root, "results.json"), "w") as f:
            json.dump(results, f)
        out = os.path.join(root, "out")
        p = self.run_job(root, out, "--coco-results", os.path.join(root, "results.json"), "--workers", "2")
        report = tt.read_report(out)
        failed = {int(f["id"]): f["reason"] for f in report["failures"]}
        self.assertEqual(set(failed), set(bad))
        for image, reason in bad.items():
            self.assertIn(reason, failed[image])
        self.assertEqual(report["images_evaluated"], len(images) - len(bad))
        self.assertTrue(any("1 annotation names an image that 'images' does not list" in w
                            for w in report["warnings"]), report["warnings"])
        self.assertIn("warning", p.stderr)


class ReferringTest(unittest.TestCase):
    def test_coco_ann_ids_rows_count_as_the_same_masks_written_as_pngs(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(7)
        h, w = tc.H, tc.W
        gt = {"images": [], "categories": [{"id": 1, "name": "thing"}], "annotations": []}
        refs, pngs = [["image", "prompt", "coco_ann_ids", "id"]], [["image", "mask", "prompt", "id"]]
        for i in range(6):
            img = np.zeros((h, w, 3), np.uint8)
            img[..., 0] = rng.integers(0, 255, (h, w))
            img[..., 2] = rng.integers(0, 255, (h, w))
            Image.fromarray(img).save(os.path.join(root, f"im{i}.png"))
            gt["images"].append({"id": i + 1, "file_name": f"im{i}.png", "height": h, "width": w})
            masks = []
            for k in range(3):
                m = tc.blob(rng, h, w)
                ann_id = 100 * (i + 1) + k
                counts = ref.rle_counts(m)  # Uncompressed and compressed RLE (polygons: coco_rle_test).
                seg = {"counts": counts if k != 1 else ref.rle_string(counts), "size": [h, w]}
                gt["annotations"].append({"id": ann_id, "image_id": i + 1, "category_id": 1, "area": float(m.sum()),
                                          "iscrowd": 0, "segmentation": seg})
                masks.append((ann_id, m))
            for e, ids in enumerate([[0], [0, 2], [], [1, 2]]):
                union = np.zeros((h, w), bool)
                for k in ids:
                    union |= masks[k][1]
                png = os.path.join(root, f"m{i}_{e}.png")
                Image.fromarray(union.astype(np.uint8)).save(png)
                prompt = "red" if e % 2 == 0 else "blue"
                rid = f"r{i}_{e}"
                refs.append([f"im{i}.png", prompt, ";".join(str(masks[k][0]) for k in ids), rid])
                pngs.append([f"im{i}.png", os.path.basename(png), prompt, rid])
        with open(os.path.join(root, "gt.json"), "w") as f:
            json.dump(gt, f)
        for name, rows in (("refs.csv", refs), ("pngs.csv", pngs)):
            with open(os.path.join(root, name), "w", newline="") as f:
                csv.writer(f).writerows(rows)
        model = os.path.join(tt.SRC, "examples", "python-model", "prompt_model.py")
        a, b = os.path.join(root, "a"), os.path.join(root, "b")
        tt.tally_run(model, os.path.join(root, "refs.csv"), a, "--python", PY, "--coco", os.path.join(root, "gt.json"))
        tt.tally_run(model, os.path.join(root, "pngs.csv"), b, "--python", PY)
        ra, rb = tt.read_per_image(a), tt.read_per_image(b)
        self.assertEqual(len(ra), 24 * 2)
        self.assertEqual([(r["id"], r["class"], r["tp"], r["fp"], r["fn"], r["tn"]) for r in ra],
                         [(r["id"], r["class"], r["tp"], r["fp"], r["fn"], r["tn"]) for r in rb])

    def test_refcoco_and_grefcoco_files_convert_to_manifests_tally_runs(self):
        root = tt.tmpdir(self)
        h, w = 20, 24
        Image.fromarray(np.full((h, w, 3), 200, np.uint8)).save(os.path.join(root, "COCO_1.jpg"))
        m = np.zeros((h, w), bool)
        m[2:9, 3:12] = True
        gt = {"images": [{"id": 1, "file_name": "COCO_1.jpg", "height": h, "width": w}],
              "categories": [{"id": 1, "name": "thing"}],
              "annotations": [{"id": 5, "image_id": 1, "category_id": 1, "area": float(m.sum()), "iscrowd": 0,
                               "segmentation": {"counts": ref.rle_counts(m), "size": [h, w]}}]}
        with open(os.path.join(root, "instances.json"), "w") as f:
            json.dump(gt, f)
        import pickle
        refs = [{"ref_id": 7, "image_id": 1, "ann_id": 5, "split": "val", "category_id": 1,
                 "sentences": [{"sent": "red thing", "sent_id": 70}, {"sent": "the left one", "sent_id": 71}]},
                {"ref_id": 8, "image_id": 1, "ann_id": 5, "split": "train", "sentences": [{"sent": "x", "sent_id": 80}]}]
        with open(os.path.join(root, "refs(unc).p"), "wb") as f:
            pickle.dump(refs, f)
        grefs = [{"ref_id": 9, "image_id": 1, "ann_id": [-1], "no_target": True, "split": "val",
                  "sentences": [{"sent": "blue dog", "sent_id": 90}]},
                 {"ref_id": 10, "image_id": 1, "ann_id": [5], "no_target": False, "split": "val",
                  "sentences": [{"sent": "red", "sent_id": 100}]}]
        with open(os.path.join(root, "grefs(unc).json"), "w") as f:
            json.dump(grefs, f)
        conv = os.path.join(tt.SRC, "examples", "coco", "refer_to_manifest.py")
        want = {"refs(unc).p": [("7_70", "red thing", "5"), ("7_71", "the left one", "5")],
                "grefs(unc).json": [("9_90", "blue dog", ""), ("10_100", "red", "5")]}
        for name, rows in want.items():
            manifest = os.path.join(root, name + ".csv")
            tt.subprocess.run([PY, conv, "--refs", os.path.join(root, name), "--instances",
                               os.path.join(root, "instances.json"), "--split", "val", "--out", manifest], check=True)
            with open(manifest) as f:
                got = [(r["id"], r["prompt"], r["coco_ann_ids"]) for r in csv.DictReader(f)]
            self.assertEqual(got, rows)
            out = os.path.join(root, "out_" + name)
            tt.tally_run(os.path.join(tt.SRC, "examples", "python-model", "prompt_model.py"), manifest, out,
                         "--python", PY, "--coco", os.path.join(root, "instances.json"))
            report = tt.read_report(out)
            self.assertEqual(report["images_evaluated"], len(rows))
            for r in tt.read_per_image(out):
                if r["class"] == "1":  # The reference's foreground: the annotation's pixels, or none.
                    target = dict((i, t) for i, _, t in rows)[r["id"]]
                    self.assertEqual(int(r["tp"]) + int(r["fn"]), int(m.sum()) if target else 0)


class TorchScriptInstancesTest(unittest.TestCase):
    def test_a_torchscript_model_returning_detection_dicts_equals_its_detections_as_a_results_file(self):
        # red_blue_instances.pt: per image, red > 0.5 as category 1 (score 0.9) and blue > 0.5 as
        # category 2 (score 0.6); the same masks computed here with numpy become a results file.
        root = tt.tmpdir(self)
        rng = np.random.default_rng(9)
        h, w = 40, 52
        gt = {"images": [], "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}, {"id": 3, "name": "x"}],
              "annotations": []}
        results = []
        for i in range(1, 9):
            img = np.zeros((h, w, 3), np.uint8)
            for c in (0, 2):
                m = tc.blob(rng, 100, 104)[:h, :w]
                img[..., c] = np.where(m, rng.integers(128, 256, (h, w)), rng.integers(0, 128, (h, w)))
            Image.fromarray(img).save(os.path.join(root, f"{i}.png"))
            gt["images"].append({"id": i, "file_name": f"{i}.png", "height": h, "width": w})
            for c, cat in ((0, 1), (2, 2)):
                ref_mask = np.roll(img[..., c] >= 128, int(rng.integers(-2, 3)), axis=1)
                gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i, "category_id": cat,
                                          "area": float(ref_mask.sum()), "iscrowd": 0,
                                          "segmentation": {"counts": ref.rle_counts(ref_mask), "size": [h, w]}})
                results.append({"image_id": i, "category_id": cat, "score": 0.9 if cat == 1 else 0.6,
                                "segmentation": {"counts": ref.rle_counts(img[..., c] >= 128), "size": [h, w]}})
        for name, data in (("gt.json", gt), ("results.json", results)):
            with open(os.path.join(root, name), "w") as f:
                json.dump(data, f)
        model, files = os.path.join(root, "model"), os.path.join(root, "files")
        tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--model",
                 tt.fixture("red_blue_instances.pt"), "--out", model, "--batch-size", "4",
                 *(("--gpus", os.environ["TALLY_TEST_GPUS"]) if os.environ.get("TALLY_TEST_GPUS") else ("--workers", "2")))
        tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--coco-results",
                 os.path.join(root, "results.json"), "--out", files)
        self.assertEqual(stats_of(model), stats_of(files))
        self.assertTrue(0 < stats_of(model)[0][0] < 1)
        self.assertEqual(tt.read_report(model)["images_evaluated"], 8)
        a, b = tt.read_per_image(model), tt.read_per_image(files)
        self.assertEqual([(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["instance_tp50"]) for r in a],
                         [(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["instance_tp50"]) for r in b])


class ReferringBadInputTest(unittest.TestCase):
    def test_rows_naming_a_missing_annotation_or_image_fail_alone(self):
        root = tt.tmpdir(self)
        h, w = 20, 24
        Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(os.path.join(root, "a.png"))
        m = np.zeros((h, w), bool)
        m[3:9, 4:15] = True
        seg = {"counts": ref.rle_counts(m), "size": [h, w]}
        gt = {"images": [{"id": 1, "file_name": "a.png", "height": h, "width": w}],
              "categories": [{"id": 1, "name": "thing"}],
              "annotations": [{"id": 5, "image_id": 1, "category_id": 1, "area": 66.0, "iscrowd": 0, "segmentation": seg},
                              {"id": 6, "image_id": 77, "category_id": 1, "area": 66.0, "iscrowd": 0, "segmentation": seg},
                              {"id": 7, "image_id": 1, "category_id": 1, "area": 66.0, "iscrowd": 0,
                               "segmentation": {"counts": [3, 2], "size": [h, w]}}]}
        with open(os.path.join(root, "gt.json"), "w") as f:
            json.dump(gt, f)
        with open(os.path.join(root, "refs.csv"), "w") as f:
            f.write("id,image,prompt,coco_ann_ids\nok,a.png,red,5\nmissing,a.png,red,5;404\n"
                    "unlisted,a.png,red,6\nbroken,a.png,red,7\nnotanid,a.png,red,5;x\n")
        out = os.path.join(root, "out")
        tt.tally_run(os.path.join(tt.SRC, "examples", "python-model", "prompt_model.py"), os.path.join(root, "refs.csv"),
                     out, "--python", PY, "--coco", os.path.join(root, "gt.json"))
        report = tt.read_report(out)
        failed = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertEqual(report["images_evaluated"], 1)
        self.assertIn("annotation 404 is not in the annotation file", failed["missing"])
        self.assertIn("annotation 6 is for image 77, which the annotation file does not list", failed["unlisted"])
        self.assertIn("annotation 7: RLE counts sum to 5", failed["broken"])
        self.assertIn("coco_ann_ids '5;x'", failed["notanid"])
