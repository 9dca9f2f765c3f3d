"""tallyd's Prometheus endpoint (`--metrics-listen`): scraped over HTTP and parsed with Debian's
prometheus_client text parser (not Tally's code); the values are checked against what the test
made happen: rows evaluated and failed from the manifest, shards from the shard size, workers
started and stopped, the database file's size. The Grafana dashboard's queries name only metrics
that a scrape has."""
import json
import math
import os
import re
import signal
import time
import unittest
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import tallytest as tt


def metrics_url(cluster):
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"metrics on (http://\S+/metrics)", cluster.log("tallyd.log"))
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError("tallyd did not say where its metrics are:\n" + cluster.log("tallyd.log"))


def scrape(url):
    """{family name: family} and {(sample name, frozenset(labels)): value}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
        content_type = r.headers.get("Content-Type", "")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {}
    for f in families.values():
        for s in f.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples, content_type


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def by_label(samples, name, label):
    return {dict(k[1])[label]: v for k, v in samples.items() if k[0] == name}


def dataset_with_bad_rows(root, n, bad):
    """n good rows and `bad` rows whose image file does not exist."""
    manifest = tt.write_dataset(root, np.random.default_rng(5), n, [(24, 32), (20, 20)])
    with open(manifest, "a") as f:
        for i in range(bad):
            f.write(f"missing{i},img/missing{i}.png,msk/s0000.png\n")
    return manifest


class MetricsTest(unittest.TestCase):
    def test_counts_after_a_job_with_failed_rows(self):
        root = tt.tmpdir(self)
        manifest = dataset_with_bad_rows(os.path.join(root, "data"), 40, 3)
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--metrics-listen", "127.0.0.1:0"])
        url = metrics_url(c)
        families, samples, content_type = scrape(url)
        self.assertTrue(content_type.startswith("text/plain"), content_type)
        self.assertEqual(value(samples, "tally_workers_registered"), 0)
        for state in ("queued", "running", "succeeded", "failed", "cancelled"):
            self.assertEqual(value(samples, "tally_jobs", state=state), 0)

        c.start_worker("--batch-size", "4", name="alpha")
        c.start_worker("--batch-size", "4", name="beta")
        c.wait_registered(2)
        job = c.submit(tt.fixture("three_class.pt"), manifest, "--shard-size", "4", "--batch-size", "4")
        self.assertEqual(c.wait(job)["state"], "succeeded")

        # Wait for a heartbeat after the last result (workers send one every 0.5 s here).
        deadline = time.time() + 20
        while True:
            families, samples, _ = scrape(url)
            per_worker = by_label(samples, "tally_worker_images_total", "worker")
            if sum(per_worker.values()) == 43 or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(sorted(per_worker), ["alpha", "beta"])
        self.assertEqual(sum(per_worker.values()), 43)

        self.assertEqual(value(samples, "tally_jobs", state="succeeded"), 1)
        self.assertEqual(value(samples, "tally_jobs", state="running"), 0)
        self.assertEqual(value(samples, "tally_images_total", outcome="evaluated"), 40)
        self.assertEqual(value(samples, "tally_images_total", outcome="failed"), 3)
        self.assertEqual(value(samples, "tally_images_remaining"), 0)
        # 43 rows in shards of 4: 11 shards, each leased once (nothing was lost).
        self.assertEqual(value(samples, "tally_shards_leased_total"), 11)
        self.assertEqual(value(samples, "tally_shards_expired_total"), 0)
        self.assertEqual(value(samples, "tally_shards_retried_total"), 0)
        self.assertEqual(value(samples, "tally_workers_registered"), 2)
        self.assertEqual(value(samples, "tally_workers_busy"), 0)
        self.assertEqual(by_label(samples, "tally_worker_busy", "worker"), {"alpha": 0, "beta": 0})
        # Both workers ran within the last 10 s: a positive rate, at most their rows over that time.
        for name, rate in by_label(samples, "tally_worker_images_per_second", "worker").items():
            self.assertGreaterEqual(rate, 0)
            self.assertLessEqual(rate, per_worker[name] / 0.1)
        self.assertGreater(sum(by_label(samples, "tally_worker_images_per_second", "worker").values()), 0)
        # CPU workers have no GPU series.
        self.assertEqual(by_label(samples, "tally_worker_gpu_memory_used_bytes", "worker"), {})

        # Commit latency: one histogram, cumulative buckets ending in +Inf = count, a positive sum.
        self.assertEqual(families["tally_commit_latency_seconds"].type, "histogram")
        count = value(samples, "tally_commit_latency_seconds_count")
        self.assertGreaterEqual(count, 11)  # At least one commit per shard.
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in samples.items()
                          if k[0] == "tally_commit_latency_seconds_bucket"))
        self.assertEqual(buckets[-1], (math.inf, count))
        self.assertEqual([v for _, v in buckets], sorted(v for _, v in buckets))
        self.assertGreater(value(samples, "tally_commit_latency_seconds_sum"), 0)

        db = os.path.join(c.state, "tally.db")
        size = os.path.getsize(db) + (os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0)
        self.assertAlmostEqual(value(samples, "tally_database_bytes"), size, delta=0.1 * size)

        version = tt.tally("--version").stdout.split()[1]
        info = [dict(k[1]) for k in samples if k[0] == "tally_build_info"]
        self.assertEqual(len(info), 1)
        self.assertEqual(info[0]["version"], version)

        # A stopped worker leaves the fleet.
        c.workers[1].send_signal(signal.SIGTERM)
        c.workers[1].wait(timeout=30)
        deadline = time.time() + 20
        while value(scrape(url)[1], "tally_workers_registered") != 1 and time.time() < deadline:
            time.sleep(0.2)
        self.assertEqual(value(scrape(url)[1], "tally_workers_registered"), 1)

    def test_expired_leases_are_counted_and_retried(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(8), 240, [(64, 64)])
        c = tt.Cluster(self, os.path.join(root, "c"), lease_seconds=1.5,
                       tallyd_args=["--metrics-listen", "127.0.0.1:0"])
        url = metrics_url(c)
        frozen = c.start_worker("--batch-size", "2", name="frozen")
        c.wait_registered(1)
        job = c.submit(tt.fixture("three_class.pt"), manifest, "--shard-size", "4", "--batch-size", "2")
        c.wait_for_progress(job, 0.05)
        frozen.send_signal(signal.SIGSTOP)  # Holds its leases and goes silent.
        try:
            c.start_worker("--batch-size", "8", name="healthy")
            self.assertEqual(c.wait(job)["state"], "succeeded")
            _, samples, _ = scrape(url)
        finally:
            frozen.send_signal(signal.SIGCONT)
        expired = value(samples, "tally_shards_expired_total")
        retried = value(samples, "tally_shards_retried_total")
        self.assertGreaterEqual(expired, 1)
        self.assertGreaterEqual(retried, expired)
        # Every lease ended in a commit or went back to the queue: 60 shards, each committed once.
        self.assertEqual(value(samples, "tally_shards_leased_total"), 60 + retried)
        self.assertEqual(value(samples, "tally_images_total", outcome="evaluated"), 240)
        self.assertEqual(value(samples, "tally_images_total", outcome="failed"), 0)
        self.assertIn("stopped responding", c.log("tallyd.log"))

    def test_bad_address_is_refused(self):
        root = tt.tmpdir(self)
        import subprocess
        p = subprocess.run([os.path.join(tt.BIN, "tallyd"), "--state-dir", os.path.join(root, "s"), "--listen",
                            "127.0.0.1:0", "--metrics-listen", "256.1.1.1:99999"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot serve metrics on '256.1.1.1:99999'", p.stderr)

    def test_grafana_dashboard_names_only_exported_metrics(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--metrics-listen", "127.0.0.1:0"])
        families, _, _ = scrape(metrics_url(c))
        with open(os.path.join(tt.SRC, "deploy", "grafana", "tally-dashboard.json")) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 10)
        used = set()
        for e in exprs:
            for name in re.findall(r"\btally_[a-z_]+", e):
                base = re.sub(r"_(bucket|sum|count)$", "", name) if "commit_latency" in name else name
                # prometheus_client names counter families without their _total suffix.
                used.add(base)
                self.assertTrue(base in families or re.sub(r"_total$", "", base) in families,
                                f"dashboard query {e!r} names {name}, which tallyd does not export")
        # Every family tallyd exports is on the dashboard but the build info.
        exported = {n for n in families if n.startswith("tally_")} - {"tally_build_info"}
        shown = {re.sub(r"_total$", "", u) for u in used}
        self.assertEqual(exported - shown, set())
        for p in dash["panels"]:
            self.assertEqual(p["datasource"]["uid"], "${DS_PROMETHEUS}")


if __name__ == "__main__":
    unittest.main()
