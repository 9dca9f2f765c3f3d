"""Follows (tally follow DIR), end to end with real processes: a fake trainer writes TorchScript
checkpoints into a folder (slowly in chunks, one with the trainer's marker, one truncated for ever,
one rotated away after it was taken, one saved over in place after it was taken, one while tallyd is
down) and tallyd evaluates each complete
one exactly once, as an ordinary job, races it against the best and stops the clearly worse one
after a fraction of its rows; the curve's numbers are each checkpoint's own report's.
"""
import csv
import json
import math
import os
import shutil
import subprocess
import textwrap
import time
import unittest

import numpy as np

import tallytest as tt
from test_dashboard import dashboard_url, get, selenium_driver, tokens_cluster

PY = "/usr/bin/python3"

# Two-class TorchScript networks on [0, 1] RGB: red alone over 0.6 (mean Dice 0.35 on this data), red over
# both other channels by 0.25 (0.37: better), and that one's opposite (clearly worse).
MODELS = textwrap.dedent("""
    import sys
    import torch

    class Good(torch.nn.Module):
        def forward(self, x):
            d = torch.minimum(x[:, 0:1] - x[:, 2:3], x[:, 0:1] - x[:, 1:2]) - 0.25
            return torch.cat([-d, d], 1)

    class Worse(torch.nn.Module):
        def forward(self, x):
            d = torch.minimum(x[:, 0:1] - x[:, 2:3], x[:, 0:1] - x[:, 1:2]) - 0.25
            return torch.cat([d, -d], 1)

    class Red(torch.nn.Module):
        def forward(self, x):
            d = x[:, 0:1] - 0.6
            return torch.cat([-d, d], 1)

    for name, m in (("good", Good()), ("worse", Worse()), ("red", Red())):
        torch.jit.script(m.eval()).save(sys.argv[1] + "/" + name + ".pt")
""")


