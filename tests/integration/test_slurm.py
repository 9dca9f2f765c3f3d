"""deploy/slurm on a real Slurm (docs/deployment.md "Deployment"): a one-node cluster from Debian's
slurm-wlm and munge (proctrack/linuxproc, no cgroup plugin, a CPU node) started for these tests in a
folder of their own, on free ports, with its own munged; then `sbatch deploy/slurm/tally.sbatch`
gives `tally run`'s report on the same manifest; `workers.sbatch` adds workers to a tallyd outside
Slurm and `scancel` mid-run loses and doubles nothing; `scontrol requeue` of tally.sbatch resumes
the same job from tallyd's state; and nothing of the cluster or of Tally is left running after.
Needs root and the packages (scripts/install-deps.sh installs them)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import tallytest as tt

SBATCH = os.path.join(tt.SRC, "deploy", "slurm")
FLAGS = ("--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4")


def read(path):
    with open(path) as f:
        return f.read().strip()


def missing():
    if os.geteuid() != 0:
        return "needs root (slurmd and munged run as root here)"
    for b in ("slurmctld", "slurmd", "sbatch", "munged", "mungekey"):
        if shutil.which(b) is None and not os.path.exists("/usr/sbin/" + b):
            return f"{b} is not installed (slurm-wlm, munge: scripts/install-deps.sh)"
    return None


@unittest.skipIf(missing(), missing() or "")
class SlurmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-slurm-")
        cls.daemons = []
        try:
            cls.start_cluster()
        except BaseException:
            cls.tearDownClass()
            raise
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(46), 160,
                                        [(40, 40), (32, 48)], classes=2)
        cls.model = tt.fixture("slow.pt")
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(cls.model, cls.manifest, cls.reference, "--workers", "1", *FLAGS)

    @classmethod
    def start_cluster(cls):
        r = cls.root
        host = socket.gethostname().split(".")[0]
        key = os.path.join(r, "munge.key")
        subprocess.run(["mungekey", "--create", "--keyfile", key, "--force"], check=True, capture_output=True)
        os.chmod(key, 0o400)
        cls.munge_socket = os.path.join(r, "munge.socket")
        cls.spawn(["munged", "--foreground", "--force", "--socket", cls.munge_socket, "--key-file", key,
                   "--pid-file", os.path.join(r, "munged.pid"), "--log-file", os.path.join(r, "munged.log"),
                   "--seed-file", os.path.join(r, "munged.seed")], "munged")
        for _ in range(100):
            if os.path.exists(cls.munge_socket):
                break
            time.sleep(0.05)
        for d in ("ctld", "d"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        conf = os.path.join(r, "slurm.conf")
        # cred_expire=10: a requeued job waits that long (plus one second) before it may start again;
        # the default 120 s was most of this suite's wall time.
        with open(conf, "w") as f:
            f.write(f"""ClusterName=tally{os.getpid()}
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={tt.free_port()}
SlurmdPort={tt.free_port()}
AuthType=auth/munge
AuthInfo=socket={cls.munge_socket},cred_expire=10
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/d
SlurmctldPidFile={r}/ctld.pid
SlurmdPidFile={r}/d.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=30
JobRequeue=1
SlurmctldLogFile={r}/ctld.log
SlurmdLogFile={r}/d.log
NodeName={host} CPUs={os.cpu_count()} RealMemory=2000 State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        cls.env = {**os.environ, "SLURM_CONF": conf, "TALLY_BIN": tt.BIN}
        cls.spawn(["slurmctld", "-D", "-i", "-f", conf], "slurmctld")
        cls.spawn(["slurmd", "-D", "-f", conf], "slurmd")
        deadline = time.time() + 60
        while time.time() < deadline:
            p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=cls.env, capture_output=True, text=True)
            if p.returncode == 0 and p.stdout.strip() == "idle":
                return
            time.sleep(0.2)
        raise AssertionError("the Slurm node did not come up:\n" + cls.tail("ctld.log") + cls.tail("d.log"))

    @classmethod
    def spawn(cls, argv, name):
        log = open(os.path.join(cls.root, name + ".out"), "w")
        cls.daemons.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))

    @classmethod
    def tail(cls, name, n=3000):
        try:
            with open(os.path.join(cls.root, name), errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["scancel", "--full", "-u", "root"], env=cls.env, capture_output=True)
        deadline = time.time() + 40
        while time.time() < deadline and subprocess.run(["squeue", "-h"], env=cls.env, capture_output=True,
                                                        text=True).stdout.strip():
            time.sleep(0.2)
        for p, log in reversed(cls.daemons):  # slurmd, slurmctld, then munged.
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
        shutil.rmtree(cls.root, True)

    def slurm(self, *args, check=True):
        p = subprocess.run(list(args), env=self.env, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(f"{args}: {p.stdout}{p.stderr}")
        return p

    def sbatch(self, script, *args, env=None):
        p = subprocess.run(["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1",
                            "-o", os.path.join(self.root, "slurm-%j.out"), os.path.join(SBATCH, script), *args],
                           env={**self.env, **(env or {})}, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.strip().split(";")[0]

    def job_state(self, job):
        p = self.slurm("scontrol", "show", "job", job, check=False)
        for field in p.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait_job(self, job, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.job_state(job)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
                if state not in ("COMPLETED", "CANCELLED"):  # What Slurm says of it, for the failure message.
                    print(self.slurm("scontrol", "show", "job", job, check=False).stdout, file=sys.stderr)
                return state
            time.sleep(0.5)
        raise AssertionError(f"Slurm job {job} did not end: {self.tail(f'slurm-{job}.out')}")

    def assertSameAsReference(self, out, what):
        self.assertTrue(tt.same_files(out, self.reference), what)
        report, reference = tt.read_report(out), tt.read_report(self.reference)
        for key in ("images_evaluated", "images_failed", "classes", "foreground_dice_mean", "foreground_hd95_mean"):
            self.assertEqual(report[key], reference[key], (what, key))
        self.assertTrue(report["complete"], what)

    def assertNothingRuns(self, *patterns):
        """No process whose command line holds any of `patterns` (this test's folders, its
        coordinator's address) is left once the Slurm job has ended."""
        deadline = time.time() + 30
        while time.time() < deadline:
            left = [subprocess.run(["pgrep", "-af", "--", p], capture_output=True, text=True).stdout.strip()
                    for p in patterns]
            left = [l for l in left if l and "pgrep" not in l]
            if not left:
                return
            time.sleep(0.2)
        self.fail("processes left: " + "; ".join(left))

    def wait_progress(self, server, job, fraction, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = tt.tally("status", job, "--server", server, check=False)
            if p.returncode == 0:
                done, total = p.stdout.split()[2].split("/")
                if int(done) >= max(1, fraction * int(total)):
                    return int(done), int(total)
            time.sleep(0.05)
        raise AssertionError(f"job {job} made no progress")

    def test_follow_sbatch_evaluates_a_trainers_checkpoints_in_the_same_allocation(self):
        # The "trainer": writes three TorchScript checkpoints a second apart, then exits.
        ckpt, out = os.path.join(self.root, "ckpt"), os.path.join(self.root, "follow")
        trainer = os.path.join(self.root, "trainer.sh")
        with open(trainer, "w") as f:
            f.write(f"#!/bin/sh\nfor s in 100 200 300; do cp {tt.fixture('red_vs_rest.pt')} {ckpt}/.tmp && "
                    f"mv {ckpt}/.tmp {ckpt}/ckpt-$s.pt; sleep 1; done\n")
        os.chmod(trainer, 0o755)
        job = self.sbatch("follow.sbatch", ckpt, self.manifest, out, "--", trainer,
                          env={"TALLY_FOLLOW_IDLE": "6", "TALLY_FOLLOW_FLAGS": "--settle 0.5 --catch-up all --metrics dice"})
        self.assertEqual(self.wait_job(job), "COMPLETED", self.tail(f"slurm-{job}.out"))
        with open(os.path.join(out, "curve.csv")) as f:
            rows = f.read().splitlines()
        self.assertEqual(len(rows), 4, rows)  # The header and the three checkpoints.
        self.assertTrue(all(",best," in r or ",not better," in r for r in rows[1:]), rows)
        self.assertNothingRuns(out)

    def test_tally_sbatch_equals_tally_run_and_a_requeue_resumes_the_job(self):
        out = os.path.join(self.root, "whole")
        job = self.sbatch("tally.sbatch", self.model, self.manifest, out, *FLAGS)
        self.assertEqual(self.wait_job(job), "COMPLETED", self.tail(f"slurm-{job}.out") + self.tail("whole/tallyd.log"))
        self.assertSameAsReference(out, "sbatch")
        port = read(os.path.join(out, ".tally-state", "port"))
        self.assertNothingRuns(out, f"--coordinator {socket.gethostname().split('.')[0]}:{port}")

        # Requeued mid-job (as a preemption does): the next run's tallyd resumes the same job.
        # Its workers wait 40 ms a row before sending (the results are the same): the whole job takes
        # a few seconds, so that the requeue lands mid-job (a fast machine finished all 160 rows
        # between two polls, twice in clean-clone runs).
        out = os.path.join(self.root, "requeued")
        job = self.sbatch("tally.sbatch", self.model, self.manifest, out, *FLAGS, env={"TALLY_TEST_THROTTLE_MS": "40"})
        state = os.path.join(out, ".tally-state")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(os.path.join(state, "job")) and
                                              os.path.exists(os.path.join(state, "port"))):
            time.sleep(0.1)
        first = read(os.path.join(state, "job"))
        server = "127.0.0.1:" + read(os.path.join(state, "port"))
        # As soon as a first shard is in (a requeue after the end would resume nothing): at a quarter, a
        # fast run sometimes had finished between two polls.
        done, total = self.wait_progress(server, first, 0.0)
        self.assertLess(done, total, "the job ended before the requeue; make it slower")
        self.slurm("scontrol", "requeue", job)
        deadline = time.time() + 120
        while time.time() < deadline and self.job_state(job) in ("RUNNING", "COMPLETING"):
            time.sleep(0.2)
        self.slurm("scontrol", "release", job, check=False)  # Requeued jobs may be held.
        self.assertEqual(self.wait_job(job), "COMPLETED", self.tail(f"slurm-{job}.out"))
        self.assertEqual(read(os.path.join(state, "job")), first)
        self.assertIn(f"resuming job {first}", self.tail(f"slurm-{job}.out", 100000))
        self.assertSameAsReference(out, "requeued")
        port = read(os.path.join(state, "port"))
        self.assertNothingRuns(out, f"--coordinator {socket.gethostname().split('.')[0]}:{port}")

    def test_workers_sbatch_joins_a_tallyd_outside_slurm_and_scancel_loses_nothing(self):
        root = os.path.join(self.root, "outside")
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        job = cluster.submit(self.model, self.manifest, *FLAGS)
        # Its workers wait 40 ms a row before sending, as in the requeue test: unthrottled, a clean-clone
        # run finished all 160 rows between two polls.
        slurm_job = self.sbatch("workers.sbatch", env={"TALLY_COORDINATOR": cluster.address,
                                                       "TALLY_TEST_THROTTLE_MS": "40"})
        at_cancel = cluster.wait_for_progress(job, 0.25, timeout=180)
        self.assertLess(at_cancel["done"], 160, "the job ended before scancel; make it slower")
        self.slurm("scancel", slurm_job)
        self.assertEqual(self.wait_job(slurm_job), "CANCELLED")
        log = self.tail(f"slurm-{slurm_job}.out", 100000)
        self.assertIn("stopping: finishing the rows in hand", log)
        cluster.start_worker()  # The rest, by a worker outside Slurm.
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "out")
        cluster.fetch(job, out)
        rows = tt.read_per_image(out)
        keys = [(r["index"], r["class"]) for r in rows]
        self.assertEqual(len(keys), len(set(keys)))  # Nothing doubled...
        self.assertSameAsReference(out, "scancel")   # ...nothing lost, the same numbers.
        cluster.stop()
        self.assertNothingRuns(root, f"--coordinator {cluster.address}")


if __name__ == "__main__":
    unittest.main()
