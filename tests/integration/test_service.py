"""A tallyd a whole lab shares, operated as a lab engineer would (README "Operating tallyd"):
restarts nobody notices (SIGTERM drains and hands the workers over; no row is evaluated twice),
spawned workers that end with their tallyd, waits that ride restarts, and jobs that share the
workers so that a quick check never waits behind a long job. Real processes throughout."""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import numpy as np

import tallytest as tt

PY = "/usr/bin/python3"  # Debian's, with numpy (the python3 first on PATH may lack it).

# Counts its own evaluations: one line per row it predicts, appended to the file `count` names
# (O_APPEND writes of one short line are atomic across the workers' processes). Predicts "red":
# the row's foreground is where red exceeds blue, so the results are the same whoever runs it.
COUNTING_MODEL = """
import os, time
import numpy as np

class Model:
    num_classes = 2

    def __init__(self, devices, options):
        self.count = options["count"]
        self.delay = float(options.get("delay", "0.03"))

    def predict(self, images, rows):
        time.sleep(self.delay * len(rows))
        with open(self.count, "a") as f:
            f.write("".join(f"{r['index']}\\n" for r in rows))
        return [(img[..., 0].astype(np.int32) > img[..., 2].astype(np.int32)).astype(np.int64) for img in images]
"""


def write_model(root):
    path = os.path.join(root, "counting.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(COUNTING_MODEL))
    return path


def evaluations(path):
    """Manifest index -> how many times the model evaluated it."""
    counts = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    counts[int(line)] = counts.get(int(line), 0) + 1
    return counts


def running(pid):
    """The process exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def restart(cluster, sig=signal.SIGTERM):
    """Stops tallyd with `sig` and starts it again on its port and state; returns the seconds from the
    signal to the new tallyd answering."""
    t0 = time.time()
    cluster.tallyd.send_signal(sig)
    cluster.tallyd.wait(30)
    cluster.start_tallyd()
    health = tt.tally("health", "--server", cluster.address, check=False)
    while health.returncode != 0 and time.time() - t0 < 60:
        time.sleep(0.05)
        health = tt.tally("health", "--server", cluster.address, check=False)
    return time.time() - t0


class RestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-svc-")
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(5), 96,
                                        [(24, 24), (20, 28)], classes=2)
        cls.model = write_model(cls.root)
        # The undisturbed run every disturbed one must reproduce.
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(cls.model, cls.manifest, cls.reference, "--python", PY, "--model-option",
                     "count=" + os.path.join(cls.root, "reference.count"), "--model-option", "delay=0",
                     "--workers", "1", "--batch-size", "4")

    def test_sigterm_restarts_under_load_evaluate_no_row_twice(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        for _ in range(2):
            cluster.start_worker()
        cluster.wait_registered(2)
        count = os.path.join(root, "count")
        job = cluster.submit(self.model, self.manifest, "--python", PY, "--model-option", "count=" + count,
                             "--batch-size", "4", "--shard-size", "8")
        gaps = []
        for fraction in (0.15, 0.4, 0.65):
            cluster.wait_for_progress(job, fraction)
            gaps.append(restart(cluster))
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        self.assertTrue(tt.same_files(self.reference, out))
        counts = evaluations(count)
        twice = sorted(i for i, n in counts.items() if n > 1)
        print(f"\nSIGTERM restarts under load: {len(twice)} rows evaluated twice, longest gap {max(gaps):.2f} s "
              f"(gaps {', '.join(f'{g:.2f}' for g in gaps)})", file=sys.stderr)
        self.assertEqual(sorted(counts), list(range(96)))
        self.assertEqual(twice, [], "rows evaluated twice across SIGTERM restarts")
        log = cluster.log("tallyd.log")
        self.assertIn("restored 2 worker(s)", log)
        self.assertNotIn("no longer knows this worker", cluster.log("worker-0.log") + cluster.log("worker-1.log"))
        self.assertLess(max(gaps), 15)

    def test_a_finished_shard_delivered_after_a_restart_is_accepted(self):
        # A worker in the middle of a slow shard when tallyd stops delivers it to the next tallyd,
        # which knows the worker and its lease: the shard is not evaluated again.
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=3.0, tallyd_args=["--drain-seconds", "0.5"])
        cluster.start_worker()
        cluster.wait_registered(1)
        count = os.path.join(root, "count")
        job = cluster.submit(self.model, self.manifest, "--python", PY, "--model-option", "count=" + count,
                             "--model-option", "delay=0.15", "--batch-size", "4", "--shard-size", "48")
        cluster.wait_for_progress(job, 0.05)
        restart(cluster)
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        counts = evaluations(count)
        self.assertEqual(sorted(counts), list(range(96)))
        self.assertEqual(max(counts.values()), 1)
        self.assertIn("shard(s) still out: their workers deliver them to the next tallyd", cluster.log("tallyd.log"))

    def test_health_says_not_serving_as_soon_as_sigterm_arrives(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=3.0, tallyd_args=["--drain-seconds", "3"])
        cluster.start_worker()
        cluster.wait_registered(1)
        job = cluster.submit(self.model, self.manifest, "--python", PY, "--model-option",
                             "count=" + os.path.join(root, "count"), "--model-option", "delay=0.2",
                             "--batch-size", "4", "--shard-size", "96")
        cluster.wait_for_progress(job, 0.02)
        cluster.tallyd.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        health = tt.tally("health", "--server", cluster.address, check=False)
        self.assertNotEqual(health.returncode, 0, health.stdout)
        self.assertIn("NOT_SERVING", health.stdout + health.stderr)
        cluster.tallyd.wait(30)

    def test_wait_rides_a_sigterm_restart_and_a_late_start(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        cluster.start_worker()
        cluster.wait_registered(1)
        job = cluster.submit(self.model, self.manifest, "--python", PY, "--model-option",
                             "count=" + os.path.join(root, "count"), "--batch-size", "4", "--shard-size", "8")
        waiter = subprocess.Popen([os.path.join(tt.BIN, "tally"), "wait", job, "--timeout", "60", "--server",
                                   cluster.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cluster.wait_for_progress(job, 0.2)
        restart(cluster)
        out, err = waiter.communicate(timeout=90)
        self.assertEqual(waiter.returncode, 0, err)
        self.assertIn("succeeded", out)
        self.assertNotIn("CANCELLED", err)
        # A wait started while tallyd is down waits for it to come up.
        cluster.tallyd.send_signal(signal.SIGTERM)
        cluster.tallyd.wait(30)
        late = subprocess.Popen([os.path.join(tt.BIN, "tally"), "wait", job, "--timeout", "60", "--server",
                                 cluster.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        self.assertIsNone(late.poll(), "tally wait gave up while tallyd was down")
        cluster.start_tallyd()
        out, err = late.communicate(timeout=90)
        self.assertEqual(late.returncode, 0, err)
        self.assertIn("succeeded", out)

    def test_python_client_wait_rides_a_sigterm_restart_and_a_late_start(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        cluster.start_worker()
        cluster.wait_registered(1)
        from tally.client import Client
        client = Client(cluster.address)
        submit = dict(python=PY, batch_size=4, shard_size=8)
        job = client.submit(self.manifest, self.model, model_options={"count": os.path.join(root, "a")}, **submit)
        result = {}
        waiter = threading.Thread(target=lambda: result.update(job=client.wait(job, timeout=60)))
        waiter.start()
        cluster.wait_for_progress(job, 0.2)
        restart(cluster)
        waiter.join(90)
        self.assertEqual(result["job"]["state"], "succeeded", result["job"].get("error"))
        # Started while tallyd is down: waits for it.
        second = client.submit(self.manifest, self.model, model_options={"count": os.path.join(root, "b")}, **submit)
        cluster.tallyd.send_signal(signal.SIGTERM)
        cluster.tallyd.wait(30)
        result.clear()
        waiter = threading.Thread(target=lambda: result.update(job=Client(cluster.address).wait(second, timeout=60)))
        waiter.start()
        time.sleep(2)
        self.assertTrue(waiter.is_alive(), "Client.wait gave up while tallyd was down")
        cluster.start_tallyd()
        waiter.join(90)
        self.assertEqual(result["job"]["state"], "succeeded")
        self.assertEqual(result["job"]["job_id"], second)
        # watch: the job each time it changes, ending with its end (here at once: it has ended).
        seen = list(Client(cluster.address).watch(second[:-2], timeout=30))
        self.assertEqual([j["state"] for j in seen], ["succeeded"])
        self.assertEqual(seen[-1]["images_evaluated"], 96)


class SpawnedWorkersTest(unittest.TestCase):
    def test_spawned_workers_end_with_a_killed_tallyd(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=5.0, tallyd_args=["--spawn-workers", "--workers", "2"])
        cluster.wait_registered(2)
        listed = json.loads(cluster.cli("workers", "--json").stdout)
        pids = [w["pid"] for w in listed["workers"] if w.get("state") == "serving"]
        self.assertEqual(len(pids), 2)
        cluster.tallyd.send_signal(signal.SIGKILL)
        cluster.tallyd.wait(10)
        t0 = time.time()
        alive = list(pids)
        while alive and time.time() - t0 < 5:  # One lease period.
            alive = [p for p in pids if running(p)]
            time.sleep(0.1)
        self.assertEqual(alive, [], "spawned workers outlived their tallyd's SIGKILL")


class SharingTest(unittest.TestCase):
    def test_a_small_job_behind_a_long_one_ends_first_and_both_equal_solo_runs(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(9)
        long_manifest = tt.write_dataset(os.path.join(root, "long"), rng, 320, [(24, 24)], classes=2)
        small_manifest = tt.write_dataset(os.path.join(root, "small"), rng, 24, [(24, 24)], classes=2)
        model = write_model(root)
        # Each job counts into a file of its own: a --model-option naming an existing file is hashed
        # at submission, and a file that changed since is refused as a stale copy.
        flags = ("--python", PY, "--model-option", "delay=0.04", "--batch-size", "4", "--shard-size", "8")
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        for _ in range(2):
            cluster.start_worker()
        cluster.wait_registered(2)
        long_job = cluster.submit(model, long_manifest, *flags, "--model-option", "count=" + os.path.join(root, "a"))
        cluster.wait_for_progress(long_job, 0.05)
        small_job = cluster.submit(model, small_manifest, *flags, "--model-option", "count=" + os.path.join(root, "b"))
        self.assertIn("workers:", cluster.cli("status", small_job).stdout)
        self.assertEqual(cluster.wait(small_job)["state"], "succeeded", cluster.cli("status", small_job).stdout)
        self.assertNotIn(cluster.job(long_job)["state"], ("succeeded", "failed", "cancelled"),
                         "the long job ended before the small one")
        self.assertEqual(cluster.wait(long_job)["state"], "succeeded")
        for job, manifest, name in ((long_job, long_manifest, "long"), (small_job, small_manifest, "small")):
            out = os.path.join(root, name + "-out")
            cluster.fetch(job, out)
            solo = os.path.join(root, name + "-solo")
            tt.tally_run(model, manifest, solo, "--python", PY, "--model-option",
                         "count=" + os.path.join(root, name + "-solo.count"), "--model-option", "delay=0",
                         "--batch-size", "4", "--workers", "1")
            self.assertTrue(tt.same_files(solo, out), name)

    def test_status_shows_the_queue_position_and_why_a_job_waits(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "d"), np.random.default_rng(2), 8, [(16, 16)], classes=2)
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        job = cluster.submit(tt.fixture("red_vs_rest.pt"), manifest)
        status = cluster.cli("status", job).stdout
        self.assertIn("queue position 1", status)
        self.assertIn("no worker in service yet", status)
        cluster.start_worker()
        self.assertEqual(cluster.wait(job)["state"], "succeeded")

    def test_priority_orders_an_owners_jobs(self):
        # One worker, two queued jobs of one owner: the later one with --priority 5 is leased first.
        root = tt.tmpdir(self)
        rng = np.random.default_rng(4)
        a = tt.write_dataset(os.path.join(root, "a"), rng, 16, [(16, 16)], classes=2)
        b = tt.write_dataset(os.path.join(root, "b"), rng, 16, [(16, 16)], classes=2)
        cluster = tt.Cluster(self, root, lease_seconds=3.0)
        first = cluster.submit(tt.fixture("red_vs_rest.pt"), a)
        urgent = cluster.submit(tt.fixture("red_vs_rest.pt"), b, "--priority", "5")
        self.assertIn("priority 5", cluster.cli("status", urgent).stdout)
        cluster.start_worker()
        cluster.wait(first)
        cluster.wait(urgent)
        started = {j: float(json.loads(cluster.cli("status", j, "--json").stdout)["started_unix"])
                   for j in (first, urgent)}
        self.assertLess(started[urgent], started[first])


class OperatorToolsTest(unittest.TestCase):
    def test_token_out_is_private_and_the_python_client_strips_it(self):
        root = tt.tmpdir(self)
        path = os.path.join(root, "alice.token")
        p = tt.tally("token", "alice", "client", "--out", path)
        self.assertEqual(p.stdout, "")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path) as f:
            text = f.read()
        self.assertTrue(text.endswith("\n"))
        tokens = os.path.join(root, "tokens")
        line = [l for l in p.stderr.splitlines() if "sha256:" in l][0].strip()
        tt.write_text(tokens, line + "\n")
        cluster = tt.Cluster(self, root, tallyd_args=["--auth-tokens", tokens])
        sys.path.insert(0, os.path.join(tt.SRC, "python"))
        from tally.client import Client
        client = Client(cluster.address, token=text)  # As read from the file, newline and all.
        self.assertEqual(client.jobs(), [])
        with self.assertRaises(ValueError) as e:
            Client(cluster.address, token="abc\x01def-secret")
        self.assertNotIn("secret", str(e.exception))

    def test_jobs_more_hint_keeps_the_server_and_filters(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "d"), np.random.default_rng(3), 4, [(8, 8)], classes=2)
        cluster = tt.Cluster(self, root)
        for i in range(3):
            cluster.submit(tt.fixture("red_vs_rest.pt"), manifest, "--label", "sweep=a b")
        p = cluster.cli("jobs", "--limit", "2", "--label", "sweep=a b", "--state", "queued")
        hint = [l for l in p.stderr.splitlines() if l.startswith("more: ")]
        self.assertEqual(len(hint), 1, p.stderr)
        cmd = hint[0][len("more: "):]
        self.assertIn(f"--server {cluster.address}", cmd)
        self.assertIn("--label 'sweep=a b'", cmd)
        self.assertIn("--state queued", cmd)
        self.assertIn("--limit 2", cmd)
        # The hint, run as printed, lists the third job.
        rest = subprocess.run(["bash", "-c", cmd.replace("tally ", os.path.join(tt.BIN, "tally") + " ", 1)],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(rest.returncode, 0, rest.stderr)
        self.assertEqual(len([l for l in rest.stdout.splitlines()[1:] if l.strip()]), 1)

    def test_admins_see_the_owner_column(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "d"), np.random.default_rng(3), 4, [(8, 8)], classes=2)
        tokens = os.path.join(root, "tokens")
        secrets = {}
        for name, role in (("alice", "client"), ("root", "admin")):
            out = os.path.join(root, name + ".token")
            p = tt.tally("token", name, role, "--tokens-file", tokens, "--out", out)
            secrets[name] = out
        cluster = tt.Cluster(self, root, tallyd_args=["--auth-tokens", tokens])
        tt.tally("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--server",
                 cluster.address, "--token-file", secrets["alice"])
        p = tt.tally("jobs", "--server", cluster.address, "--token-file", secrets["root"])
        header = p.stdout.splitlines()[0]
        self.assertIn("OWNER", header)
        self.assertIn("alice", p.stdout.splitlines()[1])


if __name__ == "__main__":
    unittest.main()
