"""The CLI as scripts use it: per-verb help, usage errors with suggestions (exit 2), --version,
--json and NDJSON, job labels and filters, id prefixes, `tally wait`, the documented exit codes."""
import json
import os
import subprocess
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

    def test_every_tool_binary_has_a_useful_help(self):
        # Each binary prints a usage line and every flag of its main file, not Abseil's
        # "No flags matched".
        tools = {"tallyd": "--state-dir", "tally-worker": "--coordinator", "tally-make-dataset": "--count",
                 "tally-make-coco": "--detections", "tally-bench-cpu": "--mode", "tally-coco-eval": "--results",
                 "tally-load-worker": "--rate"}
        for tool, flag in tools.items():
            p = subprocess.run([os.path.join(tt.BIN, tool), "--help"], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, tool)
            self.assertNotIn("No flags matched", p.stdout + p.stderr, tool)
            self.assertIn(tool, p.stdout.splitlines()[0], tool)
            self.assertIn(flag, p.stdout, tool)

    def test_usage_errors_exit_2_and_say_what_was_meant(self):
        p = tt.tally("run", "--model", "m.pt", "--manifest", "x.csv", "--out", "o", "--wrkers", "2", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown flag --wrkers; did you mean --workers?", p.stderr)
        p = tt.tally("jobs", "--workers", "2", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("tally jobs does not take --workers (a flag of: run, rescore, estimate)", p.stderr)
        p = tt.tally("stauts", "j1", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("did you mean 'status'?", p.stderr)
        p = tt.tally("run", "--model", "m.pt", "--manifest", "x.csv", "--out", "o", "--batch-size", "zero", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(tt.tally(check=False).returncode, 2)

    def test_the_last_progress_line_says_how_the_job_ended(self):
        """Found by probing: `tally run`'s last progress line said "0 workers" at 100%."""
        root = tt.tmpdir(self)
        p = tt.tally_run(tt.fixture("red_vs_rest.pt"), dataset(root), os.path.join(root, "out"))
        last = [l for l in p.stderr.splitlines() if " images (" in l][-1]
        self.assertRegex(last, r"^4/4 images \(100%\)  [0-9.]+ img/s  succeeded$")

    def test_version(self):
        p = tt.tally("--version")
        self.assertRegex(p.stdout, r"^tally \d+\.\d+\.\d+ \(git [0-9a-f]{7,}|unknown\)")
        self.assertIn("built with LibTorch", p.stdout)
        self.assertIn("CUDA", p.stdout)
        self.assertEqual(tt.tally("version").stdout, p.stdout)


def flags_in_helpfull(binary, main_file):
    """The flags Abseil's --helpfull lists as defined in `main_file`: what the binary accepts."""
    p = subprocess.run([os.path.join(tt.BIN, binary), "--helpfull"], capture_output=True, text=True)
    flags, inside = [], False
    for line in p.stdout.splitlines():
        if line.startswith("  Flags from "):
            inside = line.rstrip(":").endswith(main_file)
        elif inside and line.startswith("    --"):
            flags.append(line.split()[0][2:].split("(")[0])
    return flags


class DaemonHelpTest(unittest.TestCase):
    """tallyd --help and tally-worker --help list every flag the binary takes, grouped, with defaults."""

    def check(self, binary, main_file, groups):
        p = subprocess.run([os.path.join(tt.BIN, binary), "--help"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("No flags matched", p.stdout + p.stderr)
        for g in groups:
            self.assertIn(f"\n{g}:\n", p.stdout)
        accepted = flags_in_helpfull(binary, main_file)
        self.assertGreater(len(accepted), 15)
        self.assertIn("data_root", accepted)  # Repeatable, and in --helpfull too.
        for flag in accepted:
            self.assertRegex(p.stdout, rf"\n  --{flag.replace('_', '-')}\n", f"{binary} --help misses --{flag}")
        self.assertEqual(p.stdout.count("\n  --"), len(accepted), "a flag listed twice, or one it does not take")
        return p.stdout

    def test_tallyd(self):
        out = self.check("tallyd", "server/main.cc", ["Serving", "Security (SECURITY.md)", "Workers", "Limits"])
        self.assertIn("(default: 127.0.0.1:50051)", out)
        self.assertIn("(default: 50000000)", out)
        self.assertEqual(subprocess.run([os.path.join(tt.BIN, "tallyd"), "-h"], capture_output=True).returncode, 0)

    def test_tally_worker(self):
        out = self.check("tally-worker", "worker/main.cc", ["Coordinator", "Security (SECURITY.md)", "Device and model",
                                                              "Limits"])
        self.assertIn("(default: 16)", out)  # --max-leases

    def test_data_root_still_repeats(self):
        root = tt.tmpdir(self)
        a, b = os.path.join(root, "a"), os.path.join(root, "b")
        os.makedirs(a)
        os.makedirs(b)
        # Both roots are kept: a missing one is named whichever position it has.
        p = subprocess.run([os.path.join(tt.BIN, "tallyd"), "--data-root", a, "--data-root", os.path.join(root, "nope"),
                            "--state-dir", os.path.join(root, "s"), "--listen", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("nope", p.stderr)


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


FAKE_NVIDIA_SMI = r"""#!/bin/sh
case "$*" in
  *--query-gpu=*) cat <<'X'
0, NVIDIA H100 80GB HBM3, GPU-aaa, 00000000:19:00.0, 81559, 80900, 659, 0, 580.65.06
1, NVIDIA H100 80GB HBM3, GPU-bbb, 00000000:3B:00.0, 81559, 59000, 22559, 97, 580.65.06
X
  ;;
  *--query-compute-apps=*) echo "GPU-bbb, 4242, 21800" ;;
  "topo -m") printf '\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\t0-15\t0\nGPU1\tNV18\t X \t0-15\t0\n' ;;
  "") echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |" ;;
  *) exit 1 ;;
esac
"""


class GpusTest(unittest.TestCase):
    """`tally gpus` from `nvidia-smi`'s output (a stand-in script: NVML is switched off), and with
    no driver at all."""

    def run_gpus(self, path, *args):
        env = dict(os.environ, TALLY_NVML="off", PATH=path)
        import subprocess
        return subprocess.run([os.path.join(tt.BIN, "tally"), "gpus", *args], capture_output=True, text=True, env=env)

    def test_verdicts_memory_processes_and_links(self):
        bin_dir = tt.tmpdir(self)
        with open(os.path.join(bin_dir, "nvidia-smi"), "w") as f:
            f.write(FAKE_NVIDIA_SMI)
        os.chmod(os.path.join(bin_dir, "nvidia-smi"), 0o755)
        p = self.run_gpus(bin_dir + ":/usr/bin:/bin", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        self.assertEqual((r["source"], r["driver_version"], r["cuda_version"]), ("nvidia-smi", "580.65.06", "13.0"))
        a, b = r["gpus"]
        self.assertEqual((a["index"], a["name"], a["bus_id"]), (0, "NVIDIA H100 80GB HBM3", "00000000:19:00.0"))
        self.assertEqual(a["memory_total_bytes"], 81559 * 2**20)
        self.assertEqual((a["ready"], a["verdict"], a["processes"]), (True, "ready", []))
        self.assertEqual(b["processes"], [{"pid": 4242, "used_bytes": 21800 * 2**20}])
        self.assertEqual(b["utilization_percent"], 97)
        self.assertEqual((b["ready"], b["verdict"]), (False, "busy: 22.0 GiB used by pid 4242"))
        self.assertEqual(r["links"], [["X", "NV18"], ["NV18", "X"]])
        self.assertEqual(r["ready"], 1)
        text = self.run_gpus(bin_dir + ":/usr/bin:/bin").stdout
        self.assertIn("driver 580.65.06, CUDA 13.0 (via nvidia-smi); 2 GPU(s)", text)
        self.assertRegex(text, r"1 +NVIDIA H100 80GB HBM3 +22\.0/79\.6 GiB +97%  busy: 22\.0 GiB used by pid 4242")
        self.assertRegex(text, r"GPU0 +X +NV18")

    def test_no_driver(self):
        p = self.run_gpus(tt.tmpdir(self))
        self.assertEqual(p.returncode, 1)
        self.assertIn("no NVIDIA driver found", p.stdout)


if __name__ == "__main__":
    unittest.main()
