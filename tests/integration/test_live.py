"""Answers before the end (docs/metrics.md "Answers before the end"): rows in a seeded random order give the
manifest order's reports; live estimates and their finite-population-corrected intervals equal a numpy
re-computation from the committed rows; --sample and --until-ci end a job early with every row
accounted for; the interval's coverage in a numpy simulation; a running job's partial report."""
import json
import os
import time
import unittest

import numpy as np
from PIL import Image

import tallytest as tt

RUN_FIELDS = {"job_id", "name", "created_unix", "finished_unix", "wall_seconds", "images_per_second", "throughput",
              "workers", "state", "shard_size", "provenance"}
# The flags that choose rows and their order: recorded, and asserted where a test sets them.
ROW_CHOICE = {"order", "order_seed", "sample", "speculate_after", "canary_rows", "window"}


def write_predictions(root, rng, n, size=20, classes=3):
    """n prediction/reference pairs whose predictions are their references with a row's own share of
    pixels (0 to 60%) relabelled at random: Dice varies from row to row."""
    os.makedirs(os.path.join(root, "pred"), exist_ok=True)
    os.makedirs(os.path.join(root, "ref"), exist_ok=True)
    rows = ["id,prediction,mask"]
    for i in range(n):
        ref = tt.blob_mask(rng, size, size, classes)
        ref[rng.integers(0, size), rng.integers(0, size)] = 1  # Class 1 in every reference.
        pred = ref.copy()
        flip = rng.random(ref.shape) < rng.uniform(0, 0.6)
        pred[flip] = rng.integers(0, classes, int(flip.sum()))
        Image.fromarray(pred).save(os.path.join(root, "pred", f"p{i:04d}.png"))
        Image.fromarray(ref).save(os.path.join(root, "ref", f"m{i:04d}.png"))
        rows.append(f"case{i:04d},pred/p{i:04d}.png,ref/m{i:04d}.png")
    return tt.write_manifest(root, rows)


def prediction_setup(test, seed, n, workers=2):
    """A temporary folder, a prediction manifest of `n` rows drawn with `seed` under it, and a cluster
    with `workers` CPU workers: the set-up most tests here share. Returns (root, manifest, cluster)."""
    root = tt.tmpdir(test)
    manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(seed), n)
    c = tt.Cluster(test, os.path.join(root, "c"))
    for _ in range(workers):
        c.start_worker()
    return root, manifest, c


def status_json(c, job_id):
    return json.loads(c.cli("status", job_id, "--json").stdout)


def dice_by_class(rows):
    out = {}
    for r in rows:
        v = tt.num(r["dice"])
        if not np.isnan(v):
            out.setdefault(int(r["class"]), []).append(v)
    return {k: np.array(v) for k, v in out.items()}


def dice_by_index(rows):
    """Per class, (index, dice) of the rows whose Dice is defined."""
    out = {}
    for r in rows:
        v = tt.num(r["dice"])
        if not np.isnan(v):
            out.setdefault(int(r["class"]), []).append((int(r["index"]), v))
    return out


def sample_ci(pairs, total, seed, sampled_rows):
    """The documented interval of a sample: betting, in draw order, population estimated as the
    class's share of the sample times the manifest's rows."""
    ordered = [v for _, v in sorted(pairs, key=lambda p: tt.row_position(total, seed, p[0]))]
    return tt.betting_ci(ordered, int(np.ceil(total * len(pairs) / sampled_rows)))


def rows_ci(pairs, ids):
    """The documented interval of a finished job's rows: betting, in row-key order of their ids."""
    return tt.betting_ci([v for _, v in sorted(pairs, key=lambda p: (tt.row_key(ids[p[0]]), p[1]))])