class FollowTest(unittest.TestCase):
    def setUp(self):
        self.root = tt.tmpdir(self)
        self.models = os.path.join(self.root, "models")
        os.makedirs(self.models)
        script = os.path.join(self.models, "make.py")  # TorchScript reads the source: a file, not -c.
        tt.write_text(script, MODELS)
        subprocess.run([PY, script, self.models], check=True)
        self.manifest = tt.write_dataset(os.path.join(self.root, "data"), np.random.default_rng(5), 60, [(16, 16)],
                                         classes=2)
        self.runs = os.path.join(self.root, "runs")
        os.makedirs(self.runs)

    def write(self, name, model, chunks=1, pause=0.0, nbytes=None):
        """The trainer: `model`'s bytes (the first `nbytes`) into runs/name, in chunks."""
        with open(os.path.join(self.models, model + ".pt"), "rb") as f:
            data = f.read()
        data = data[:nbytes] if nbytes else data
        step = (len(data) + chunks - 1) // chunks
        with open(os.path.join(self.runs, name), "wb") as f:
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                f.flush()
                time.sleep(pause)

    def follow(self, cluster, follow_id):
        for f in json.loads(cluster.cli("follows", "--json").stdout).get("follows", []):
            if f["follow_id"] == follow_id:
                return f
        raise AssertionError("no follow " + follow_id)

    def wait_state(self, cluster, follow_id, name, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                f = self.follow(cluster, follow_id)
            except (AssertionError, subprocess.CalledProcessError):
                time.sleep(0.3)  # tallyd restarting.
                continue
            for c in f.get("checkpoints", []):
                if c["name"] == name and c.get("state") in states:
                    return f, c
            time.sleep(0.2)
        raise AssertionError(f"{name} never reached {states}: {self.follow(cluster, follow_id)}")

    def test_every_complete_checkpoint_once_the_worse_stopped_a_restart_survived(self):
        cluster = tt.Cluster(self, os.path.join(self.root, "cluster"))
        for _ in range(2):
            cluster.start_worker()
        cluster.wait_registered(2)
        follow_id = cluster.cli("follow", self.runs, "--manifest", self.manifest, "--settle", "1.5",
                                "--ready-marker", "{}.done", "--load-retries", "2", "--shard-size", "4",
                                "--batch-size", "4", "--on-new-best", "echo $TALLY_STEP $TALLY_METRIC >> " + self.root +
                                "/best.txt", "--detach").stdout.strip()
        self.assertTrue(follow_id.startswith("f"), follow_id)
        self.write("ckpt-100.pt", "red", chunks=4, pause=0.4)  # Slowly: taken only once it settled.
        self.wait_state(cluster, follow_id, "ckpt-100.pt", ("best",))
        self.write("ckpt-200.pt", "good")
        self.wait_state(cluster, follow_id, "ckpt-200.pt", ("running", "best"))
        os.remove(os.path.join(self.runs, "ckpt-200.pt"))  # Rotated away after it was taken.
        self.wait_state(cluster, follow_id, "ckpt-200.pt", ("best",))
        self.write("ckpt-300.pt", "worse")
        open(os.path.join(self.runs, "ckpt-300.pt.done"), "w").close()  # The trainer's marker: taken at once.
        _, worse = self.wait_state(cluster, follow_id, "ckpt-300.pt", ("worse", "not better", "best"))
        self.write("ckpt-400.pt", "good", nbytes=300)  # Truncated for ever.
        self.wait_state(cluster, follow_id, "ckpt-400.pt", ("failed",), timeout=180)
        # tallyd killed; a checkpoint lands meanwhile; the next tallyd takes it, and nothing twice.
        cluster.tallyd.kill()
        cluster.tallyd.wait()
        self.write("ckpt-500.pt", "good")
        cluster.start_tallyd()
        self.wait_state(cluster, follow_id, "ckpt-500.pt", ("running", "not better", "best", "worse"))
        self.write("ckpt-500.pt", "worse")  # Saved over in place once taken ("wb": the same file): not what is scored.
        f, _ = self.wait_state(cluster, follow_id, "ckpt-500.pt", ("not better", "best", "worse"))
        states = {c["name"]: c for c in f["checkpoints"]}
        self.assertEqual(states["ckpt-100.pt"]["state"], "best")
        self.assertEqual(states["ckpt-200.pt"]["state"], "best")
        self.assertEqual(worse["state"], "worse")
        self.assertLess(int(worse["race_rows"]), 30, worse)  # Stopped after a fraction of its 60 rows.
        self.assertLess(worse["race_hi"], 0)
        self.assertEqual(states["ckpt-400.pt"]["load_attempts"], 2)
        self.assertIn("ckpt-400.pt", states["ckpt-400.pt"]["reason"])
        self.assertEqual(states["ckpt-500.pt"]["state"], "not better")  # The same network as 200.
        self.assertEqual(f["best_step"], "200")
        # The copies of checkpoints that never became the best are deleted once decided; the best ones' stay.
        self.assertFalse(os.path.exists(states["ckpt-300.pt"]["taken_path"]))
        self.assertFalse(os.path.exists(states["ckpt-500.pt"]["taken_path"]))
        self.assertTrue(os.path.exists(states["ckpt-200.pt"]["taken_path"]))
        # Each complete checkpoint's job once (the truncated one: once a load).
        jobs = json.loads(cluster.cli("jobs", "--label", "follow=" + follow_id, "--json").stdout)["jobs"]
        steps = sorted(j["spec"]["labels"]["step"] for j in jobs)
        self.assertEqual(steps, ["100", "200", "300", "400", "400", "500"])
        # The curve's numbers are each checkpoint's own report's: the mean over rows of class 1's Dice.
        with open(os.path.join(cluster.state, "follows", follow_id, "report", "curve.json")) as fh:
            curve = {p["checkpoint"]: p for p in json.load(fh)["points"]}
        for name in ("ckpt-100.pt", "ckpt-200.pt", "ckpt-500.pt"):
            out = os.path.join(self.root, "report_" + name)
            cluster.fetch(states[name]["job_id"], out)
            dice = [float(r["dice"]) for r in tt.read_per_image(out) if r["class"] == "1"]
            dice = [d for d in dice if not math.isnan(d)]
            self.assertTrue(tt.same(curve[name]["metrics"]["dice"]["mean"], sum(dice) / len(dice)), name)
        self.assertTrue(os.path.exists(os.path.join(cluster.state, "follows", follow_id, "report", "curve.html")))
        # --on-new-best ran for each new best, on tallyd's host.
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(os.path.join(self.root, "best.txt")):
            time.sleep(0.2)
        with open(os.path.join(self.root, "best.txt")) as fh:
            self.assertEqual(fh.read().split("\n")[:2], ["100 dice", "200 dice"])
        p = cluster.cli("delete", follow_id, check=False)  # Following: refused.
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cancel it first", p.stderr)
        p = cluster.cli("cancel", follow_id)
        self.assertIn("cancelled", p.stdout)
        cluster.cli("delete", follow_id)
        self.assertEqual(json.loads(cluster.cli("follows", "--json").stdout).get("follows", []), [])
        self.assertFalse(os.path.exists(os.path.join(cluster.state, "follows", follow_id)))
        self.assertEqual(len(json.loads(cluster.cli("jobs", "--label", "follow=" + follow_id, "--json").stdout)["jobs"]), 6)

    def test_the_dashboard_draws_the_curve(self):
        cluster = tt.Cluster(self, os.path.join(self.root, "cluster"), tallyd_args=["--http-listen", "127.0.0.1:0"])
        cluster.start_worker()
        cluster.wait_registered(1)
        url = dashboard_url(cluster)
        follow_id = cluster.cli("follow", self.runs, "--manifest", self.manifest, "--settle", "0.5", "--detach",
                                "--shard-size", "8").stdout.strip()
        self.write("ckpt-100.pt", "red")
        self.wait_state(cluster, follow_id, "ckpt-100.pt", ("best",))
        self.write("ckpt-200.pt", "good")
        f, _ = self.wait_state(cluster, follow_id, "ckpt-200.pt", ("best",))
        # The JSON is the gRPC answer's; the files are the follow's report folder's.
        status, _, body = get(url + "/api/follows")
        self.assertEqual(status, 200)
        listed = json.loads(body)["follows"]
        self.assertEqual([x["follow_id"] for x in listed], [follow_id])
        status, _, body = get(f"{url}/api/follows/{follow_id}")
        one = json.loads(body)
        self.assertEqual([(c["name"], c["state"]) for c in one["checkpoints"]],
                         [(c["name"], c["state"]) for c in f["checkpoints"]])
        folder = os.path.join(cluster.state, "follows", follow_id, "report")
        for name in ("curve.csv", "curve.json", "curve.html"):
            status, _, body = get(f"{url}/api/follows/{follow_id}/files/{name}")
            with open(os.path.join(folder, name), "rb") as fh:
                self.assertEqual((status, body), (200, fh.read()), name)
        self.assertEqual(get(url + "/api/follows/f-none")[0], 404)
        self.assertEqual(get(f"{url}/api/follows/{follow_id}/files/report.json")[0], 404)
        # The page draws each metric against the step: a point per checkpoint at its curve.json mean, the
        # interval as a band.
        with open(os.path.join(folder, "curve.json")) as fh:
            curve = {p["step"]: p["metrics"]["dice"] for p in json.load(fh)["points"]}
        driver = selenium_driver()
        if driver is None:
            self.skipTest("the page needs chromium-driver and python3-selenium")
        self.addCleanup(driver.quit)
        driver.get(f"{url}/#/follow/{follow_id}")
        deadline = time.time() + 30
        dots = []
        while time.time() < deadline and len(dots) < 2:
            dots = driver.find_elements("css selector", "figure[data-metric='dice'] circle")
            time.sleep(0.2)
        self.assertEqual(len(dots), 2)
        for dot in dots:
            want = curve[int(dot.get_attribute("data-step"))]
            for key in ("mean", "lo", "hi"):
                self.assertTrue(tt.same(float(dot.get_attribute("data-" + key)), want[key]), (key, want))
        band = driver.find_element("css selector", "figure[data-metric='dice'] polygon.band").get_attribute("points")
        self.assertEqual(len(band.split()), 4)
        self.assertIn("ckpt-200.pt", driver.find_element("id", "checkpoints-table").text)
        shots = os.environ.get("TALLY_ARTEFACTS") or self.root
        os.makedirs(shots, exist_ok=True)
        driver.save_screenshot(os.path.join(shots, "dashboard-follow.png"))
        print("screenshot:", os.path.join(shots, "dashboard-follow.png"))
        driver.get(f"{url}/#/follows")
        deadline = time.time() + 30
        while time.time() < deadline and follow_id not in driver.find_element("id", "main").text:
            time.sleep(0.2)
        self.assertIn(follow_id, driver.find_element("id", "follows-table").text)

    def test_a_client_token_sees_its_own_follows_only(self):
        os.makedirs(os.path.join(self.root, "tokens"))
        c, t = tokens_cluster(self, os.path.join(self.root, "tokens"))
        url = dashboard_url(c)
        as_user = lambda name, *args, check=True: tt.tally(*args, "--server", c.address, "--token-file", t[name][1],
                                                           check=check)
        mine = as_user("alice", "follow", self.runs, "--manifest", self.manifest, "--detach").stdout.strip()
        ids = lambda name: [f["follow_id"] for f in json.loads(as_user(name, "follows", "--json").stdout).get("follows", [])]
        self.assertEqual(ids("alice"), [mine])
        self.assertEqual(ids("admin"), [mine])
        self.assertEqual(ids("bob"), [])
        p = as_user("bob", "cancel", mine, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"no follow '{mine}'", p.stderr)
        # The dashboard answers as gRPC does: bob's list is empty, alice's follow is not found for him.
        self.assertEqual(json.loads(get(url + "/api/follows", t["bob"][0])[2]).get("follows", []), [])
        self.assertEqual(get(f"{url}/api/follows/{mine}", t["bob"][0])[0], 404)
        self.assertEqual(get(f"{url}/api/follows/{mine}/files/curve.csv", t["bob"][0])[0], 404)
        self.assertEqual(json.loads(get(f"{url}/api/follows/{mine}", t["alice"][0])[2])["follow_id"], mine)
        self.assertEqual(get(url + "/api/follows")[0], 401)
        self.assertIn("cancelled", as_user("alice", "cancel", mine).stdout)

    def test_run_follow_ends_at_its_step_and_leaves_the_curve(self):
        # Three checkpoints already there: with --catch-up all the newest first, then the others.
        self.write("ckpt-100.pt", "red")
        self.write("ckpt-200.pt", "good")
        self.write("ckpt-300.pt", "worse")
        out = os.path.join(self.root, "out")
        p = tt.tally("run", "--follow", self.runs, "--manifest", self.manifest, "--out", out, "--workers", "2",
                     "--settle", "0.5", "--catch-up", "all", "--until-step", "300", "--shard-size", "4")
        self.assertIn("best step 200", p.stdout)
        with open(os.path.join(out, "curve.csv")) as f:
            rows = {r["checkpoint"]: r for r in csv.DictReader(f)}
        self.assertEqual(set(rows), {"ckpt-100.pt", "ckpt-200.pt", "ckpt-300.pt"})
        self.assertEqual(rows["ckpt-300.pt"]["decision"], "best")  # The first evaluated: the best then.
        self.assertEqual(rows["ckpt-200.pt"]["decision"], "best")
        self.assertIn(rows["ckpt-100.pt"]["decision"], ("not better", "worse"))
        self.assertEqual(rows["ckpt-100.pt"]["best_step"], "200")
        for name in ("curve.json", "curve.html"):
            self.assertTrue(os.path.exists(os.path.join(out, name)))

    def test_a_python_model_takes_each_checkpoint_as_its_checkpoint_option(self):
        model = os.path.join(self.root, "threshold_model.py")
        tt.write_text(model, textwrap.dedent("""
            import numpy as np

            class Model:
                num_classes = 2

                def __init__(self, devices, options):
                    with open(options["checkpoint"]) as f:
                        self.t = float(f.read())  # A file that is no number does not load.

                def predict(self, images, rows):
                    return [(im[..., 0] > self.t).astype(np.int64) for im in images]
        """))
        for step, content in ((1, "150"), (2, "120"), (3, "1x")):
            tt.write_text(os.path.join(self.runs, f"ckpt-{step}.txt"), content)
        out = os.path.join(self.root, "out_py")
        p = tt.tally("run", "--follow", self.runs, "--pattern", "*.txt", "--model", model, "--python", PY,
                     "--manifest", self.manifest, "--out", out, "--settle", "0.5", "--catch-up", "all",
                     "--until-step", "3", "--load-retries", "2", "--race", "off")
        with open(os.path.join(out, "curve.csv")) as f:
            rows = {r["step"]: r for r in csv.DictReader(f)}
        self.assertEqual(rows["3"]["decision"], "failed")
        self.assertIn("could not convert string to float", rows["3"]["reason"])
        self.assertIn(rows["1"]["decision"], ("best", "not better"))
        self.assertIn(rows["2"]["decision"], ("best", "not better"))
        self.assertIn("best step", p.stdout)


if __name__ == "__main__":
    unittest.main()
