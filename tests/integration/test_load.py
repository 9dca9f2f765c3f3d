"""The report kept as results arrive (docs/how-it-works.md "Millions of rows"). A job fed by the fake workers of the load generator
(bench/load_worker.cc: the real WorkerControl API, results made up from each row's index) gives the
means that the generator's own formula gives (computed here with numpy, independently of tallyd),
and a tallyd SIGKILLed halfway and restarted (it rebuilds the kept report from the database, then
goes on as rows arrive) writes the same files, to the byte, as an undisturbed run."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import tallytest as tt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from load_bench import expected_means, write_manifest  # noqa: E402

ROWS = 12000


class LoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-load-")
        cls.manifest = os.path.join(cls.root, "manifest.csv")
        write_manifest(cls.manifest, ROWS)

    def start_load_worker(self, cluster, rate):
        p = subprocess.Popen([os.path.join(tt.BIN, "tally-load-worker"), "--coordinator", cluster.address, "--rate",
                              str(rate), "--classes", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(10)))
        return p

    def run_job(self, name, restart_at=None):
        root = os.path.join(self.root, name)
        c = tt.Cluster(self, root)
        job = c.cli("submit", "--manifest", self.manifest, "--num-classes", "3", "--metrics", "dice,iou,hd95",
                    "--shard-size", "200").stdout.strip()
        self.start_load_worker(c, 3000)
        if restart_at is not None:
            c.wait_for_progress(job, restart_at)
            c.tallyd.send_signal(signal.SIGKILL)
            c.tallyd.wait(10)
            c.start_tallyd()  # Same port and state; the load worker registers again.
        j = c.wait(job, timeout=300)
        self.assertEqual(j["state"], "succeeded", c.log("tallyd.log"))
        self.assertEqual(j["done"], ROWS)
        out = os.path.join(root, "report")
        c.fetch(job, out)
        if restart_at is not None:
            self.assertIn("resuming job", c.log("tallyd.log"))
        return out

    def test_restart_mid_job_gives_the_undisturbed_report_and_the_generators_means(self):
        undisturbed = self.run_job("undisturbed")
        restarted = self.run_job("restarted", restart_at=0.4)
        with open(os.path.join(undisturbed, "per_image.csv"), "rb") as a, \
                open(os.path.join(restarted, "per_image.csv"), "rb") as b:
            self.assertTrue(a.read() == b.read(), "per_image.csv differs after a restart")
        ra = json.load(open(os.path.join(undisturbed, "report.json")))
        rb = json.load(open(os.path.join(restarted, "report.json")))
        self.assertEqual(ra["classes"], rb["classes"])
        for c, (dice, iou) in enumerate(expected_means(ROWS, 3)):
            self.assertAlmostEqual(ra["classes"][c]["dice_mean"], dice, delta=1e-12)
            self.assertAlmostEqual(ra["classes"][c]["iou_mean"], iou, delta=1e-12)
        with open(os.path.join(undisturbed, "per_image.csv")) as f:
            self.assertEqual(sum(1 for _ in f), 1 + 3 * ROWS)


if __name__ == "__main__":
    unittest.main()