class RandomOrderTest(unittest.TestCase):
    def test_random_order_reports_equal_the_manifest_orders(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        c.start_worker()
        # A model job (batches of 4 formed in the permutation's order) and a prediction job.
        model_manifest = tt.write_dataset(os.path.join(root, "m"), np.random.default_rng(3), 60, [(16, 16)], classes=3)
        pred_manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(4), 90)
        for name, submit in (
                ("model", lambda *f: c.submit(tt.fixture("three_class.pt"), model_manifest, "--batch-size", "4",
                                              "--metrics", "all", *f)),
                ("pred", lambda *f: c.cli("submit", "--manifest", pred_manifest, "--shard-size", "7", "--metrics",
                                          "all", *f).stdout.strip())):
            manifest_job = submit()
            random_job = submit("--order", "random:3")
            for j in (manifest_job, random_job):
                self.assertEqual(c.wait(j)["state"], "succeeded", name)
            spec = status_json(c, random_job)["spec"]
            self.assertTrue(spec["random_order"])
            self.assertEqual(int(spec["order_seed"]), 3)
            a, b = os.path.join(root, name + "_manifest"), os.path.join(root, name + "_random")
            c.fetch(manifest_job, a)
            c.fetch(random_job, b)
            ra, rb = tt.read_report(a), tt.read_report(b)
            self.assertEqual((ra["order"], "order_seed" in ra, rb["order"], rb["order_seed"]),
                             ("manifest", False, "random", "3"), name)
            self.assertEqual({k: v for k, v in ra.items() if k not in RUN_FIELDS | ROW_CHOICE},
                             {k: v for k, v in rb.items() if k not in RUN_FIELDS | ROW_CHOICE}, name)
            self.assertTrue(tt.same_files(a, b, "per_image.csv"), name)
        # The permutation really is one: the random job's shards name rows out of manifest order.
        self.assertIn("in random order", c.log("tallyd.log"))
        # --until-ci and --sample refuse the manifest's order, and bad values are named.
        p = c.cli("submit", "--manifest", pred_manifest, "--sample", "10", "--order", "manifest", check=False)
        self.assertEqual(p.returncode, 2)  # A usage error, found before anything is sent.
        self.assertIn("random order", p.stderr)
        for flags, what in ((["--sample", "0"], "--sample"), (["--until-ci", "2"], "--until-ci"),
                            (["--order", "shuffled"], "--order"), (["--order", "random:x"], "--order")):
            p = c.cli("submit", "--manifest", pred_manifest, *flags, check=False)
            self.assertEqual(p.returncode, 2, flags)
            self.assertIn(what, p.stderr, flags)


