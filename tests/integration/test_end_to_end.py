"""End to end: `tally run` with real processes, compared with the independent reference, and the
same numbers for any number of workers and shard size."""
import json
import os
import unittest

import numpy as np
from PIL import Image

import tallytest as tt


class EndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-e2e-")
        rng = np.random.default_rng(11)
        # Mixed sizes (odd ones too), PNG and JPEG, ignore bands, three classes.
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), rng, 30,
                                        [(24, 32), (24, 32), (17, 23), (40, 40)], classes=3, jpeg_every=7)
        cls.runs = {}

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.root, True)

    def manifest_rows(self):
        with open(self.manifest) as f:
            return f.read().splitlines()[1:]

    def run_tally(self, key, model, *extra):
        if key not in self.runs:
            out = os.path.join(self.root, key)
            p = tt.tally_run(tt.fixture(model), self.manifest, out, *extra)
            self.runs[key] = (out, p)
        return self.runs[key]

    def test_per_image_values_match_the_reference(self):
        out, _ = self.run_tally("three_w3", "three_class.pt", "--workers", "3", "--shard-size", "4",
                                "--batch-size", "2", "--metrics", "all")
        rows = tt.read_per_image(out)
        self.assertEqual(list(rows[0].keys()),
                         ["index", "id", "image", "class", "tp", "fp", "fn", "tn", "dice", "iou", "precision",
                          "recall", "specificity", "accuracy", "hd", "hd95", "assd", "nsd", "image_xxh128",
                          "mask_xxh128", "prediction_xxh128"])
        manifest_rows = self.manifest_rows()
        self.assertEqual(len(rows), 30 * 3)
        compared = 0
        for r in rows:
            i, c = int(r["index"]), int(r["class"])
            rid, img, msk = manifest_rows[i].split(",")
            self.assertEqual(r["id"], rid)
            self.assertEqual(r["image"], img)
            pred, k = tt.predict(tt.fixture("three_class.pt"), os.path.join(self.root, "data", img))
            ref = np.asarray(Image.open(os.path.join(self.root, "data", msk)))
            want = tt.reference_rows(pred, ref, k)[c]
            for field in ("tp", "fp", "fn", "tn"):
                self.assertEqual(int(r[field]), want[field], f"index {i} class {c} {field}")
            for field in ("dice", "iou", "precision", "recall", "specificity", "accuracy", "hd", "hd95", "assd",
                          "nsd"):
                self.assertTrue(tt.same(tt.num(r[field]), want[field], 1e-12),
                                f"index {i} class {c} {field}: tally {r[field]} reference {want[field]}")
            compared += 1
        self.assertEqual(compared, 90)
        # Sorted by index then class.
        keys = [(int(r["index"]), int(r["class"])) for r in rows]
        self.assertEqual(keys, sorted(keys))

    def test_one_and_three_workers_give_identical_outputs(self):
        # Three workers registered before the job is submitted, a model slow enough that each takes
        # a share, small shards and batches; against one worker with the default shard size.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 96,
                                    [(32, 32), (32, 32), (21, 27)], classes=2, jpeg_every=5)
        outs = {}
        for workers, extra in ((3, ("--shard-size", "4", "--batch-size", "2")), (1, ())):
            cluster = tt.Cluster(self, os.path.join(root, f"c{workers}"))
            for _ in range(workers):
                cluster.start_worker()
            cluster.wait_registered(workers)
            job = cluster.submit(tt.fixture("slow.pt"), manifest, "--metrics", "all", *extra)
            self.assertEqual(cluster.wait(job)["state"], "succeeded")
            outs[workers] = os.path.join(root, f"out{workers}")
            cluster.fetch(job, outs[workers])
            cluster.stop()
        with open(os.path.join(outs[1], "per_image.csv"), "rb") as a, \
                open(os.path.join(outs[3], "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        r1, r3 = tt.read_report(outs[1]), tt.read_report(outs[3])
        self.assertEqual(json.dumps(r1["classes"], sort_keys=True), json.dumps(r3["classes"], sort_keys=True))
        for key in r1:
            if key.startswith("foreground_"):
                self.assertEqual(r1[key], r3[key], key)
        self.assertEqual(len(r3["workers"]), 3)
        self.assertTrue(all(w["images"] > 0 for w in r3["workers"]), r3["workers"])
        self.assertEqual(sum(w["images"] for w in r3["workers"]), 96)
        self.assertEqual(r3["images_evaluated"], 96)

    def test_report_json_accounts_for_every_row(self):
        out, p = self.run_tally("three_w1", "three_class.pt", "--workers", "1", "--metrics", "all")
        r = tt.read_report(out)
        for key in ("job_id", "model", "manifest", "images_total", "images_evaluated", "images_failed", "failures",
                    "classes", "foreground_dice_mean", "foreground_iou_mean", "workers", "wall_seconds",
                    "images_per_second"):
            self.assertIn(key, r)
        self.assertEqual(r["images_total"], 30)
        self.assertEqual(r["images_evaluated"] + r["images_failed"], 30)
        self.assertTrue(r["complete"])
        self.assertEqual(r["model"], tt.fixture("three_class.pt"))
        self.assertEqual([c["class"] for c in r["classes"]], [0, 1, 2])
        for c in r["classes"]:
            for key in ("dice_mean", "dice_global", "iou_mean", "iou_global", "tp", "fp", "fn", "tn",
                        "dice_mean_ci95"):
                self.assertIn(key, c)
        # The summary table is printed and summary.md / report.html exist.
        self.assertIn("| class |", p.stdout)
        self.assertTrue(os.path.getsize(os.path.join(out, "summary.md")) > 0)
        self.assertTrue(os.path.getsize(os.path.join(out, "report.html")) > 0)

    def test_aggregates_match_the_reference(self):
        out, _ = self.run_tally("three_w1", "three_class.pt", "--workers", "1", "--metrics", "all")
        r = tt.read_report(out)
        per_class = {c: [] for c in range(3)}
        for line in self.manifest_rows():
            _, img, msk = line.split(",")
            pred, k = tt.predict(tt.fixture("three_class.pt"), os.path.join(self.root, "data", img))
            ref = np.asarray(Image.open(os.path.join(self.root, "data", msk)))
            for c, row in enumerate(tt.reference_rows(pred, ref, k)):
                per_class[c].append(row)
        fg_dice = []
        for c in range(3):
            rows = per_class[c]
            dice = np.array([x["dice"] for x in rows])
            want_mean = float(np.nanmean(dice))
            got = r["classes"][c]
            self.assertTrue(tt.same(got["dice_mean"], want_mean, 1e-12), (c, got["dice_mean"], want_mean))
            tp, fp, fn = (sum(x[f] for x in rows) for f in ("tp", "fp", "fn"))
            self.assertTrue(tt.same(got["dice_global"], 2 * tp / (2 * tp + fp + fn), 1e-12))
            self.assertTrue(tt.same(got["iou_global"], tp / (tp + fp + fn), 1e-12))
            hd95 = np.array([x["hd95"] for x in rows])
            finite = hd95[np.isfinite(hd95)]
            self.assertTrue(tt.same(got["hd95_mean"], float(finite.mean()), 1e-12))
            self.assertEqual(got["hd95_inf_count"], int(np.sum(np.isinf(hd95))))
            if c > 0:
                fg_dice.append(want_mean)
        self.assertTrue(tt.same(r["foreground_dice_mean"], float(np.mean(fg_dice)), 1e-12))

    def test_half_resolution_logits_are_resized_bilinearly(self):
        out, _ = self.run_tally("half", "half_res.pt", "--workers", "2", "--metrics", "dice")
        rows = tt.read_per_image(out)
        manifest_rows = self.manifest_rows()
        for r in rows:
            i, c = int(r["index"]), int(r["class"])
            _, img, msk = manifest_rows[i].split(",")
            pred, k = tt.predict(tt.fixture("half_res.pt"), os.path.join(self.root, "data", img))
            ref = np.asarray(Image.open(os.path.join(self.root, "data", msk)))
            # Masks hold classes 0..2 but this model has 2: rows with class-2 pixels fail.
            if ref[ref != 255].max(initial=0) >= k:
                continue
            want = tt.counts(pred, ref, k)[c]
            self.assertEqual((int(r["tp"]), int(r["fp"]), int(r["fn"]), int(r["tn"])), want, f"index {i} class {c}")
        report = tt.read_report(out)
        self.assertGreater(report["images_failed"], 0)
        for f in report["failures"]:
            self.assertIn(">= number of classes 2", f["reason"])


class ServiceCliTest(unittest.TestCase):
    """tallyd as a service, driven by tally submit / status / watch / report / jobs / cancel."""

    def test_submit_watch_report_jobs_cancel(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(3), 12, [(16, 16)], classes=2)
        cluster = tt.Cluster(self, root)
        cluster.start_worker()
        job = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--metrics", "dice")
        self.assertTrue(job.startswith("j"))
        w = cluster.cli("watch", job)
        self.assertIn("succeeded", w.stdout)
        self.assertIn("12/12", w.stdout)
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertEqual(tt.read_report(out)["images_evaluated"], 12)
        self.assertIn(job, cluster.cli("jobs").stdout)
        # A job with no worker to run it can be cancelled.
        for p in cluster.workers:
            p.terminate()
            p.wait(10)
        job2 = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest)
        self.assertIn("cancelled", cluster.cli("cancel", job2).stdout)
        self.assertEqual(cluster.job(job2)["state"], "cancelled")
        missing = cluster.cli("status", "j-no-such-job", check=False)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("no job", missing.stderr)

    def test_tallyd_spawns_and_supervises_its_own_workers(self):
        import signal
        import subprocess
        import time
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(8), 10, [(16, 16)], classes=2)
        port_file = os.path.join(root, "port")
        log = open(os.path.join(root, "tallyd.log"), "w")
        self.addCleanup(log.close)
        tallyd = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--state-dir", os.path.join(root, "state"), "--spawn-workers", "--workers", "2"],
                                  stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: (tallyd.poll() is None and tallyd.send_signal(signal.SIGTERM), tallyd.wait(20)))
        deadline = time.time() + 30
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
        with open(port_file) as f:
            server = "127.0.0.1:" + f.read().strip()

        def log_text():
            with open(os.path.join(root, "tallyd.log")) as f:
                return f.read()

        while log_text().count(" registered: ") < 2:  # Both spawned workers come up by themselves.
            self.assertLess(time.time(), deadline + 30, log_text())
            time.sleep(0.05)
        self.assertIn("spawned 2 worker(s)", log_text())
        job = tt.tally("submit", "--server", server, "--model", tt.fixture("red_vs_rest.pt"), "--manifest",
                       manifest).stdout.strip()
        self.assertIn("succeeded", tt.tally("watch", job, "--server", server).stdout)
        self.assertIn("10/10", tt.tally("status", job, "--server", server).stdout)


if __name__ == "__main__":
    unittest.main()
