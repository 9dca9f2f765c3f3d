"""Every job finishes: many jobs at once, rows that throw, hang or bomb, broken workers, hostile
files, a full disk and a restarted coordinator. Each test reproduces one failure that used to hang
a job or fail it as a whole, and checks the outcome against an undisturbed run or a hand-made
expectation."""
import concurrent.futures
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest
import zlib

import numpy as np
from PIL import Image

import tallytest as tt


def png_header_bomb(path, width, height, color=2):
    """A ~60-byte PNG whose header declares width x height: a decompression bomb's header."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


class ManyJobsTest(unittest.TestCase):
    """The multi-job hang: workers move between jobs whose models have different class counts."""

    def test_twenty_concurrent_jobs_all_succeed_identical_to_solo_runs(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 24, [(16, 16), (12, 20)],
                                    classes=2)
        models = [tt.fixture("red_vs_rest.pt"), tt.fixture("three_class.pt")]
        flags = ["--metrics", "dice,hd95", "--shard-size", "4", "--batch-size", "2"]
        solo = {}
        for m in models:
            solo[m] = os.path.join(root, "solo-" + os.path.basename(m))
            tt.tally_run(m, manifest, solo[m], "--workers", "1", *flags)
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        for _ in range(3):
            cluster.start_worker()
        cluster.wait_registered(3)
        for round_ in range(2):
            with concurrent.futures.ThreadPoolExecutor(20) as pool:
                jobs = list(pool.map(lambda i: (models[i % 2], cluster.submit(models[i % 2], manifest, *flags)),
                                     range(20)))
            for model, job in jobs:
                done = cluster.wait(job, timeout=240)
                self.assertEqual(done["state"], "succeeded", job)
                out = os.path.join(root, f"out-{round_}-{job}")
                cluster.fetch(job, out)
                self.assertTrue(tt.same_files(solo[model], out), f"round {round_} job {job} differs from solo")
                self.assertTrue(tt.read_report(out)["complete"])


class BadWorkerTest(unittest.TestCase):
    def test_broken_worker_next_to_a_good_one_fails_no_job(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 12, set())
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        broken = cluster.start_worker(device="cuda:7", name="broken")
        self.assertEqual(broken.wait(60), 3)  # Out of service: restarting will not help.
        cluster.start_worker(name="good")
        jobs = [cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--shard-size", "4") for _ in range(3)]
        for job in jobs:
            self.assertEqual(cluster.wait(job)["state"], "succeeded")
        workers = cluster.cli("workers").stdout
        self.assertRegex(workers, r"broken\s+cuda:7\s+out of service")
        self.assertIn("reason: device 'cuda:7'", workers)
        self.assertRegex(workers, r"good\s+cpu\s+serving")
        self.assertIn("taken out of service", cluster.log("tallyd.log"))


    def test_worker_batch_size_that_breaks_the_alignment_is_refused(self):
        p = subprocess.run([os.path.join(tt.BIN, "tally-worker"), "--coordinator", "127.0.0.1:1", "--batch-size", "12"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--batch-size 12 must divide 32", p.stderr)


def can_bind_mount():
    """Whether this host lets the tests give one process its own view of a file (a mount namespace)."""
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        for path, text in ((a, "a"), (b, "b")):
            with open(path, "w") as f:
                f.write(text)
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", f"mount --bind {b} {a} && cat {a}"],
                           capture_output=True, text=True)
        return p.returncode == 0 and p.stdout == "b"


class ModelFileTest(unittest.TestCase):
    """Found by probing: one of three workers saw another file at the job's model path (its own mount
    namespace, as a host with a stale copy would) and 182 of 624 rows came from the wrong model."""

    def start_worker_seeing(self, cluster, path, other, *extra):
        """A worker in a mount namespace of its own, where `other` is bind-mounted over `path`."""
        i = len(cluster.workers)
        log = open(os.path.join(cluster.root, f"worker-{i}.log"), "w")
        cluster.logs.append(log)
        cmd = " ".join([os.path.join(tt.BIN, "tally-worker"), "--coordinator", cluster.address, "--threads", "1",
                        "--name", f"stale{i}"] + list(extra))
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              f"mount --bind {other} {path} && exec {cmd}"], stdout=log, stderr=subprocess.STDOUT)
        cluster.workers.append(p)
        return p

    def setUp(self):
        if not can_bind_mount():
            self.skipTest("mount namespaces are not available here (unshare --mount)")

    def test_a_worker_with_another_copy_refuses_the_job_and_is_named(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 60, [(12, 12), (9, 14)])
        model = os.path.join(root, "model.pt")
        shutil.copy(tt.fixture("conv3.pt"), model)
        reference = os.path.join(root, "reference")
        tt.tally_run(model, manifest, reference, "--workers", "1", "--shard-size", "8", "--batch-size", "4")
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        self.start_worker_seeing(c, model, tt.fixture("conv3_retrained.pt"))
        c.start_worker()
        c.wait_registered(3)
        job = c.submit(model, manifest, "--shard-size", "8", "--batch-size", "4")
        self.assertEqual(c.wait(job, timeout=240)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        self.assertTrue(tt.same_files(reference, out), "rows from the other model were committed")
        report = tt.read_report(out)
        # It leased a shard, gave it back unevaluated: no row of the job is its.
        self.assertEqual([w["images"] for w in report["workers"] if w["name"] == "stale1"], [0])
        self.assertEqual(sum(w["images"] for w in report["workers"]), 60)
        warning = [w for w in report["warnings"] if "sees another file at the job's model path" in w]
        self.assertEqual(len(warning), 1, report["warnings"])
        here = tt.sha256_file(tt.fixture("conv3_retrained.pt"))
        want = tt.sha256_file(model)
        self.assertIn(f"worker 'stale1' on {os.uname().nodename} sees another file at the job's model path '{model}' "
                      f"(sha256 {here} here, {want} when the job was submitted", warning[0])
        self.assertEqual(report["provenance"]["model_sha256"], want)
        # The worker stays in service for other jobs.
        self.assertIn("serving", [l.split()[3] for l in c.cli("workers").stdout.splitlines()[1:] if "stale1" in l][0])

    def test_no_worker_with_the_jobs_file_fails_it_with_the_reason(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 4, set())
        model = os.path.join(root, "model.py")
        with open(model, "w") as f:
            f.write("class Model:\n    pass\n")
        weights = os.path.join(root, "weights.bin")
        with open(weights, "wb") as f:
            f.write(b"the weights the job was submitted with")
        stale = os.path.join(root, "stale.bin")
        with open(stale, "wb") as f:
            f.write(b"an older copy")
        c = tt.Cluster(self, os.path.join(root, "c"))
        self.start_worker_seeing(c, weights, stale)
        c.wait_registered(1)
        job = c.submit(model, manifest, "--model-option", f"weights={weights}")
        j = c.wait(job, timeout=120)
        self.assertEqual(j["state"], "failed")
        p = c.cli("status", job)
        self.assertIn("no worker in service has the job's model file", p.stdout)
        self.assertIn(f"sees another file at the job's --model-option weights path '{weights}'", p.stdout)


class MemoryBudgetTest(unittest.TestCase):
    """Found by probing: one 4000x4000 PNG made the demo model's CPU worker peak at 2.7 GB, so on a small
    machine the kernel killed the worker instead of Tally failing the row. Now the worker knows its
    budget (--max-worker-memory) and what a row needs (the model's bytes a pixel, measured at start)."""

    def write_pair(self, root, name, h, w):
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.zeros((h, w, 3), np.uint8)
        img[..., 0] = (xx * 255 // max(1, w - 1)).astype(np.uint8)  # A gradient: small files, quick to write.
        img[..., 2] = (yy * 255 // max(1, h - 1)).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(root, name + ".png"))
        Image.fromarray(((xx > w // 2).astype(np.uint8))).save(os.path.join(root, name + "_mask.png"))
        return f"{name},{name}.png,{name}_mask.png"

    def test_a_row_that_cannot_fit_fails_with_the_reason_and_the_worker_lives(self):
        root = tt.tmpdir(self)
        demo = os.path.join(tt.SRC, "examples", "demo")
        rows = [self.write_pair(root, "big", 4000, 4000)]
        for i in (0, 1):
            shutil.copy(os.path.join(demo, "images", f"case_00{i}.png"), os.path.join(root, f"case_00{i}.png"))
            shutil.copy(os.path.join(demo, "masks", f"case_00{i}.png"), os.path.join(root, f"mask_00{i}.png"))
            rows.append(f"case_00{i},case_00{i}.png,mask_00{i}.png")
        manifest = os.path.join(root, "m.csv")
        with open(manifest, "w") as f:
            f.write("id,image,mask\n" + "\n".join(rows) + "\n")
        out = os.path.join(root, "out")
        p = tt.tally("run", "--workers", "1", "--max-worker-memory", "1GiB", "--model", os.path.join(demo, "model.pt"),
                     "--manifest", manifest, "--out", out, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)  # Succeeded, with more failed rows than allowed (0).
        self.assertNotIn("exited", p.stderr)  # No worker died.
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (2, 1))
        reason = report["failures"][0]["reason"]
        # The demo model holds some 100-150 bytes a pixel at 4000x4000, measured by the worker at start
        # (2.4 GiB on one machine, 1.5 GiB on another; docs/data.md "Bad input"): more than the budget, whatever it is here.
        m = re.match(r"^image '.*big\.png' needs about ([0-9.]+) GiB for 4000x4000; this worker may use "
                     r"1\.0 GiB \(--max-worker-memory\); try --input-size", reason)
        self.assertIsNotNone(m, reason)
        self.assertGreater(float(m.group(1)), 1.0, reason)
        with open(os.path.join(out, ".tally", "worker-0.log")) as f:
            log = f.read()
        self.assertIn("memory budget 1.0 GiB", log)

    def test_a_batch_splits_to_fit_and_gives_the_same_results(self):
        root = tt.tmpdir(self)
        rows = [self.write_pair(root, f"r{i}", 1000, 1000) for i in range(6)]
        manifest = os.path.join(root, "m.csv")
        with open(manifest, "w") as f:
            f.write("id,image,mask\n" + "\n".join(rows) + "\n")
        model = os.path.join(tt.SRC, "examples", "demo", "model.pt")
        free, tight = os.path.join(root, "free"), os.path.join(root, "tight")
        tt.tally("run", "--workers", "1", "--batch-size", "8", "--model", model, "--manifest", manifest, "--out", free,
                 "--max-failed-fraction", "1")
        # 1000x1000 rows need some 170 MB each: 512 MiB fits three of the batch of six at a time.
        tt.tally("run", "--workers", "1", "--batch-size", "8", "--max-worker-memory", "512MiB", "--model", model,
                 "--manifest", manifest, "--out", tight, "--max-failed-fraction", "1")
        self.assertEqual(tt.read_report(tight)["images_evaluated"], 6)
        self.assertTrue(tt.same_files(free, tight))
        with open(os.path.join(tight, ".tally", "worker-0.log")) as f:
            log = f.read()
        self.assertRegex(log, r"a batch of 6 rows of 1000x1000 runs as [23] launches to fit the memory budget of 512 MiB")


class BadRowsTest(unittest.TestCase):
    def test_image_on_which_the_model_raises_fails_alone(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 12, {5})
        out = os.path.join(root, "out")
        p = tt.tally_run(tt.fixture("raises_on_mark.pt"), manifest, out, "--batch-size", "4", "--workers", "2")
        self.assertIn("1 failed", p.stdout)
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (11, 1))
        self.assertEqual(report["failures"][0]["index"], 5)
        self.assertIn("cannot handle this input", report["failures"][0]["reason"])
        # The neighbours in its batch were evaluated, with the hand-worked counts (class 1 on the
        # left half predicted, top half in the mask: 16 of each on 8x8).
        rows = [r for r in tt.read_per_image(out) if r["class"] == "1"]
        self.assertEqual(sorted(int(r["index"]) for r in rows), [i for i in range(12) if i != 5])
        for r in rows:
            self.assertEqual((r["tp"], r["fp"], r["fn"], r["tn"]), ("16", "16", "16", "16"))

    def test_nan_logits_fail_the_row_or_are_counted_with_warn(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 4, {2})
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("nan_on_mark.pt"), manifest, out)
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (3, 1))
        self.assertIn("model output has 128 non-finite values", report["failures"][0]["reason"])  # 8x8x2
        warn = os.path.join(root, "warn")
        tt.tally_run(tt.fixture("nan_on_mark.pt"), manifest, warn, "--nonfinite", "warn")
        report = tt.read_report(warn)
        self.assertEqual(report["images_evaluated"], 4)
        self.assertEqual((report["nonfinite_images"], report["nonfinite_values"]), (1, 128))
        rows = tt.read_per_image(warn)
        self.assertEqual({r["index"]: r["nonfinite"] for r in rows}, {"0": "0", "1": "0", "2": "128", "3": "0"})
        with open(os.path.join(warn, "summary.md")) as f:
            self.assertIn("NaN/Inf", f.read())

    def test_header_bombs_and_fifos_fail_their_rows_and_memory_stays_bounded(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 4, set())
        data = os.path.dirname(manifest)
        png_header_bomb(os.path.join(data, "bomb.png"), 60000, 60000)
        png_header_bomb(os.path.join(data, "bomb_mask.png"), 60000, 60000, color=0)
        os.mkfifo(os.path.join(data, "fifo.png"))
        # One large but allowed image (5000x5000, 75 MB of RGB): its buffers are given back afterwards.
        Image.fromarray(np.zeros((5000, 5000, 3), np.uint8)).save(os.path.join(data, "big.png"))
        Image.fromarray(np.zeros((5000, 5000), np.uint8)).save(os.path.join(data, "big_mask.png"))
        hostile = os.path.join(data, "hostile.csv")
        with open(manifest) as f, open(hostile, "w") as g:
            good = f.read().splitlines()
            # The large image comes before good rows: reusable buffers shrink back on the next batches.
            g.write("\n".join(good + ["big,big.png,big_mask.png", "bomb,bomb.png,mask.png",
                                      "bombmask,i000.png,bomb_mask.png", "fifo,fifo.png,mask.png",
                                      "fifomask,i000.png,fifo.png"] + [r.replace("r0", "again") for r in good[1:]]))
            g.write("\n")
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        worker = cluster.start_worker()
        # The worker's own baseline: model loaded, pipeline warm, on this build (CPU or CUDA LibTorch).
        warm = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--batch-size", "1")
        self.assertEqual(cluster.wait(warm)["state"], "succeeded")
        baseline = tt.proc_status(worker.pid, "VmRSS")
        job = cluster.submit(tt.fixture("red_vs_rest.pt"), hostile, "--batch-size", "1")
        self.assertEqual(cluster.wait(job, timeout=120)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (9, 4))
        reasons = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertIn("declares 60000x60000 pixels (3600000000)", reasons["bomb"])
        self.assertIn("bomb.png", reasons["bomb"])
        self.assertIn("mask", reasons["bombmask"])
        self.assertIn("declares 60000x60000", reasons["bombmask"])
        self.assertIn("is a FIFO, not a regular file", reasons["fifo"])
        self.assertIn("is a FIFO, not a regular file", reasons["fifomask"])
        # The bomb was never allocated (10.8 GB of RGB), and the large image's buffers went back.
        peak = tt.proc_status(worker.pid, "VmHWM")
        self.assertLess(peak - baseline, 4 << 30, f"worker peak {peak} bytes over a baseline of {baseline}")
        rss = tt.proc_status(worker.pid, "VmRSS")
        print(f"worker memory: baseline {baseline >> 20} MiB, peak {peak >> 20} MiB, after {rss >> 20} MiB")
        self.assertLess(rss - baseline, 64 << 20, f"worker memory {rss} bytes after the job, baseline {baseline}")

    def test_forward_pass_past_the_batch_timeout_fails_the_row_and_restarts_the_worker(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 10, {5})
        out = os.path.join(root, "out")
        p = tt.tally_run(tt.fixture("hangs_on_mark.pt"), manifest, out, "--batch-size", "4", "--shard-size", "4",
                         "--batch-timeout", "2", "--lease-seconds", "3")
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (9, 1))
        self.assertEqual(report["failures"][0]["index"], 5)
        self.assertIn("timed out after 2 s", report["failures"][0]["reason"])
        self.assertIn("forward pass", report["failures"][0]["reason"])
        self.assertIn("exit code 75", p.stderr)  # The worker restarted itself (twice: batch, then row).

    def test_invalid_utf8_fails_the_submission_with_line_and_column(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 2, set())
        with open(manifest, "ab") as f:
            f.write(b"caf\xe9,i000.png,mask.png\n")
        start = time.time()
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), manifest, os.path.join(root, "out"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("line 4, column 1 ('id'): invalid UTF-8 (byte 0xE9", p.stderr)
        self.assertLess(time.time() - start, 60)


class ServiceLimitsTest(unittest.TestCase):
    def test_oversized_name_is_refused_and_listing_keeps_working(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 2, set())
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        p = cluster.cli("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--name",
                        "x" * 100000, check=False)
        # The CLI refuses it before sending (a usage error, exit 2), and so does tallyd (another client).
        self.assertEqual(p.returncode, 2)
        self.assertIn("'name' is 100000 bytes; the limit is 256", p.stderr)
        from tally.client import Client, TallyError
        with Client(cluster.address) as client:
            with self.assertRaises(TallyError) as refused:
                client.submit(manifest, tt.fixture("red_vs_rest.pt"), name="x" * 100000)
            self.assertIn("'name' is 100000 bytes; the limit is 256", str(refused.exception))
        ok = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--name", "fine")
        jobs = cluster.cli("jobs").stdout.splitlines()
        self.assertEqual(jobs[0].split()[:2], ["JOB", "STATE"])  # A header, then one line per job.
        self.assertEqual(len(jobs), 2)
        self.assertEqual(jobs[1].split()[0], ok)
        self.assertIn(" fine ", jobs[1])

    def test_delete_removes_a_finished_job(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 4, set())
        cluster = tt.Cluster(self, os.path.join(root, "cluster"))
        cluster.start_worker()
        job = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest)
        cluster.wait(job)
        cluster.fetch(job, os.path.join(root, "out"))
        self.assertEqual(cluster.cli("delete", job).stdout.strip(), f"deleted {job}")
        self.assertNotIn(job, cluster.cli("jobs").stdout)
        self.assertFalse(os.path.exists(os.path.join(cluster.state, "reports", job)))
        p = cluster.cli("status", job, check=False)
        self.assertIn("no job", p.stderr)


class RecoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-rec-")
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(31), 160,
                                        [(48, 48)], classes=2)
        cls.flags = ["--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4"]
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(tt.fixture("slow.pt"), cls.manifest, cls.reference, "--workers", "1", *cls.flags)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

    def wait_log(self, cluster, needle, timeout=10):
        deadline = time.time() + timeout  # Health follows the database within a second.
        while needle not in cluster.log("tallyd.log") and time.time() < deadline:
            time.sleep(0.1)
        self.assertIn(needle, cluster.log("tallyd.log"))

    def test_watch_rides_out_a_coordinator_restart(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root)
        cluster.start_worker()
        job = cluster.submit(tt.fixture("slow.pt"), self.manifest, *self.flags)
        watch = subprocess.Popen([os.path.join(tt.BIN, "tally"), "watch", job, "--server", cluster.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: watch.poll() is None and watch.kill())
        self.assertLess(cluster.wait_for_progress(job, 0.2)["done"], 160)
        cluster.tallyd.send_signal(signal.SIGKILL)
        cluster.tallyd.wait(10)
        time.sleep(1.0)
        cluster.start_tallyd()
        out, err = watch.communicate(timeout=240)
        self.assertEqual(watch.returncode, 0, err)
        self.assertIn("reconnecting", err)
        self.assertIn("succeeded", out)
        fetched = os.path.join(root, "out")
        cluster.fetch(job, fetched)
        self.assertTrue(tt.same_files(self.reference, fetched))

    def test_full_disk_stalls_the_job_visibly_and_it_resumes(self):
        root = tt.tmpdir(self)
        state = os.path.join(root, "state")
        os.makedirs(state)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", state],
                          capture_output=True).returncode != 0:
            self.skipTest("mounting a small tmpfs is not permitted here (needs root or CAP_SYS_ADMIN)")
        self.addCleanup(subprocess.run, ["umount", "-l", state])
        cluster = tt.Cluster(self, root, state=state)
        cluster.start_worker()
        job = cluster.submit(tt.fixture("slow.pt"), self.manifest, *self.flags)
        cluster.wait_for_progress(job, 0.2)
        filler = os.path.join(state, "filler")
        # Unbuffered: a buffered file would keep the bytes that did not fit and raise ENOSPC again
        # when closed.
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        deadline = time.time() + 120
        while True:
            j = cluster.job(job)
            if j["stalled"] or time.time() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(j["state"], "running")
        self.assertEqual(j["stalled"], f"stalled: database or disk is full ({state})")
        self.wait_log(cluster, "health: NOT_SERVING")
        os.unlink(filler)
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        self.wait_log(cluster, "health: SERVING")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertTrue(tt.same_files(self.reference, out))
        self.assertTrue(tt.read_report(out)["complete"])


if __name__ == "__main__":
    unittest.main()