class LiveEstimatesTest(unittest.TestCase):
    def test_sampled_job_live_estimates_and_report_equal_numpy(self):
        root, manifest, c = prediction_setup(self, 5, 200)
        job = c.cli("submit", "--manifest", manifest, "--sample", "30%", "--shard-size", "6").stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        st = status_json(c, job)
        self.assertRegex(st["sampled"], r"^sampled: 60 of 200 rows \(--sample 30% --order random:\d+\)$")
        self.assertIn("finite-population corrected", st["live_note"])
        out = os.path.join(root, "out")
        c.fetch(job, out)
        report = tt.read_report(out)
        rows = tt.read_per_image(out)
        self.assertEqual(len({r["index"] for r in rows}), 60)
        self.assertEqual((report["images_evaluated"], report["images_not_evaluated"], report["images_missing"]),
                         (60, 140, 0))
        self.assertEqual(report["not_evaluated_reason"], "not evaluated (sample)")
        self.assertIn("sampled: 60 of 200 rows", c.cli("jobs").stdout)
        values = dice_by_index(rows)
        live = {e.get("class_id", 0): e for e in st["live"]}
        seed = int(st["spec"]["order_seed"])
        for k, pairs in values.items():
            v = np.array([d for _, d in pairs])
            self.assertEqual(int(live[k]["rows"]), len(v))
            self.assertTrue(tt.same(live[k]["dice_mean"], v.mean(), 1e-12), k)
            lo, hi = sample_ci(pairs, 200, seed, 60)
            self.assertTrue(tt.same(live[k]["dice_ci_low"], lo, 1e-8) and tt.same(live[k]["dice_ci_high"], hi, 1e-8), k)
            self.assertTrue(tt.same(live[k]["dice_half_width"], (hi - lo) / 2, 1e-8), k)
            self.assertEqual(report["classes"][k]["dice_mean_ci95"], [live[k]["dice_ci_low"], live[k]["dice_ci_high"]])
            self.assertLessEqual(lo, v.mean())
            self.assertGreaterEqual(hi, v.mean())
        self.assertIn("uniform random sample without replacement", report["dice_mean_ci95_method"])
        self.assertFalse(live[0].get("foreground", False))
        self.assertTrue(live[1]["foreground"])
        # Manifest order: no live interval (the rows so far are no random sample); the finished job's
        # interval is over its rows, in row-key order.
        job = c.cli("submit", "--manifest", manifest, "--shard-size", "6").stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        st = status_json(c, job)
        self.assertIn("not a random sample", st["live_note"])
        out = os.path.join(root, "all")
        c.fetch(job, out)
        rows = tt.read_per_image(out)
        ids = {int(r["index"]): r["id"] for r in rows}
        values = dice_by_index(rows)
        for e in st["live"]:
            self.assertTrue(np.isnan(float(e["dice_half_width"])), e)
        report = tt.read_report(out)
        for k, pairs in values.items():
            lo, hi = rows_ci(pairs, ids)
            got = report["classes"][k]["dice_mean_ci95"]
            self.assertTrue(tt.same(got[0], lo, 1e-8) and tt.same(got[1], hi, 1e-8), (k, got, lo, hi))

    def test_until_ci_stops_with_the_interval_in_most_seeds(self):
        root, manifest, c = prediction_setup(self, 6, 400)
        full = c.cli("submit", "--manifest", manifest, "--metrics", "dice").stdout.strip()
        jobs = [c.cli("submit", "--manifest", manifest, "--metrics", "dice", "--until-ci", "0.04", "--min-rows", "40",
                      "--shard-size", "4", "--order", f"random:{seed}").stdout.strip() for seed in range(1, 9)]
        self.assertEqual(c.wait(full)["state"], "succeeded")
        c.fetch(full, os.path.join(root, "full"))
        truth = {cl["class"]: cl["dice_mean"] for cl in tt.read_report(os.path.join(root, "full"))["classes"]}
        covered = trials = 0
        for seed, job in enumerate(jobs, 1):
            self.assertEqual(c.wait(job)["state"], "succeeded")
            out = os.path.join(root, f"s{seed}")
            c.fetch(job, out)
            report = tt.read_report(out)
            n = report["images_evaluated"]
            self.assertTrue(40 <= n < 400, (seed, n))
            self.assertRegex(report["sampled"],
                             rf"^sampled: {n} of 400 rows \(--until-ci 0.04 reached; --order random:\d+\)$")
            self.assertEqual(report["images_not_evaluated"], 400 - n)
            for cl in report["classes"]:
                if cl["class"] == 0:
                    continue
                lo, hi = cl["dice_mean_ci95"]
                self.assertLessEqual((hi - lo) / 2, 0.04 + 1e-12, (seed, cl["class"]))
                trials += 1
                covered += lo <= truth[cl["class"]] <= hi
        print(f"until-ci: the full run's mean inside the interval in {covered} of {trials} (seed, class) pairs")
        self.assertGreaterEqual(covered, 0.75 * trials)


