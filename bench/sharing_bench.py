#!/usr/bin/python3
"""Jobs sharing the workers: the latency of small jobs submitted every few seconds while a large job
runs, and what they cost the large job. Two CPU workers run a Python model that sleeps DELAY_MS a row
(so that the figures measure scheduling, not this machine's two cores; the workers' pipelines hold
rows as they would for a GPU model): a LARGE-row job alone, then the same job with a SMALL-row job of
the same model submitted every EVERY seconds until it ends. Batches and shards of 8.

  TALLY_BIN=build/bin /usr/bin/python3 bench/sharing_bench.py [LARGE] [SMALL] [EVERY] [DELAY_MS]
"""
import os
import statistics
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import numpy as np  # noqa: E402

import tallytest as tt  # noqa: E402

MODEL = """
import time
import numpy as np

class Model:
    num_classes = 2

    def __init__(self, devices, options):
        self.delay = float(options["delay_ms"]) / 1000

    def predict(self, images, rows):
        time.sleep(self.delay * len(rows))
        return [(i[..., 0].astype(np.int32) > i[..., 2].astype(np.int32)).astype(np.int64) for i in images]
"""


def ended(cluster, job):
    return cluster.job(job)["state"] in ("succeeded", "failed", "cancelled")


class Bench(unittest.TestCase):
    def runTest(self):
        large = int(sys.argv[1]) if len(sys.argv) > 1 else 2400
        small = int(sys.argv[2]) if len(sys.argv) > 2 else 48
        every = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
        delay = sys.argv[4] if len(sys.argv) > 4 else "20"
        root = tempfile.mkdtemp(prefix="tally-share-bench-")
        big = tt.write_dataset(os.path.join(root, "big"), np.random.default_rng(1), large, [(16, 16)], classes=2)
        little = tt.write_dataset(os.path.join(root, "little"), np.random.default_rng(2), small, [(16, 16)], classes=2)
        model = os.path.join(root, "sleepy.py")
        with open(model, "w") as f:
            f.write(MODEL)
        flags = ["--model", model, "--python", "/usr/bin/python3", "--model-option", f"delay_ms={delay}",
                 "--batch-size", "8", "--shard-size", "8", "--metrics", "dice"]
        print(f"large job {large} rows, small jobs {small} rows every {every} s, 2 CPU workers, "
              f"a model taking {delay} ms a row, batches and shards of 8")
        for phase in ("alone", "with small jobs"):
            c = tt.Cluster(self, os.path.join(root, phase.replace(" ", "-")), lease_seconds=5.0)
            for _ in range(2):
                c.start_worker()
            c.wait_registered(2)
            start = time.time()
            job = c.cli("submit", "--manifest", big, *flags).stdout.strip()
            latencies, pending, next_submit = [], {}, start + every
            while not ended(c, job):
                now = time.time()
                if phase != "alone" and now >= next_submit:
                    pending[c.cli("submit", "--manifest", little, *flags).stdout.strip()] = now
                    next_submit = now + every
                for j, t0 in list(pending.items()):
                    if ended(c, j):
                        latencies.append(time.time() - t0)
                        del pending[j]
                time.sleep(0.1)
            wall = time.time() - start
            for j, t0 in pending.items():  # Submitted near the end: let them finish too.
                c.wait(j)
                latencies.append(time.time() - t0)
            line = f"{phase}: large job {wall:.1f} s ({large / wall:.0f} rows/s)"
            if latencies:
                line += (f"; {len(latencies)} small jobs, latency median {statistics.median(latencies):.2f} s, "
                         f"max {max(latencies):.2f} s (the model alone: {small * float(delay) / 1000:.2f} s on one worker, "
                         f"{small * float(delay) / 2000:.2f} s on two)")
            print(line)
            c.stop()


if __name__ == "__main__":
    unittest.TextTestRunner(verbosity=0).run(Bench())
