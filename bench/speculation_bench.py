#!/usr/bin/python3
"""No straggling tail: job wall time with one slow worker among three, with and without
speculative copies. A prediction job (no model) of ROWS rows in shards of 8 on CPU workers; worker 0
waits THROTTLE ms per row before sending its results (TALLY_TEST_THROTTLE_MS), the others run free.

  TALLY_BIN=build/bin /usr/bin/python3 bench/speculation_bench.py [ROWS] [THROTTLE_MS]
"""
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import numpy as np  # noqa: E402

import tallytest as tt  # noqa: E402
from test_live import write_predictions  # noqa: E402


class Bench(unittest.TestCase):
    def runTest(self):
        rows = int(sys.argv[1]) if len(sys.argv) > 1 else 480
        throttle = sys.argv[2] if len(sys.argv) > 2 else "400"
        root = tempfile.mkdtemp(prefix="tally-spec-bench-")
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(1), rows)
        print(f"{rows} rows, shards of 8, 3 CPU workers, worker 0 throttled {throttle} ms a row")
        for speculate in ("off", "auto", "2"):
            for trial in range(2):
                c = tt.Cluster(self, os.path.join(root, f"c-{speculate}-{trial}"))
                c.start_worker(env={"TALLY_TEST_THROTTLE_MS": throttle})
                c.start_worker()
                c.start_worker()
                c.wait_registered(3)
                start = time.time()
                job = c.cli("submit", "--manifest", manifest, "--shard-size", "8", "--metrics", "dice",
                            "--speculate-after", speculate).stdout.strip()
                state = c.wait(job, timeout=900)["state"]
                wall = time.time() - start
                copies = c.log("tallyd.log").count("a speculative copy goes to")
                print(f"--speculate-after {speculate:4s} trial {trial}: {state}, wall {wall:.1f} s, "
                      f"{copies} speculative copies")
                c.stop()


if __name__ == "__main__":
    unittest.TextTestRunner(verbosity=0).run(Bench())
