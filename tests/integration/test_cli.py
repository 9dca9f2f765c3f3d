"""The CLI as scripts use it: per-verb help, usage errors with suggestions (exit 2), --version,
--json and NDJSON, job labels and filters, id prefixes, `tally wait`, the documented exit codes."""
import json
import os
import unittest

import numpy as np

import tallytest as tt


def dataset(root, n=4):
    return tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(3), n, [(16, 16)], classes=2)


class HelpAndUsageTest(unittest.TestCase):
    def test_per_verb_help_lists_only_its_flags(self):
        for args in (["run", "--help"], ["run", "-h"], ["help", "run"]):
            p = tt.tally(*args)
            self.assertIn("Usage: tally run", p.stdout)
            self.assertIn("--workers", p.stdout)
            self.assertNotIn("--page-token", p.stdout)
        p = tt.tally("jobs", "--help")
        self.assertIn("--state", p.stdout)
        self.assertNotIn("--workers", p.stdout)
        p = tt.tally("help")
        for verb in ("run", "submit", "wait", "jobs", "workers", "token"):
            self.assertIn(f"  {verb} ", p.stdout)

    def test_usage_errors_exit_2_and_say_what_was_meant(self):
        p = tt.tally("run", "--model", "m.pt", "--manifest", "x.csv", "--out", "o", "--wrkers", "2", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown flag --wrkers; did you mean --workers?", p.stderr)
        p = tt.tally("jobs", "--workers", "2", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("tally jobs does not take --workers (a flag of: run)", p.stderr)
        p = tt.tally("stauts", "j1", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("did you mean 'status'?", p.stderr)
        p = tt.tally("run", "--model", "m.pt", "--manifest", "x.csv", "--out", "o", "--batch-size", "zero", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(tt.tally(check=False).returncode, 2)

    def test_version(self):
        p = tt.tally("--version")
        self.assertRegex(p.stdout, r"^tally \d+\.\d+\.\d+ \(git [0-9a-f]{7,}|unknown\)")
        self.assertIn("built with LibTorch", p.stdout)
        self.assertIn("CUDA", p.stdout)
        self.assertEqual(tt.tally("version").stdout, p.stdout)


class ScriptingTest(unittest.TestCase):
    def test_json_labels_filters_prefixes_and_wait(self):
        root = tt.tmpdir(self)
        manifest = dataset(root)
        c = tt.Cluster(self, os.path.join(root, "c"))
        submitted = {}
        for run in ("a", "b", "a"):
            p = c.cli("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", manifest, "--label", "team=seg",
                      "--label", f"run={run}", "--name", f"job-{run}", "--json")
            job = json.loads(p.stdout)
            self.assertEqual(job["spec"]["labels"], {"team": "seg", "run": run})
            submitted.setdefault(run, []).append(job["job_id"])
        listed = json.loads(c.cli("jobs", "--json", "--label", "run=a").stdout)["jobs"]
        self.assertEqual(sorted(j["job_id"] for j in listed), sorted(submitted["a"]))
        self.assertEqual(len(json.loads(c.cli("jobs", "--json", "--label", "team=seg").stdout)["jobs"]), 3)
        self.assertEqual(json.loads(c.cli("jobs", "--json", "--state", "succeeded").stdout).get("jobs", []), [])
        table = c.cli("jobs", "--state", "queued").stdout.splitlines()
        self.assertEqual(table[0].split()[:4], ["JOB", "STATE", "DONE/TOTAL", "FAILED"])
        self.assertEqual(len(table), 4)
        self.assertTrue(all("team=seg" in line for line in table[1:]))

        # No worker yet: waiting times out with exit code 6, and the jobs go on.
        b = submitted["b"][0]
        p = c.cli("wait", b, "--timeout", "1", check=False)
        self.assertEqual(p.returncode, 6)
        self.assertIn("timed out", p.stderr)
        self.assertEqual(c.cli("watch", b, "--timeout", "1", check=False).returncode, 6)
        # An unambiguous prefix names the job; an ambiguous one is an error that lists candidates.
        status = json.loads(c.cli("status", b[:-2], "--json").stdout)
        self.assertEqual(status["job_id"], b)
        p = c.cli("status", "j", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ambiguous", p.stderr)

        c.start_worker()
        ids = submitted["a"] + submitted["b"]
        p = c.cli("wait", *ids, "--json", "--timeout", "120")
        self.assertEqual(p.returncode, 0, p.stderr)
        finished = [json.loads(line) for line in p.stdout.splitlines()]
        self.assertEqual(sorted(j["job_id"] for j in finished), sorted(ids))
        self.assertTrue(all(j["state"] == "JOB_STATE_SUCCEEDED" for j in finished))
        lines = c.cli("watch", b, "--json").stdout.splitlines()
        self.assertGreaterEqual(len(lines), 1)
        self.assertEqual(json.loads(lines[-1])["state"], "JOB_STATE_SUCCEEDED")
        workers = json.loads(c.cli("workers", "--json").stdout)["workers"]
        self.assertEqual(workers[0]["name"], "w0")
        self.assertEqual(json.loads(c.cli("cancel", b, "--json").stdout)["state"], "JOB_STATE_SUCCEEDED")


if __name__ == "__main__":
    unittest.main()
