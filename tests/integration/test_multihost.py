"""Many hosts on one machine: tallyd and two workers in separate Linux network namespaces joined
by veth pairs, each worker reaching the coordinator only by its address on its virtual link. One
worker's link is cut mid-job (`ip link set down`): its leases expire, the other worker takes them,
and the report equals an undisturbed run byte for byte.

Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and `ip` from iproute2; skipped, saying why, where
network namespaces cannot be made."""
import json
import os
import shutil
import subprocess
import time
import unittest

import numpy as np

import tallytest as tt

IP = shutil.which("ip")
TAG = f"t{os.getpid() % 100000}"


def ip(*args, ns=None, check=True):
    """`ip ARGS`, inside namespace `ns` when given."""
    cmd = ([IP, "netns", "exec", ns] if ns else []) + [IP] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def namespaces_usable():
    if IP is None:
        return "iproute2's `ip` is not installed"
    name = f"{TAG}probe"
    p = subprocess.run([IP, "netns", "add", name], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace here ({p.stderr.strip() or 'ip netns add failed'}): needs root"
    subprocess.run([IP, "netns", "del", name], capture_output=True)
    return None


WHY_NOT = namespaces_usable()


@unittest.skipIf(WHY_NOT is not None, f"network namespaces: {WHY_NOT}")
class MultiHostTest(unittest.TestCase):
    def setUp(self):
        self.root = tt.tmpdir(self)
        self.procs = []
        self.logs = []
        self.coordinator_ns = f"{TAG}c"
        self.addCleanup(self.teardown_network)
        subprocess.run([IP, "netns", "add", self.coordinator_ns], check=True)
        ip("link", "set", "lo", "up", ns=self.coordinator_ns)
        # One point-to-point link per worker "host": 10.77.<k>.1 (coordinator) <-> 10.77.<k>.2 (worker).
        self.workers_ns = []
        for k in (1, 2):
            ns = f"{TAG}w{k}"
            subprocess.run([IP, "netns", "add", ns], check=True)
            self.workers_ns.append(ns)
            c_end, w_end = f"{TAG}c{k}", f"{TAG}w{k}"
            subprocess.run([IP, "link", "add", c_end, "type", "veth", "peer", "name", w_end], check=True)
            subprocess.run([IP, "link", "set", c_end, "netns", self.coordinator_ns], check=True)
            subprocess.run([IP, "link", "set", w_end, "netns", ns], check=True)
            ip("addr", "add", f"10.77.{k}.1/24", "dev", c_end, ns=self.coordinator_ns)
            ip("link", "set", c_end, "up", ns=self.coordinator_ns)
            ip("addr", "add", f"10.77.{k}.2/24", "dev", w_end, ns=ns)
            ip("link", "set", w_end, "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)

    def teardown_network(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for f in self.logs:
            f.close()
        for ns in [self.coordinator_ns] + self.workers_ns:
            subprocess.run([IP, "netns", "del", ns], capture_output=True)  # Its veth ends go with it.

    def start(self, ns, name, *argv):
        log = open(os.path.join(self.root, name + ".log"), "w")
        self.logs.append(log)
        p = subprocess.Popen([IP, "netns", "exec", ns] + [str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.root, name + ".log")) as f:
            return f.read()

    def cli(self, *args, check=True):
        p = subprocess.run([IP, "netns", "exec", self.coordinator_ns, os.path.join(tt.BIN, "tally")] + list(args) +
                           ["--server", "10.77.1.1:50051"], capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            raise AssertionError(f"tally {args} exited {p.returncode}: {p.stdout}\n{p.stderr}")
        return p

    def test_a_worker_cut_off_mid_job_changes_nothing(self):
        manifest = tt.write_dataset(os.path.join(self.root, "data"), np.random.default_rng(31), 240,
                                    [(48, 48), (40, 56)], classes=2)
        flags = ["--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4"]
        reference = os.path.join(self.root, "reference")
        tt.tally_run(tt.fixture("slow.pt"), manifest, reference, "--workers", "1", *flags)

        self.start(self.coordinator_ns, "tallyd", os.path.join(tt.BIN, "tallyd"), "--listen", "0.0.0.0:50051",
                   "--state-dir", os.path.join(self.root, "state"), "--lease-seconds", "2", "--heartbeat-seconds", "0.5")
        deadline = time.time() + 30
        while self.cli("jobs", check=False).returncode != 0:
            self.assertLess(time.time(), deadline, self.log("tallyd"))
            time.sleep(0.1)
        for k, ns in enumerate(self.workers_ns, 1):
            # Each worker knows the coordinator only by its address on its own link.
            self.start(ns, f"worker{k}", os.path.join(tt.BIN, "tally-worker"), "--coordinator", f"10.77.{k}.1:50051",
                       "--device", "cpu", "--threads", "1", "--name", f"host{k}")
        deadline = time.time() + 30
        while self.log("tallyd").count(" registered: ") < 2:
            self.assertLess(time.time(), deadline, self.log("tallyd"))
            time.sleep(0.1)
        job = self.cli("submit", "--model", tt.fixture("slow.pt"), "--manifest", manifest, *flags).stdout.strip()
        while True:
            j = json.loads(self.cli("status", job, "--json").stdout)
            done = int(j.get("images_evaluated", 0)) + int(j.get("images_failed", 0))  # int64 as JSON strings.
            if done >= 40:
                break
            self.assertNotIn(j.get("state"), ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"),
                             "the job ended before the cut; make it slower")
            time.sleep(0.05)
        self.assertLess(done, 240, "the job finished before the cut; make it slower")
        # Cut host 1 off the network: no RST, no FIN, its packets simply stop.
        ip("link", "set", f"{TAG}w1", "down", ns=self.workers_ns[0])
        p = self.cli("wait", job, "--timeout", "240", check=False)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + self.log("tallyd"))
        out = os.path.join(self.root, "out")
        self.cli("report", job, "--out", out)
        self.assertTrue(tt.same_files(reference, out))
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 240)
        self.assertTrue(report["complete"])
        names = {w["name"] for w in report["workers"]}
        self.assertIn("host2", names)
        self.assertLessEqual(names, {"host1", "host2"})
        self.assertIn("its rows are tried one at a time", self.log("tallyd"))


if __name__ == "__main__":
    unittest.main()
