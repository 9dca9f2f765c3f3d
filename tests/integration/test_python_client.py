"""The Python client (python/tally/client.py) against a real tallyd and workers: many jobs
submitted from Python, waited on, and their reports read back; results equal to `tally run` on the
same data; ids like "000123" stay strings in the DataFrame; tokens; errors as TallyError."""
import csv
import os
import unittest

import numpy as np

import tallytest as tt
from tally.client import Client, TallyError


def dataset(root, n, seed, prefix="0"):
    path = tt.write_dataset(root, np.random.default_rng(seed), n, [(16, 24), (20, 20)], classes=3)
    # Ids that pandas would read as numbers.
    with open(path) as f:
        rows = list(csv.reader(f))
    for i, r in enumerate(rows[1:]):
        r[0] = f"{prefix}{i:05d}"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


class PythonClientTest(unittest.TestCase):
    def test_many_jobs_from_python_equal_the_cli(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"))
        for _ in range(2):
            c.start_worker()
        client = Client(c.address)
        self.addCleanup(client.close)
        manifests = [dataset(os.path.join(root, f"d{i}"), 6, seed=i) for i in range(4)]
        jobs = [client.submit(m, model=tt.fixture("three_class.pt"), labels={"sweep": "s1", "part": str(i)},
                              metrics="dice,iou", batch_size=2, name=f"part {i}")
                for i, m in enumerate(manifests)]
        other = client.submit(manifests[0], model=tt.fixture("three_class.pt"), labels={"sweep": "s2"})
        finished = client.wait(jobs + [other], timeout=180)
        self.assertEqual([j["state"] for j in finished], ["succeeded"] * 5)
        listed = client.jobs(label={"sweep": "s1"})
        self.assertEqual(sorted(j["job_id"] for j in listed), sorted(jobs))
        self.assertEqual({j["spec"]["name"] for j in listed}, {f"part {i}" for i in range(4)})
        self.assertEqual(len(client.jobs(state="succeeded")), 5)

        for i, (job, manifest) in enumerate(zip(jobs, manifests)):
            report = client.report(job)
            self.assertEqual(report["images_evaluated"], 6)
            frame = client.per_image(job)
            # The same rows `tally run` gives on the same manifest.
            out = os.path.join(root, f"cli{i}")
            tt.tally_run(tt.fixture("three_class.pt"), manifest, out, "--metrics", "dice,iou", "--batch-size", "2")
            cli_rows = tt.read_per_image(out)
            self.assertEqual(len(frame), len(cli_rows))
            self.assertEqual(list(frame["id"]), [r["id"] for r in cli_rows])
            self.assertTrue(all(isinstance(v, str) for v in frame["id"]))
            self.assertEqual(frame["id"].iloc[0], "000000")
            self.assertEqual(list(frame["tp"]), [int(r["tp"]) for r in cli_rows])
            self.assertEqual(str(frame["tp"].dtype), "int64")
            for a, b in zip(frame["dice"], cli_rows):
                self.assertTrue(tt.same(float(a), tt.num(b["dice"]), 0), (a, b["dice"]))
        paths = client.fetch(jobs[0], os.path.join(root, "fetched"))
        self.assertIn("report.json", {os.path.basename(p) for p in paths})

    def test_tokens_and_errors(self):
        root = tt.tmpdir(self)
        tokens = os.path.join(root, "tokens")
        alice = tt.tally("token", "alice", "client", "--tokens-file", tokens).stdout.strip()
        bob = tt.tally("token", "bob", "client", "--tokens-file", tokens).stdout.strip()
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--auth-tokens", tokens])
        manifest = dataset(os.path.join(root, "d"), 2, seed=5)
        with Client(c.address, token=alice) as a, Client(c.address, token=bob) as b, Client(c.address) as anon:
            job = a.submit(manifest, model=tt.fixture("three_class.pt"))
            self.assertEqual(a.job(job)["owner"], "alice")
            with self.assertRaises(TallyError) as e:
                b.job(job)
            self.assertEqual(e.exception.code.name, "NOT_FOUND")
            with self.assertRaises(TallyError) as e:
                anon.jobs()
            self.assertEqual(e.exception.code.name, "UNAUTHENTICATED")
            with self.assertRaises(TimeoutError):
                a.wait(job, timeout=0.5)  # No worker.
            with self.assertRaises(TypeError):
                a.submit(manifest, model=tt.fixture("three_class.pt"), bogus_option=1)
            self.assertEqual(a.cancel(job)["state"], "cancelled")


if __name__ == "__main__":
    unittest.main()


class PythonClientCocoTest(unittest.TestCase):
    def test_a_coco_results_job_from_python_equals_the_cli(self):
        import test_coco as tc
        root = tt.tmpdir(self)
        rng = np.random.default_rng(5)
        images, cats, gts, dts = tc.random_case(rng)
        tc.write_case(root, rng, images, cats, gts, dts)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        with Client(c.address) as client:
            job = client.submit(coco=os.path.join(root, "gt.json"), coco_images=root,
                                coco_results=os.path.join(root, "results.json"))
            self.assertEqual(client.wait(job, timeout=120)["state"], "succeeded")
            report = client.report(job)
        out = os.path.join(root, "cli")
        tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--coco-results",
                 os.path.join(root, "results.json"), "--out", out)
        self.assertEqual(report["instances"]["stats"], tt.read_report(out)["instances"]["stats"])


class PythonClientNamesTest(unittest.TestCase):
    def test_the_clis_flag_names_and_job_id_prefixes(self):
        root = tt.tmpdir(self)
        manifest = dataset(os.path.join(root, "d"), 20, seed=9)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        with Client(c.address) as client:
            # The CLI's names: --order random:SEED, --sample 50%, dashes or underscores.
            job = client.submit(manifest, model=tt.fixture("three_class.pt"), order="random:7", sample="50%",
                                **{"batch-size": 2})
            other = client.submit(manifest, model=tt.fixture("three_class.pt"), label="sweep=a")
            done = client.wait(job[:-2], timeout=120)  # A prefix, as `tally wait j2026...` takes.
            self.assertEqual(done["state"], "succeeded")
            spec = done["spec"]
            self.assertTrue(spec["random_order"])
            self.assertEqual((int(spec["order_seed"]), spec["sample_percent"], spec["batch_size"]), (7, 50, 2))
            self.assertEqual(done["images_evaluated"], 10)
            self.assertEqual(client.job(other)["spec"]["labels"], {"sweep": "a"})
            self.assertIn("report.json", client.report_files(job[:-3]))
            with self.assertRaises(TallyError) as e:
                client.job(job[:2])  # Both jobs start so.
            self.assertEqual(e.exception.code.name, "NOT_FOUND")
            self.assertIn("ambiguous", str(e.exception))
            # tallyd's own fields are refused, naming why and listing the options (the CLI's names too).
            with self.assertRaises(TypeError) as e:
                client.submit(manifest, model=tt.fixture("three_class.pt"), model_sha256="0" * 64)
            self.assertIn("set by tallyd", str(e.exception))
            self.assertIn("order", str(e.exception))
            self.assertNotIn("manifest_sha256", str(e.exception))
            with self.assertRaises(ValueError):
                client.submit(manifest, model=tt.fixture("three_class.pt"), order="sideways")
            client.wait(other, timeout=120)
