#!/usr/bin/python3
"""The dashboard with 1 000 jobs in the database. Submits JOBS one-row prediction jobs
(one CPU worker evaluates them), then times the dashboard's JSON the page polls every 2 s: the first
page of jobs (50), a filtered page, one job, the workers; median of 20 requests each.

  TALLY_BIN=build/bin /usr/bin/python3 bench/dashboard_bench.py [JOBS]
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
from test_dashboard import dashboard_url, get  # noqa: E402
from test_live import write_predictions  # noqa: E402


class Bench(unittest.TestCase):
    def runTest(self):
        jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
        root = tempfile.mkdtemp(prefix="tally-dash-bench-")
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(1), 1)
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--http-listen", "127.0.0.1:0"])
        url = dashboard_url(c)
        c.start_worker()
        start = time.time()
        ids = [c.cli("submit", "--manifest", manifest, "--label", f"n={i % 10}").stdout.strip() for i in range(jobs)]
        print(f"{jobs} jobs submitted in {time.time() - start:.1f} s")
        c.wait(ids[-1], timeout=1800)
        for path in ("/api/jobs", "/api/jobs?label=n%3D3", "/api/jobs?state=succeeded&limit=1000",
                     f"/api/jobs/{ids[0]}", "/api/workers", "/"):
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                status, _, body = get(url + path)
                times.append(time.perf_counter() - t0)
                self.assertEqual(status, 200)
            print(f"GET {path}: median {1000 * statistics.median(times):.1f} ms, max {1000 * max(times):.1f} ms, "
                  f"{len(body)} bytes")


if __name__ == "__main__":
    unittest.TextTestRunner(verbosity=0).run(Bench())