class PartialReportTest(unittest.TestCase):
    def test_a_running_jobs_partial_report(self):
        root = tt.tmpdir(self)
        # Row 39 hangs the model: the last shard stays in hand while the rest are committed.
        manifest = tt.marked_dataset(os.path.join(root, "data"), 40, {39})
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--metrics-listen", "127.0.0.1:0"])
        c.start_worker()
        job = c.submit(tt.fixture("hangs_on_mark.pt"), manifest, "--batch-size", "4", "--shard-size", "4",
                       "--batch-timeout", "120")
        c.wait_for_progress(job, 0.9)
        out = os.path.join(root, "partial")
        c.cli("report", job, "--out", out, "--partial")
        report = tt.read_report(out)
        self.assertEqual(report["state"], "running")
        self.assertFalse(report["complete"])
        self.assertEqual(report["images_evaluated"], 36)
        self.assertEqual(report["images_missing"], 4)
        self.assertEqual(len({r["index"] for r in tt.read_per_image(out)}), 36)
        # The live estimates of the same 36 rows: in the Python client and on /metrics.
        from tally.client import Client
        from test_metrics import metrics_url, scrape, value
        with Client(c.address) as client:
            live = {e["class_id"]: e for e in client.job(job)["live"]}
        _, samples, _ = scrape(metrics_url(c))
        for cls in report["classes"]:
            k = cls["class"]
            self.assertTrue(tt.same(live[k]["dice_mean"], cls["dice_mean"], 1e-12), k)
            self.assertEqual(live[k]["rows"], cls["images"])
            self.assertTrue(tt.same(value(samples, "tally_job_dice_estimate", job=job, **{"class": str(k)}),
                                    cls["dice_mean"], 1e-12), k)
            # Manifest order: the rows so far are the first ones, no random sample: no interval, live or
            # in the partial report.
            self.assertTrue(np.isnan(float(live[k]["dice_half_width"])), k)
            self.assertIsNone(cls["dice_mean_ci95"], k)
        self.assertIn("not a random sample", report["dice_mean_ci95_method"])
        # The folder it was built in is gone (once the stream ends); a plain report of a running job
        # is still refused.
        deadline = time.time() + 10
        while os.listdir(os.path.join(c.state, "merged")) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(os.listdir(os.path.join(c.state, "merged")), [])
        p = c.cli("report", job, "--out", os.path.join(root, "plain"), check=False)
        self.assertNotEqual(p.returncode, 0)
        c.cli("cancel", job)


if __name__ == "__main__":
    unittest.main()


class SpeculationTest(unittest.TestCase):
    def run_with_straggler(self, root, manifest, speculate, kill_straggler=False):
        c = tt.Cluster(self, os.path.join(root, "c"))
        straggler = c.start_worker(env={"TALLY_TEST_THROTTLE_MS": "1500"})
        c.wait_registered(1)
        job = c.cli("submit", "--manifest", manifest, "--shard-size", "4", "--speculate-after", speculate).stdout.strip()
        c.wait_for_progress(job, 0.0)
        while c.job(job)["state"] == "queued":
            time.sleep(0.05)
        c.start_worker()
        c.start_worker()
        if kill_straggler:
            deadline = time.time() + 60
            while "a speculative copy goes to" not in c.log("tallyd.log") and time.time() < deadline:
                time.sleep(0.05)
            straggler.kill()
        start = time.time()
        self.assertEqual(c.wait(job, timeout=300)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        return c, out, time.time() - start

    def test_a_stragglers_shards_are_finished_by_others_and_counted_once(self):
        root = tt.tmpdir(self)
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(7), 48)
        plain = os.path.join(root, "plain")
        c0 = tt.Cluster(self, os.path.join(root, "c0"))
        c0.start_worker()
        j = c0.cli("submit", "--manifest", manifest, "--shard-size", "4").stdout.strip()
        self.assertEqual(c0.wait(j)["state"], "succeeded")
        c0.fetch(j, plain)
        c0.stop()
        for name, kill in (("spec", False), ("killed", True)):
            c, out, seconds = self.run_with_straggler(os.path.join(root, name), manifest, "1", kill_straggler=kill)
            log = c.log("tallyd.log")
            self.assertIn("a speculative copy goes to", log, name)
            report = tt.read_report(out)
            self.assertEqual((report["images_evaluated"], report["images_failed"]), (48, 0), name)
            self.assertTrue(tt.same_files(plain, out, "per_image.csv"), name)
            self.assertEqual((tt.read_report(plain)["speculate_after"], report["speculate_after"]), ("auto", 1), name)
            self.assertEqual({k: v for k, v in tt.read_report(plain).items() if k not in RUN_FIELDS | ROW_CHOICE},
                             {k: v for k, v in report.items() if k not in RUN_FIELDS | ROW_CHOICE}, name)
            st = status_json(c, report["job_id"])
            self.assertEqual((int(st["images_evaluated"]), int(st.get("images_failed", 0))), (48, 0), name)
            c.stop()


