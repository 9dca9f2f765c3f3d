#!/usr/bin/python3
"""Chaos test: several jobs run on a tallyd and a few workers while a random schedule SIGKILLs and
SIGSTOPs workers and the coordinator (restarting what it killed). Every job must end `succeeded`
with a per_image.csv byte-identical to an undisturbed run, and a report that accounts for every row.

  tests/chaos/chaos.py --trials 2                 # the short version ctest runs
  tests/chaos/chaos.py --trials 50 --seed 7       # a soak run (about 30 s a trial on 2 cores)

Needs the built binaries (TALLY_BIN or --bin, default build/bin) and Debian's python3 with numpy
and PIL. Prints one line per trial and ends with 'N passed, N failed'; exits 1 if any trial failed.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import numpy as np  # noqa: E402

import tallytest as tt  # noqa: E402

# Job configurations: (model, flags). slow.pt's logits depend only on the red channel, so results
# are exact whatever the batch composition (a disturbed shard may be re-run in smaller batches).
JOBS = [
    ("slow.pt", ["--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4"]),
    ("slow.pt", ["--metrics", "all", "--shard-size", "6", "--batch-size", "2"]),
    ("red_vs_rest.pt", ["--metrics", "dice,iou,assd", "--shard-size", "4", "--batch-size", "4"]),
]


class Chaos:
    def __init__(self, root, rng, workers, lease_seconds):
        self.root = root
        self.rng = rng
        self.lease_seconds = lease_seconds
        self.n_workers = workers
        self.log = open(os.path.join(root, "chaos.log"), "w")
        self.address = None
        self.tallyd = None
        self.workers = [None] * workers
        self.stopped = {}  # process -> time to continue it
        self.state = os.path.join(root, "state")
        self.start_tallyd()
        for i in range(workers):
            self.start_worker(i)

    def note(self, msg):
        self.log.write(f"{time.time():.3f} {msg}\n")
        self.log.flush()

    def start_tallyd(self):
        port_file = os.path.join(self.root, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        with open(os.path.join(self.root, "tallyd.log"), "a") as log:
            self.tallyd = subprocess.Popen(
                [os.path.join(tt.BIN, "tallyd"), "--listen", self.address or "127.0.0.1:0", "--port-file", port_file,
                 "--state-dir", self.state, "--lease-seconds", str(self.lease_seconds), "--heartbeat-seconds", "0.5",
                 # The schedule's kills are not the rows' doing: no row is failed for being in hand.
                 "--max-shard-attempts", "1000"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if time.time() > deadline or self.tallyd.poll() is not None:
                raise RuntimeError("tallyd did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()

    def start_worker(self, i):
        with open(os.path.join(self.root, f"worker-{i}.log"), "a") as log:
            self.workers[i] = subprocess.Popen(
                [os.path.join(tt.BIN, "tally-worker"), "--coordinator", self.address, "--device", "cpu", "--threads",
                 "1", "--name", f"w{i}"], stdout=log, stderr=subprocess.STDOUT)

    def cli(self, *args):
        return subprocess.run([os.path.join(tt.BIN, "tally")] + list(args) + ["--server", self.address],
                              capture_output=True, text=True, timeout=120)

    def disturb(self):
        """One random disturbance; what it stopped or killed comes back later."""
        action = self.rng.choice(["kill_worker", "kill_worker", "stop_worker", "kill_tallyd", "stop_tallyd"])
        if action == "kill_worker":
            i = self.rng.randrange(self.n_workers)
            if self.workers[i].poll() is None and self.workers[i] not in self.stopped:
                self.note(f"SIGKILL worker {i}")
                self.workers[i].send_signal(signal.SIGKILL)
                self.workers[i].wait()
                self.start_worker(i)
        elif action == "stop_worker":
            i = self.rng.randrange(self.n_workers)
            p = self.workers[i]
            if p.poll() is None and p not in self.stopped:
                pause = self.rng.uniform(0.2, self.lease_seconds * 2)  # Sometimes past the lease.
                self.note(f"SIGSTOP worker {i} for {pause:.1f} s")
                p.send_signal(signal.SIGSTOP)
                self.stopped[p] = time.time() + pause
        elif action == "kill_tallyd":
            if self.tallyd not in self.stopped:
                self.note("SIGKILL tallyd")
                self.tallyd.send_signal(signal.SIGKILL)
                self.tallyd.wait()
                time.sleep(self.rng.uniform(0, 1.0))
                self.start_tallyd()
        elif action == "stop_tallyd":
            if self.tallyd not in self.stopped:
                pause = self.rng.uniform(0.2, self.lease_seconds * 1.5)
                self.note(f"SIGSTOP tallyd for {pause:.1f} s")
                self.tallyd.send_signal(signal.SIGSTOP)
                self.stopped[self.tallyd] = time.time() + pause

    def continue_due(self, everything=False):
        for p, until in list(self.stopped.items()):
            if everything or time.time() >= until:
                p.send_signal(signal.SIGCONT)
                del self.stopped[p]

    def status(self, job):
        try:
            p = self.cli("status", job)
        except subprocess.TimeoutExpired:
            return None
        if p.returncode != 0:
            return None
        return p.stdout.split()[1]

    def stop(self):
        self.continue_due(everything=True)
        for p in self.workers + [self.tallyd]:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers + [self.tallyd]:
            try:
                p and p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.log.close()


def run_trial(trial, seed, base, manifest, references, args):
    rng = random.Random(seed)
    root = os.path.join(base, f"trial-{trial}")
    os.makedirs(root)
    chaos = Chaos(root, rng, args.workers, args.lease_seconds)
    try:
        jobs = []
        for model, flags in JOBS:
            p = chaos.cli("submit", "--model", tt.fixture(model), "--manifest", manifest, *flags)
            if p.returncode != 0:
                return f"submit failed: {p.stderr.strip()}"
            jobs.append(p.stdout.strip())
        deadline = time.time() + args.trial_seconds
        next_disturbance = time.time() + rng.uniform(0.2, 0.6)
        disturbances = 0
        while time.time() < deadline:
            chaos.continue_due()
            if time.time() >= next_disturbance and disturbances < args.disturbances:
                chaos.disturb()
                disturbances += 1
                next_disturbance = time.time() + rng.uniform(0.2, 0.8)
            if disturbances >= args.disturbances:
                chaos.continue_due(everything=True)
            # A stopped coordinator would hold each status call until its deadline: ask only when
            # it runs.
            if chaos.tallyd not in chaos.stopped:
                states = [chaos.status(j) for j in jobs]
                if all(s in ("succeeded", "failed", "cancelled") for s in states):
                    break
            time.sleep(0.1)
        else:
            return f"jobs did not finish within {args.trial_seconds} s (see {root})"
        chaos.note(f"{disturbances} disturbances")
        run_trial.disturbances = disturbances
        for i, job in enumerate(jobs):
            out = os.path.join(root, f"out-{i}")
            fetch_deadline = time.time() + 60
            while True:
                p = chaos.cli("report", job, "--out", out)
                if p.returncode == 0:
                    break
                if time.time() > fetch_deadline:
                    return f"job {job}: report not fetched: {p.stderr.strip()}"
                time.sleep(0.2)
            with open(os.path.join(out, "report.json")) as f:
                report = json.load(f)
            if report["state"] != "succeeded" or not report["complete"]:
                return f"job {job} ended {report['state']} (complete={report['complete']}): {report['error']}"
            if not tt.same_files(references[i], out):
                return f"job {job}: per_image.csv differs from the undisturbed run (see {out})"
        return None
    finally:
        chaos.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--disturbances", type=int, default=8, help="per trial")
    parser.add_argument("--lease-seconds", type=float, default=1.5)
    parser.add_argument("--trial-seconds", type=float, default=240)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="tally-chaos-")
    manifest = tt.write_dataset(os.path.join(base, "data"), np.random.default_rng(args.seed), args.images,
                                [(40, 40), (32, 48)], classes=2)
    references = []
    for i, (model, flags) in enumerate(JOBS):
        ref = os.path.join(base, f"reference-{i}")
        tt.tally_run(tt.fixture(model), manifest, ref, "--workers", "1", *flags)
        references.append(ref)
    passed = failed = 0
    for trial in range(args.trials):
        start = time.time()
        error = run_trial(trial, args.seed * 1000 + trial, base, manifest, references, args)
        took = time.time() - start
        if error is None:
            passed += 1
            print(f"trial {trial}: ok ({len(JOBS)} jobs identical to undisturbed runs after "
                  f"{run_trial.disturbances} disturbances, {took:.1f} s)", flush=True)
        else:
            failed += 1
            print(f"trial {trial}: FAILED: {error}", flush=True)
    if failed == 0 and not args.keep:
        shutil.rmtree(base, True)
    else:
        print(f"work folder kept: {base}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
