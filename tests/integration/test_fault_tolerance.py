"""Processes die; results do not get lost or counted twice."""
import base64
import os
import re
import signal
import subprocess
import threading
import time
import unittest

import numpy as np

import tallytest as tt


def figures(out):
    """report.html's thumbnails: (class, row index) -> JPEG bytes."""
    with open(os.path.join(out, "report.html")) as f:
        html = f.read()
    pattern = r'<figure data-index="(\d+)" data-class="(\d+)"><img src="data:image/jpeg;base64,([A-Za-z0-9+/=]+)"'
    return {(int(c), int(i)): base64.b64decode(b) for i, c, b in re.findall(pattern, html)}


def kill_and_restart_tallyd(test, cluster, root):
    """SIGKILLs the cluster's tallyd and starts another on its port and state, logging to
    ROOT/tallyd2.log."""
    port = cluster.address.split(":")[1]
    cluster.tallyd.send_signal(signal.SIGKILL)
    cluster.tallyd.wait(10)
    with open(os.path.join(root, "tallyd2.log"), "w") as log:
        tallyd = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", f"127.0.0.1:{port}", "--state-dir",
                                   cluster.state, "--lease-seconds", "2"], stdout=log, stderr=subprocess.STDOUT)
    test.addCleanup(lambda: (tallyd.poll() is None and tallyd.terminate(), tallyd.wait(10)))


class FaultToleranceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-ft-")
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(23), 240,
                                        [(48, 48), (40, 56)], classes=2)
        # The undisturbed run every disturbed run must reproduce exactly.
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(tt.fixture("slow.pt"), cls.manifest, cls.reference, "--workers", "1", "--metrics", "dice,hd95",
                     "--shard-size", "8", "--batch-size", "4")

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.root, True)

    def assert_same_as_reference(self, out):
        with open(os.path.join(self.reference, "per_image.csv"), "rb") as a, \
                open(os.path.join(out, "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 240)
        self.assertEqual(report["images_failed"], 0)
        self.assertTrue(report["complete"])
        rows = tt.read_per_image(out)
        keys = [(r["index"], r["class"]) for r in rows]
        self.assertEqual(len(keys), len(set(keys)))  # No row counted twice.
        self.assertEqual(len(keys), 240 * 2)
        self.assertEqual(sum(w["images"] for w in report["workers"]), 240)

    def test_sigkill_of_a_worker_mid_job_loses_nothing(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        for _ in range(3):
            cluster.start_worker()
        cluster.wait_registered(3)
        job = cluster.submit(tt.fixture("slow.pt"), self.manifest, "--metrics", "dice,hd95", "--shard-size", "8",
                             "--batch-size", "4")
        at_kill = cluster.wait_for_progress(job, 0.25)
        self.assertLess(at_kill["done"], 240, "the job finished before the kill; make it slower")
        victim = cluster.workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        done = cluster.wait(job)
        self.assertEqual(done["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assert_same_as_reference(out)
        log = cluster.log("tallyd.log")
        self.assertIn("stopped responding", log)
        # Its shards were lost with it: their rows not yet committed are tried one at a time.
        self.assertIn("its rows are tried one at a time, each alone on its worker", log)

    def test_a_stopping_worker_whose_coordinator_stopped_answering_ends_after_its_flush(self):
        # tallyd frozen (SIGSTOP): its connections stay open and no call is answered. A worker told to
        # stop finishes its rows, tries for its 10 s flush, and ends: the report call in flight is
        # cancelled, not waited out to its 60 s deadline. Its rows are redone once tallyd answers again.
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        worker = cluster.start_worker()
        cluster.wait_registered(1)
        job = cluster.submit(tt.fixture("slow.pt"), self.manifest, "--metrics", "dice,hd95", "--shard-size", "8",
                             "--batch-size", "4")
        cluster.wait_for_progress(job, 0.1)
        cluster.tallyd.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: cluster.tallyd.poll() is None and cluster.tallyd.send_signal(signal.SIGCONT))
        time.sleep(1.5)  # The reporter's next call (every 0.5 s) goes out to the frozen tallyd.
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(40)
        except subprocess.TimeoutExpired:
            self.fail("the stopping worker waited on a call's deadline: " + cluster.log("worker-0.log")[-2000:])
        self.assertEqual(code, 0)
        log = cluster.log("worker-0.log")
        self.assertIn("stopping: finishing the rows in hand", log)
        self.assertIn("left unsent at exit", log)
        cluster.tallyd.send_signal(signal.SIGCONT)
        cluster.start_worker()
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assert_same_as_reference(out)

    def test_coordinator_killed_and_restarted_resumes_the_job(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        for _ in range(2):
            cluster.start_worker()
        cluster.wait_registered(2)
        job = cluster.submit(tt.fixture("slow.pt"), self.manifest, "--metrics", "dice,hd95", "--shard-size", "8",
                             "--batch-size", "4")
        cluster.wait_for_progress(job, 0.3)
        kill_and_restart_tallyd(self, cluster, root)
        done = cluster.wait(job)
        self.assertEqual(done["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assert_same_as_reference(out)
        self.assertIn("resuming job", cluster.log("tallyd2.log"))


class StackDumpTest(unittest.TestCase):
    def test_sigquit_prints_every_threads_stack_and_the_processes_carry_on(self):
        # kill -QUIT: a stuck process shows where each thread waits, and goes on working.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(4), 8, [(16, 16)], classes=2)
        cluster = tt.Cluster(self, root)
        worker = cluster.start_worker()
        cluster.wait_registered(1)
        for p, log in ((worker, "worker-0.log"), (cluster.tallyd, "tallyd.log")):
            threads = len(os.listdir(f"/proc/{p.pid}/task"))
            os.kill(p.pid, signal.SIGQUIT)
            deadline = time.time() + 10
            while "=== end of stacks" not in cluster.log(log) and time.time() < deadline:
                time.sleep(0.1)
            text = cluster.log(log)
            self.assertIn("=== SIGQUIT: every thread's stack", text)
            self.assertIn("=== end of stacks", text)
            # Every thread (a few may come or go meanwhile), each with its frames.
            self.assertGreaterEqual(text.count("--- thread "), threads - 2, text)
            self.assertRegex(text, r"--- thread \d+ \([^)]*\):\n\S+\(")
            self.assertIsNone(p.poll())
        job = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--metrics", "dice")
        self.assertEqual(cluster.wait(job)["state"], "succeeded")


def fixed_layout_runs(root, manifest, flags):
    """layout_marks.pt (it predicts the other class when run channels-last) on one worker with
    each layout given: {"on": out folder, "off": out folder}."""
    fixed = {}
    for layout in ("on", "off"):
        fixed[layout] = os.path.join(root, f"fixed-{layout}")
        tt.tally_run(tt.fixture("layout_marks.pt"), manifest, fixed[layout], "--workers", "1", "--channels-last",
                     layout, *flags)
    return fixed


class LayoutResolutionTest(unittest.TestCase):
    """--channels-last auto: the first worker's trial decides for the whole job (the coordinator
    keeps the first proposal, in the database), so every result comes from one layout."""

    def test_first_proposal_wins_and_survives_a_restart(self):
        import grpc
        import tally_pb2
        import tally_pb2_grpc
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 12, [(24, 32)], classes=2)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        job = cluster.submit(tt.fixture("conv3.pt"), manifest, "--metrics", "dice", "--batch-size", "4")

        def resolve(proposal, trial, job_id=job):
            with grpc.insecure_channel(cluster.address) as channel:
                stub = tally_pb2_grpc.WorkerControlStub(channel)
                return stub.ResolveLayout(tally_pb2.ResolveLayoutRequest(
                    worker_id="probe", job_id=job_id, channels_last=proposal, trial=trial), timeout=10).channels_last

        self.assertEqual(resolve("on", "trial A"), "on")
        self.assertEqual(resolve("off", "trial B"), "on")  # Later proposals get the job's choice.
        for bad, code in ((("maybe", "x"), grpc.StatusCode.INVALID_ARGUMENT),
                          (("off", "x", "no-such-job"), grpc.StatusCode.NOT_FOUND)):
            with self.assertRaises(grpc.RpcError) as e:
                resolve(*bad)
            self.assertEqual(e.exception.code(), code)
        kill_and_restart_tallyd(self, cluster, root)
        deadline = time.time() + 30
        while True:
            try:
                self.assertEqual(resolve("off", "trial C"), "on")  # Kept in the database.
                break
            except grpc.RpcError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        cluster.start_worker()  # A CPU worker runs the resolved layout (no trial of its own).
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        report = tt.read_report(out)
        self.assertEqual((report["channels_last_mode"], report["channels_last"], report["channels_last_trial"]),
                         ("auto", "on", "trial A"))
        self.assertEqual(report["images_evaluated"], 12)

    def test_a_trial_beside_the_evaluation_holds_its_rows_back_until_the_layout_is_agreed(self):
        # With no kept answer, a worker evaluates rows in its current layout while the trial runs
        # beside them, holds their results until the job's layout is agreed, then delivers them
        # (the same layout) or evaluates them again (the other). layout_marks.pt predicts the other
        # class when run channels-last, so every row shows the layout its result came from; the
        # tests' hook TALLY_TEST_LAYOUT_TRIAL runs the trial on CPU workers with a given answer, ready
        # only after 0.4 s (rows are evaluated meanwhile). Reports, thumbnails included, must be
        # those of the answer's fixed layout, with one worker or two.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(12), 64, [(24, 32)], classes=2)
        flags = ("--metrics", "dice,hd95", "--batch-size", "4", "--shard-size", "16")
        fixed = fixed_layout_runs(root, manifest, flags)
        self.assertFalse(tt.same_files(fixed["on"], fixed["off"]))  # The layouts' results differ.
        # "inline": as on a GPU with no room for the trial's copy beside the evaluation, the trial
        # runs on the batcher after the first batch (whose results are held all the same).
        for answer, workers, how in (("on", 1, "0.4"), ("on", 2, "0.4"), ("off", 1, "0.4"), ("off", 2, "0.4"),
                                     ("on", 1, "inline")):
            run = os.path.join(root, f"{answer}-{workers}-{how}")
            cluster = tt.Cluster(self, run)
            for _ in range(workers):
                cluster.start_worker(env={"TALLY_TEST_LAYOUT_TRIAL": f"{answer}:{how}"})
            cluster.wait_registered(workers)
            job = cluster.submit(tt.fixture("layout_marks.pt"), manifest, *flags)
            self.assertEqual(cluster.wait(job)["state"], "succeeded")
            out = os.path.join(run, "out")
            cluster.fetch(job, out)
            report = tt.read_report(out)
            self.assertEqual((report["channels_last_mode"], report["channels_last"]), ("auto", answer))
            if how == "inline":
                self.assertNotIn("the trial beside the evaluation", report["channels_last_trial"])
            else:
                self.assertIn("the trial beside the evaluation", report["channels_last_trial"])
            self.assertEqual(report["images_evaluated"], 64)
            self.assertTrue(tt.same_files(out, fixed[answer]), (answer, workers))
            self.assertEqual(figures(out), figures(fixed[answer]), (answer, workers))
            logs = "".join(cluster.log(f"worker-{k}.log") for k in range(workers))
            said = re.findall(r"layout trial beside the evaluation: (\d+) rows evaluated meanwhile (are \w+)", logs)
            self.assertTrue(said, logs)
            self.assertTrue(all(int(n) > 0 for n, _ in said), said)  # The first batch at least.
            self.assertEqual({verb for _, verb in said}, {"are evaluated" if answer == "on" else "are delivered"})
            self.assertEqual("not beside the evaluation (TALLY_TEST_LAYOUT_TRIAL says there is no room)" in logs,
                             how == "inline")

    def test_held_rows_go_with_a_cancelled_job_and_a_stopping_worker_sends_them(self):
        # While its trial runs beside the evaluation a worker holds results back: a job cancelled
        # then leaves nothing behind (its held rows are dropped, the worker serves the next job),
        # and SIGTERM waits for the trial and sends the held rows, evaluated in the job's layout.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(13), 200, [(24, 32)], classes=2)
        flags = ("--metrics", "dice", "--batch-size", "4", "--shard-size", "16")
        fixed = os.path.join(root, "fixed")
        tt.tally_run(tt.fixture("layout_marks.pt"), manifest, fixed, "--workers", "1", "--channels-last", "on", *flags)
        cluster = tt.Cluster(self, root)
        holding = "layout trial beside the evaluation from the next batch on"

        def wait_for(log, text, timeout=30):
            deadline = time.time() + timeout
            while text not in cluster.log(log):
                self.assertLess(time.time(), deadline, cluster.log(log))
                time.sleep(0.05)

        def progress(job_id):
            """(done, total, held) from `tally status`: rows delivered, rows, rows evaluated and held."""
            status = cluster.cli("status", job_id).stdout
            done, total = status.split()[2].split("/")
            held = re.search(r"held: (\d+) more rows evaluated", status)
            return int(done), int(total), int(held.group(1)) if held else 0

        first = cluster.start_worker(env={"TALLY_TEST_LAYOUT_TRIAL": "on:4"})
        cancelled = cluster.submit(tt.fixture("layout_marks.pt"), manifest, *flags)
        wait_for("worker-0.log", holding)
        # While the trial runs, `tally status` shows the rows evaluated and held (from the worker's
        # heartbeats), and none of them as done: nothing is delivered before the layout is agreed.
        deadline = time.time() + 3
        while True:
            done, total, held = progress(cancelled)
            if held or time.time() > deadline:
                break
            time.sleep(0.1)
        self.assertGreater(held, 0)
        # Not necessarily whole batches of 4: a batch's rows are held one by one, and the heartbeat
        # sent as soon as the first is held may see part of it (a flake under load, seen once).
        self.assertLessEqual(held, 200)
        self.assertEqual((done, total), (0, 200))
        cluster.cli("cancel", cancelled)
        self.assertEqual(cluster.wait(cancelled)["state"], "cancelled")
        wait_for("worker-0.log", "more were dropped with their leases")
        first.send_signal(signal.SIGTERM)
        self.assertEqual(first.wait(30), 0)
        stopping = cluster.start_worker(env={"TALLY_TEST_LAYOUT_TRIAL": "on:2"})
        job = cluster.submit(tt.fixture("layout_marks.pt"), manifest, *flags)
        # Progress never counts a row twice: done (delivered) + held <= total at every moment,
        # also when the held rows are evaluated again and delivered.
        samples, watching = [], threading.Event()

        def watch():
            while not watching.is_set():
                samples.append(progress(job))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        wait_for("worker-1.log", holding)
        stopping.send_signal(signal.SIGTERM)
        self.assertEqual(stopping.wait(30), 0)
        watching.set()
        watcher.join()
        self.assertTrue(any(held > 0 for _, _, held in samples), samples)
        self.assertTrue(all(done + held <= total == 200 for done, total, held in samples), samples)
        log = cluster.log("worker-1.log")
        self.assertIn("stopping: finishing the rows in hand", log)
        self.assertIn("rows evaluated meanwhile are evaluated again in the job's layout", log)
        cluster.start_worker(env={"TALLY_TEST_LAYOUT_TRIAL": "off"})  # The job's layout is on by now.
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertEqual(tt.read_report(out)["channels_last"], "on")
        self.assertTrue(tt.same_files(out, fixed))

    def test_a_layout_trial_the_job_cannot_repay_is_skipped(self):
        # The trial runs only where the job's rows without a result can repay it; else the current layout stays, the report and the log
        # say why, and the results are the fixed layout's. TALLY_TEST_TRIAL_COST_SECONDS stands for
        # the trial's measured cost: 1000 s no 64-row job repays; 0 s any job does.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(14), 64, [(24, 32)], classes=2)
        flags = ("--metrics", "dice,hd95", "--batch-size", "4", "--shard-size", "16")
        fixed = fixed_layout_runs(root, manifest, flags)
        for cost, workers in (("1000", 1), ("1000", 2), ("0", 1)):
            run = os.path.join(root, f"cost-{cost}-{workers}")
            cluster = tt.Cluster(self, run)
            for _ in range(workers):
                cluster.start_worker(env={"TALLY_TEST_LAYOUT_TRIAL": "on:0.2", "TALLY_TEST_TRIAL_COST_SECONDS": cost})
            cluster.wait_registered(workers)
            jobs = [cluster.submit(tt.fixture("layout_marks.pt"), manifest, *flags)]
            if workers == 1:  # Saving predictions: the trial would run before the first batch.
                os.makedirs(os.path.join(run, "predictions"))
                jobs.append(cluster.submit(tt.fixture("layout_marks.pt"), manifest, *flags, "--save-predictions",
                                           os.path.join(run, "predictions")))
            for k, job in enumerate(jobs):
                self.assertEqual(cluster.wait(job)["state"], "succeeded")
                out = os.path.join(run, f"out{k}")
                cluster.fetch(job, out)
                report = tt.read_report(out)
                trial = report["channels_last_trial"]
                skipped = cost == "1000"
                self.assertEqual((report["channels_last_mode"], report["channels_last"]),
                                 ("auto", "off" if skipped else "on"), trial)
                self.assertEqual(trial.startswith("skipped: "), skipped, trial)
                if skipped:
                    self.assertIn("less than the trial's 1000.0 s (TALLY_TEST_TRIAL_COST_SECONDS)", trial)
                self.assertEqual(report["images_evaluated"], 64)
                self.assertTrue(tt.same_files(out, fixed[report["channels_last"]]), (cost, workers, k))
            logs = "".join(cluster.log(f"worker-{k}.log") for k in range(workers))
            expected = [int(n) for n in re.findall(r"layout trial skipped: (\d+) rows at", logs)]
            if not skipped:
                self.assertEqual(expected, [])
                continue
            # The job's rows left, whatever the number of workers (a choice made once for the job
            # must not depend on it): the first grant sees all 64.
            self.assertEqual(max(expected), 64, logs)
            self.assertTrue(all(0 < n <= 64 for n in expected), expected)
            self.assertIn("the contiguous layout stays (--channels-last on|off sets it)", logs)

    def test_a_loaded_model_serves_the_next_job(self):
        # The worker keeps the last job's model (keyed by the file's SHA-256 and the runner's
        # settings): a second job with the same model reuses it; another model replaces it.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(8), 16, [(24, 32)], classes=2)
        cluster = tt.Cluster(self, root)
        cluster.start_worker()
        cluster.wait_registered(1)
        outs = []
        for k, (model, flags) in enumerate((("conv3.pt", []), ("conv3.pt", []), ("conv3.pt", ["--precision", "bf16"]),
                                            ("three_class.pt", []))):
            job = cluster.submit(tt.fixture(model), manifest, "--metrics", "dice,hd95", *flags)
            self.assertEqual(cluster.wait(job)["state"], "succeeded")
            outs.append(os.path.join(root, f"out{k}"))
            cluster.fetch(job, outs[-1])
        log = cluster.log("worker-0.log")
        self.assertEqual(log.count("reusing it"), 1, log)  # Job 2 only: bf16 and another file load anew.
        self.assertEqual(log.count("loading model"), 3, log)
        self.assertEqual(log.count("unloaded the previous job's model"), 2, log)
        self.assertTrue(tt.same_files(outs[0], outs[1]))

    def test_jit_optimize_is_the_workers_and_leaves_cpu_results_alone(self):
        # --jit_optimize (off by default) turns TorchScript's graph optimisations on; they fuse
        # operators on CUDA only, so on the CPU both settings give the same bytes.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(9), 6, [(20, 28)], classes=3)
        outs = [os.path.join(root, "plain"), os.path.join(root, "optimized")]
        tt.tally_run(tt.fixture("conv3.pt"), manifest, outs[0], "--workers", "1", "--metrics", "dice,hd95")
        tt.tally_run(tt.fixture("conv3.pt"), manifest, outs[1], "--workers", "1", "--metrics", "dice,hd95",
                     "--worker-flags=--jit_optimize")
        self.assertEqual(tt.read_report(outs[1])["images_evaluated"], 6)
        self.assertTrue(tt.same_files(outs[0], outs[1]))

    def test_flag_values(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(6), 4, [(16, 16)], classes=2)
        for flags, mode, resolved in ((["--channels-last", "--metrics", "dice"], "on", "on"),  # Bare: on.
                                      (["--channels-last", "off"], "off", "off"),
                                      ([], "auto", "auto")):  # CPU workers run no trial.
            out = os.path.join(root, f"out-{mode}")
            tt.tally_run(tt.fixture("conv3.pt"), manifest, out, "--workers", "1", *flags)
            report = tt.read_report(out)
            self.assertEqual((report["channels_last_mode"], report["channels_last"]), (mode, resolved), flags)
        p = tt.tally_run(tt.fixture("conv3.pt"), manifest, os.path.join(root, "bad"), "--workers", "1",
                         "--channels-last", "sideways", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--channels-last: expected auto, on or off, got 'sideways'", p.stderr)


class DecodeResolutionTest(unittest.TestCase):
    """--decode cpu|gpu|auto: "auto" is resolved once per job like the layout (first proposal wins,
    kept in the database); a worker that cannot decode on a GPU says so instead of guessing."""

    def test_auto_resolves_once_per_job_and_every_row_follows_it(self):
        import grpc
        import tally_pb2
        import tally_pb2_grpc
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(15), 12, [(24, 32)], classes=2,
                                    jpeg_every=2)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        job = cluster.submit(tt.fixture("conv3.pt"), manifest, "--metrics", "dice", "--batch-size", "4",
                             "--decode", "auto")

        def resolve(**proposal):
            with grpc.insecure_channel(cluster.address) as channel:
                stub = tally_pb2_grpc.WorkerControlStub(channel)
                return stub.ResolveLayout(tally_pb2.ResolveLayoutRequest(worker_id="probe", job_id=job, **proposal),
                                          timeout=10)

        r = resolve(decode="cpu", decode_trial="trial D")
        self.assertEqual((r.decode, r.channels_last), ("cpu", ""))  # Only what was proposed comes back.
        self.assertEqual(resolve(decode="gpu", decode_trial="trial E").decode, "cpu")
        for bad in ({"decode": "tpu"}, {}):
            with self.assertRaises(grpc.RpcError) as e:
                resolve(**bad)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        cluster.start_worker()
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        report = tt.read_report(out)
        self.assertEqual((report["decode_mode"], report["decode"], report["decode_trial"]), ("auto", "cpu", "trial D"))
        self.assertEqual(report["images_evaluated"], 12)
        # The same rows with the CPU decoder chosen up front: the same results.
        ref = os.path.join(root, "ref")
        tt.tally_run(tt.fixture("conv3.pt"), manifest, ref, "--workers", "2", "--metrics", "dice", "--batch-size", "4")
        self.assertEqual(tt.read_report(ref)["decode"], "cpu")
        self.assertTrue(tt.same_files(out, ref))

    def test_a_cpu_worker_resolves_auto_to_the_cpu_and_refuses_gpu(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(16), 8, [(16, 16)], classes=2,
                                    jpeg_every=1)
        out = os.path.join(root, "auto")
        tt.tally_run(tt.fixture("conv3.pt"), manifest, out, "--workers", "1", "--decode", "auto")
        report = tt.read_report(out)
        self.assertEqual((report["decode_mode"], report["decode"]), ("auto", "cpu"))
        self.assertIn("nvJPEG unavailable", report["decode_trial"])
        self.assertEqual(report["images_evaluated"], 8)
        p = tt.tally_run(tt.fixture("conv3.pt"), manifest, os.path.join(root, "gpu"), "--workers", "1",
                         "--decode", "gpu", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--decode gpu: ", p.stdout + p.stderr)
        self.assertIn("use --decode cpu", p.stdout + p.stderr)
        for flags, message in ((["--decode", "fpga"], "--decode: expected cpu, gpu or auto, got 'fpga'"),):
            p = tt.tally_run(tt.fixture("conv3.pt"), manifest, os.path.join(root, "bad"), "--workers", "1", *flags,
                             check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(message, p.stderr)


class UnreachableCoordinatorTest(unittest.TestCase):
    def test_worker_retries_with_backoff_and_says_so(self):
        port = tt.free_port()
        start = time.time()
        p = subprocess.run([os.path.join(tt.BIN, "tally-worker"), "--coordinator", f"127.0.0.1:{port}",
                            "--max-connect-seconds", "3"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertGreaterEqual(time.time() - start, 3)
        self.assertGreaterEqual(p.stderr.count("cannot reach the coordinator"), 3)
        self.assertIn("retrying in", p.stderr)
        self.assertIn("gave up after", p.stderr)

    def test_worker_started_before_the_coordinator_joins_when_it_comes_up(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(1), 6, [(16, 16)], classes=2)
        port = tt.free_port()
        log = open(os.path.join(root, "worker.log"), "w")
        self.addCleanup(log.close)
        worker = subprocess.Popen([os.path.join(tt.BIN, "tally-worker"), "--coordinator", f"127.0.0.1:{port}"],
                                  stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: (worker.poll() is None and worker.terminate(), worker.wait(10)))
        # The coordinator comes up only once the worker has tried it (a loaded machine can take seconds
        # just to load the worker's libraries).
        deadline = time.time() + 60
        while "cannot reach the coordinator" not in open(os.path.join(root, "worker.log")).read():
            self.assertLess(time.time(), deadline, "the worker never tried the coordinator")
            time.sleep(0.1)
        with open(os.path.join(root, "tallyd.log"), "w") as tlog:
            tallyd = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", f"127.0.0.1:{port}",
                                       "--state-dir", os.path.join(root, "state")], stdout=tlog,
                                      stderr=subprocess.STDOUT)
        self.addCleanup(lambda: (tallyd.poll() is None and tallyd.terminate(), tallyd.wait(10)))
        server = f"127.0.0.1:{port}"
        time.sleep(0.5)
        job = tt.tally("submit", "--server", server, "--model", tt.fixture("red_vs_rest.pt"), "--manifest",
                       manifest).stdout.strip()
        w = tt.tally("watch", job, "--server", server)
        self.assertIn("succeeded", w.stdout)
        with open(os.path.join(root, "worker.log")) as f:
            text = f.read()
        self.assertIn("cannot reach the coordinator", text)
        self.assertIn("registered with the coordinator", text)


class UndeliveredGrantTest(unittest.TestCase):
    """A long poll answered with a grant just as its call ended (the worker cancelled it, or its
    deadline passed) never reached the worker: tallyd gives the shard back at once, no attempt
    counted, instead of keeping it leased until the worker falls silent (then counted a loss)."""

    def test_grants_that_do_not_reach_the_worker_are_given_back(self):
        import grpc
        import tally_pb2 as pb
        import tally_pb2_grpc
        root = tt.tmpdir(self)
        rows = 2000
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(8), rows, [(4, 4)], classes=2)
        cluster = tt.Cluster(self, root, lease_seconds=120.0)  # No lease ends by time in this test.
        job = cluster.submit(tt.fixture("conv3.pt"), manifest, "--batch-size", "1", "--shard-size", "1")
        pattern = r"released shard (\d+) of job \S+: its grant \(lease (\d+)\) did not reach the worker"
        with grpc.insecure_channel(cluster.address) as channel:
            stub = tally_pb2_grpc.WorkerControlStub(channel)
            worker = stub.RegisterWorker(pb.RegisterWorkerRequest(name="probe", device="cpu"), timeout=10).worker_id
            # Long polls whose deadlines (0.2 to 6 ms) end about when tallyd answers: some grants are
            # made for calls that end before the answer leaves tallyd. Rounds of them until tallyd has
            # given some back (or the job's shards run out).
            found = []
            for i in range(3 * rows):
                try:
                    stub.AcquireShard(pb.AcquireShardRequest(worker_id=worker, max_wait_ms=2000),
                                      timeout=0.0002 * (1 + i % 30))
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
                if i % 300 == 299:
                    found = re.findall(pattern, cluster.log("tallyd.log"))
                    if len(found) >= 3:
                        break
            given_back = [pb.HeldLease(job_id=job, shard_id=int(s), lease_id=int(lease))
                          for s, lease in re.findall(pattern, cluster.log("tallyd.log"))]
            self.assertGreater(len(given_back), 0, "no grant met a call that had ended: the case was not made")
            # The probe claims them: tallyd no longer counts them as the probe's.
            r = stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker, leases=given_back), timeout=10)
        self.assertEqual(sorted((x.shard_id, x.lease_id) for x in r.revoked),
                         sorted((x.shard_id, x.lease_id) for x in given_back))


if __name__ == "__main__":
    unittest.main()