class CanaryTest(unittest.TestCase):
    def test_a_faulty_worker_is_named_and_taken_out_before_it_commits(self):
        root = tt.tmpdir(self)
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(8), 60)
        plain = os.path.join(root, "plain")
        c = tt.Cluster(self, os.path.join(root, "c"))
        faulty = c.start_worker(name="faulty", env={"TALLY_TEST_FAULTY": "1"})
        c.start_worker(name="good1")
        c.start_worker(name="good2")
        c.wait_registered(3)
        job = c.cli("submit", "--manifest", manifest, "--shard-size", "4", "--order", "random:2", "--canary",
                    "8").stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        report = tt.read_report(out)
        warnings = [w for w in report["warnings"] if w.startswith("canary:")]
        self.assertEqual(len(warnings), 1, report["warnings"])
        self.assertIn("worker faulty (", warnings[0])
        self.assertIn("disagrees with 2 other workers on 8 canary rows", warnings[0])
        self.assertIn("taken out of the job", warnings[0])
        # Taken out before committing a row: the results are an undisturbed run's.
        self.assertNotIn("faulty", {w["name"] for w in report["workers"]})
        faulty.kill()  # The undisturbed run, on the good workers.
        base = c.cli("submit", "--manifest", manifest, "--shard-size", "4").stdout.strip()
        self.assertEqual(c.wait(base)["state"], "succeeded")
        c.fetch(base, plain)
        self.assertTrue(tt.same_files(plain, out, "per_image.csv"))

    def test_a_worker_whose_model_loads_other_weights_is_named(self):
        # A Python model whose weights come from a file each worker finds in its own environment (as
        # on hosts with different copies under one path): the model file's SHA-256 is the same
        # everywhere, so only the canary can tell.
        root = tt.tmpdir(self)
        model = tt.write_text(
            os.path.join(root, "variant.py"),
            "import os\nimport numpy as np\n\nclass Model:\n    num_classes = 3\n\n"
            "    def __init__(self, devices, options):\n"
            "        with open(os.environ['TALLY_TEST_WEIGHTS']) as f:\n"
            "            self.threshold = float(f.read())\n\n"
            "    def predict(self, images, rows):\n"
            "        return [np.digitize(i[..., 0].astype(np.float32), [self.threshold, 170.0]).astype(np.int32)"
            " for i in images]\n")
        weights = {name: tt.write_text(os.path.join(root, name + ".weights"), value)
                   for name, value in (("good", "85"), ("other", "60"))}
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(10), 24, [(16, 16)], classes=3)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker(name="copy-a", env={"TALLY_TEST_WEIGHTS": weights["good"]})
        c.start_worker(name="copy-b", env={"TALLY_TEST_WEIGHTS": weights["good"]})
        c.start_worker(name="other-copy", env={"TALLY_TEST_WEIGHTS": weights["other"]})
        c.wait_registered(3)
        job = c.submit(model, manifest, "--python", "/usr/bin/python3", "--batch-size", "4", "--canary", "8")
        self.assertEqual(c.wait(job, timeout=600)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        report = tt.read_report(out)
        warnings = [w for w in report["warnings"] if w.startswith("canary:")]
        self.assertEqual(len(warnings), 1, report["warnings"])
        self.assertIn("worker other-copy (", warnings[0])
        self.assertNotIn("other-copy", {w["name"] for w in report["workers"]})

    def test_identical_workers_raise_no_warning(self):
        root, manifest, c = prediction_setup(self, 9, 40)
        c.wait_registered(2)
        job = c.cli("submit", "--manifest", manifest, "--shard-size", "4", "--canary", "6").stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        report = tt.read_report(out)
        self.assertEqual([w for w in report["warnings"] if "canary" in w], [])
        self.assertEqual(report["images_evaluated"], 40)
        self.assertEqual(len(report["workers"]), 2)
