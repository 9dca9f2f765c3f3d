"""The web dashboard (`tallyd --http-listen`, docs/operations.md "Dashboard"): its JSON against the gRPC API's
answers, tokens (unauthenticated refused, a client token sees only its own jobs), report files,
hostile requests answered with clear errors and no crash, and the page itself driven by headless
Chromium (Debian's chromium-driver and python3-selenium): a job submitted while the page is open
appears, advances and finishes with its report shown; a client token's page lists only its jobs;
the workers page shows a SIGSTOPped worker going silent. Screenshots of each page are kept in
$TALLY_ARTEFACTS (default: the test's folder, printed)."""
import json
import os
import re
import signal
import time
import unittest
import urllib.error
import urllib.request

import numpy as np

import tallytest as tt
from test_live import write_predictions
from test_security import make_token


def dashboard_url(c):
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"dashboard on (http://\S+/)", c.log("tallyd.log"))
        if m:
            return m.group(1).rstrip("/")
        time.sleep(0.1)
    raise AssertionError("tallyd did not say where its dashboard is")


def get(url, token=None, method="GET"):
    """(status, content type, body) of a request to the dashboard."""
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def tokens_cluster(test, root):
    tokens = os.path.join(root, "tokens")
    t = {name: make_token(root, name, role, tokens) for name, role in
         (("alice", "client"), ("bob", "client"), ("admin", "admin"), ("box", "worker"))}
    c = tt.Cluster(test, os.path.join(root, "c"), tallyd_args=["--auth-tokens", tokens, "--http-listen", "127.0.0.1:0"],
                   client_args=["--token-file", t["admin"][1]])
    return c, t


class DashboardApiTest(unittest.TestCase):
    def test_json_equals_the_grpc_answers_and_tokens_apply(self):
        root = tt.tmpdir(self)
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(1), 30)
        c, t = tokens_cluster(self, root)
        url = dashboard_url(c)
        c.start_worker(env={"TALLY_TOKEN": t["box"][0]})
        as_user = lambda who, *args: tt.tally(*args, "--server", c.address, "--token-file", t[who][1])  # noqa: E731
        alice_job = as_user("alice", "submit", "--manifest", manifest, "--label", "team=a").stdout.strip()
        bob_job = as_user("bob", "submit", "--manifest", manifest, "--until-ci", "0.5", "--min-rows", "5").stdout.strip()
        for j in (alice_job, bob_job):
            self.assertEqual(c.wait(j)["state"], "succeeded")
        # No token, a wrong one: refused.
        self.assertEqual(get(url + "/api/jobs")[0], 401)
        self.assertEqual(get(url + "/api/jobs", "not-a-token")[0], 401)
        self.assertEqual(get(url + "/api/jobs", t["box"][0])[0], 403)  # A worker token is no browser's.
        # The page itself holds no data and needs no token.
        status, ctype, body = get(url + "/")
        self.assertEqual((status, ctype), (200, "text/html; charset=utf-8"))
        self.assertNotIn(alice_job.encode(), body)
        self.assertNotIn(b"http://", body.replace(b"http://www.w3.org", b""))  # Nothing fetched from elsewhere.
        # The admin's list equals `tally jobs --json`; each job equals `tally status --json`.
        _, _, body = get(url + "/api/jobs", t["admin"][0])
        mine = json.loads(body)
        grpc = json.loads(as_user("admin", "jobs", "--json").stdout)
        self.assertEqual(mine, grpc)
        self.assertEqual({j["job_id"] for j in mine["jobs"]}, {alice_job, bob_job})
        for j in (alice_job, bob_job):
            _, _, body = get(f"{url}/api/jobs/{j}", t["admin"][0])
            self.assertEqual(json.loads(body), json.loads(as_user("admin", "status", j, "--json").stdout))
        # Alice sees her job only; bob's is "not found" to her, as over gRPC.
        _, _, body = get(url + "/api/jobs", t["alice"][0])
        self.assertEqual([j["job_id"] for j in json.loads(body)["jobs"]], [alice_job])
        self.assertEqual(get(f"{url}/api/jobs/{bob_job}", t["alice"][0])[0], 404)
        self.assertEqual(get(f"{url}/api/jobs/{bob_job}/files/report.json", t["alice"][0])[0], 404)
        # Filters: by label, by state.
        _, _, body = get(url + "/api/jobs?label=team%3Da", t["admin"][0])
        self.assertEqual([j["job_id"] for j in json.loads(body)["jobs"]], [alice_job])
        _, _, body = get(url + "/api/jobs?state=running", t["admin"][0])
        self.assertEqual(json.loads(body).get("jobs", []), [])
        # Report files: the same bytes `tally report` writes.
        out = os.path.join(root, "out")
        c.fetch(alice_job, out)
        for name, ctype in (("report.json", "application/json"), ("per_image.csv", "text/csv; charset=utf-8"),
                            ("report.html", "text/html; charset=utf-8")):
            status, got_type, body = get(f"{url}/api/jobs/{alice_job}/files/{name}", t["alice"][0])
            self.assertEqual((status, got_type), (200, ctype), name)
            with open(os.path.join(out, name), "rb") as f:
                self.assertEqual(body, f.read(), name)
        # Workers: the same as `tally workers --json`, less the fields that tick.
        _, _, body = get(url + "/api/workers", t["admin"][0])
        names = [w["name"] for w in json.loads(body)["workers"]]
        self.assertEqual(names, [w["name"] for w in json.loads(as_user("admin", "workers", "--json").stdout)["workers"]])
        # Hostile or malformed requests: clear errors, tallyd alive.
        for path, want in (("/api/jobs/..%2F..%2Fetc%2Fpasswd", 400), ("/api/jobs/x/files/../../tally.db", 404),
                           ("/api/jobs?limit=0", 400), ("/api/jobs?limit=99999999999999999999", 400),
                           ("/api/jobs?state=%ZZ", 400), ("/api/jobs?state=%3Cscript%3E", 400),
                           ("/api/jobs/" + "a" * 300, 400), ("/api/compare?a=x", 400), ("/nothing", 404),
                           ("/api/jobs?" + "x=1&" * 2000, 400), (f"/api/jobs/{alice_job}/files/secret.txt", 404),
                           ("/api/jobs/nope", 404)):
            status, ctype, body = get(url + path, t["admin"][0])
            self.assertEqual(status, want, path)
            self.assertIn("error", json.loads(body), path)
        self.assertEqual(get(url + "/api/jobs", t["admin"][0], method="POST")[0], 405)
        status, _, _ = get(url + "/api/jobs?" + "a" * 40000, t["admin"][0])
        self.assertGreaterEqual(status, 400)
        self.assertEqual(get(url + "/api/jobs", t["admin"][0])[0], 200)
        # Compare of two finished jobs of one manifest.
        other = as_user("alice", "submit", "--manifest", manifest, "--metrics", "dice").stdout.strip()
        self.assertEqual(c.wait(other)["state"], "succeeded")
        status, _, body = get(f"{url}/api/compare?a={alice_job}&b={other}", t["alice"][0])
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["paired_images"], 30)
        # Unique prefixes, as the CLI takes them.
        status, _, body = get(f"{url}/api/compare?a={alice_job[:-1]}&b={other[:-1]}", t["alice"][0])
        self.assertEqual(status, 200, body)
        self.assertEqual((json.loads(body)["a"], json.loads(body)["b"]), (alice_job, other))
        status, _, body = get(f"{url}/api/compare?a=j&b={other}", t["alice"][0])
        self.assertEqual(status, 400, body)
        self.assertIn("ambiguous", json.loads(body)["error"])
        # Without a token: 200 from /api/session (no error in a browser's console), and a 401 that
        # speaks of the dashboard's token box, not of command-line flags.
        status, _, body = get(url + "/api/session")
        self.assertEqual((status, json.loads(body)), (200, {"tokens_required": True, "authenticated": False}))
        status, _, body = get(url + "/api/session", "not-a-token")
        self.assertFalse(json.loads(body)["authenticated"])
        self.assertIn("refused", json.loads(body)["error"])
        status, _, body = get(url + "/api/session", t["alice"][0])
        self.assertEqual(json.loads(body), {"tokens_required": True, "authenticated": True, "name": "alice"})
        status, _, body = get(url + "/api/jobs")
        self.assertEqual(status, 401)
        self.assertIn("token box", json.loads(body)["error"])
        self.assertNotIn("--token-file", json.loads(body)["error"])
        self.assertEqual(get(url + "/favicon.ico")[0], 204)


class DashboardTlsTest(unittest.TestCase):
    def test_a_tls_tallyd_keeps_its_dashboard_on_loopback(self):
        import subprocess
        from test_security import server_pki
        root = tt.tmpdir(self)
        _, _, cert, key = server_pki(root)
        base = [os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key]
        p = subprocess.run(base + ["--state-dir", os.path.join(root, "s1"), "--http-listen", "0.0.0.0:0"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot serve HTTPS; listen on 127.0.0.1", p.stderr)
        log = open(os.path.join(root, "tallyd.log"), "w")
        d = subprocess.Popen(base + ["--state-dir", os.path.join(root, "s2"), "--http-listen", "127.0.0.1:0"],
                             stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: (d.terminate(), d.wait()))
        deadline, url = time.time() + 30, None
        while url is None and time.time() < deadline:
            m = re.search(r"dashboard on (http://127\.0\.0\.1:\d+)/", open(os.path.join(root, "tallyd.log")).read())
            url = m and m.group(1)
            time.sleep(0.1)
        self.assertIsNotNone(url)
        self.assertEqual(get(url + "/")[0], 200)


def selenium_driver():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    options = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(a)
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # The console, read by the test.
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


@unittest.skipUnless(os.path.exists("/usr/bin/chromedriver"), "needs chromium-driver")
class DashboardPageTest(unittest.TestCase):
    def wait_for(self, driver, fn, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if fn():
                    return
            except Exception:  # noqa: BLE001 (the page is redrawn under us every 2 s)
                pass
            time.sleep(0.2)
        self.fail(f"the page never showed {what}")

    def shot(self, driver, name):
        folder = os.environ.get("TALLY_ARTEFACTS") or self.root
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"dashboard-{name}.png")
        driver.save_screenshot(path)
        print("screenshot:", path)

    def test_the_page_follows_a_job_and_the_workers(self):
        self.root = root = tt.tmpdir(self)
        manifest = write_predictions(os.path.join(root, "p"), np.random.default_rng(2), 60)
        c, t = tokens_cluster(self, root)
        url = dashboard_url(c)
        slow = c.start_worker(env={"TALLY_TOKEN": t["box"][0], "TALLY_TEST_THROTTLE_MS": "60"})
        c.wait_registered(1)
        driver = selenium_driver()
        self.assertIsNotNone(driver, "python3-selenium is missing")
        self.addCleanup(driver.quit)
        driver.get(url + "/#/jobs")
        self.wait_for(driver, lambda: driver.find_element("id", "tok"), "the token prompt")
        # What is typed survives the page's refresh period; a wrong token is said to be wrong.
        driver.find_element("id", "tok").send_keys("half-typed")
        time.sleep(2.5)
        self.assertEqual(driver.find_element("id", "tok").get_attribute("value"), "half-typed")
        driver.find_element("id", "tok-ok").click()
        self.wait_for(driver, lambda: "refused" in driver.find_element("id", "tok-msg").text, "the refusal")
        # The first load and a refused token logged nothing in the console (no 401, no favicon 404).
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        self.assertEqual(severe, [])
        driver.find_element("id", "tok").clear()
        driver.find_element("id", "tok").send_keys(t["alice"][0])
        driver.find_element("id", "tok-ok").click()
        self.wait_for(driver, lambda: "no jobs" in driver.find_element("id", "jobs-table").text, "an empty job list")
        job = tt.tally("submit", "--server", c.address, "--token-file", t["alice"][1], "--manifest", manifest,
                       "--shard-size", "4", "--order", "random:1").stdout.strip()
        bob_job = tt.tally("submit", "--server", c.address, "--token-file", t["bob"][1], "--manifest",
                           manifest).stdout.strip()
        self.wait_for(driver, lambda: job in driver.find_element("id", "jobs-table").text, "the submitted job")
        self.assertNotIn(bob_job, driver.find_element("id", "jobs-table").text)  # Alice's page: hers only.
        self.wait_for(driver, lambda: "running" in driver.find_element("css selector", f"tr[data-job='{job}']").text,
                      "the job running")
        self.shot(driver, "jobs")
        driver.get(f"{url}/#/job/{job}")
        self.wait_for(driver, lambda: "Live estimates" in driver.find_element("id", "main").text, "live estimates")
        self.shot(driver, "job-running")
        self.wait_for(driver, lambda: driver.find_element("id", "report"), "the report once finished", timeout=120)
        driver.switch_to.frame(driver.find_element("id", "report"))
        self.wait_for(driver, lambda: "Tally report" in driver.find_element("tag name", "body").text, "report.html")
        driver.switch_to.default_content()
        self.shot(driver, "job-finished")
        # Workers: the throttled worker, then SIGSTOPped: its "last seen" grows.
        driver.get(f"{url}/#/workers")
        self.wait_for(driver, lambda: driver.find_element("id", "workers-table"), "the workers")
        slow.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: slow.poll() is None and slow.send_signal(signal.SIGCONT))

        def silent():  # Its heartbeat ages, until tallyd drops it after the lease period.
            if "no workers" in driver.find_element("id", "main").text:
                return True
            return float(driver.find_element("css selector", "td.seen").text.split()[0]) >= 1.5
        self.wait_for(driver, silent, "the stopped worker going silent", timeout=30)
        self.assertIn("Model loaded", driver.find_element("id", "workers-table").text)
        self.shot(driver, "workers")
        slow.send_signal(signal.SIGCONT)
        # Compare: a second run of the same manifest, picked and compared on the page.
        # (--ignore-index 2: class 2's pixels leave the count, so some rows' Dice change.)
        other = tt.tally("submit", "--server", c.address, "--token-file", t["alice"][1], "--manifest", manifest,
                         "--metrics", "dice", "--ignore-index", "2").stdout.strip()
        self.assertEqual(c.wait(other)["state"], "succeeded")
        driver.get(f"{url}/#/compare")
        self.wait_for(driver, lambda: driver.find_element("id", "cmp-a"), "the compare form")
        driver.find_element("id", "cmp-a").send_keys(job[:-1])  # Prefixes, as the CLI takes them.
        driver.find_element("id", "cmp-b").send_keys(other[:-1])
        driver.find_element("id", "cmp-go").click()
        self.wait_for(driver, lambda: "60 paired rows" in driver.find_element("id", "cmp-out").text, "the paired table")
        table = driver.find_element("id", "cmp-table").text
        self.assertIn("B higher", table)
        self.assertIsNone(re.search(r"\d\.\d{9,}", table), table)  # p-values formatted, not 20 digits.
        self.assertIn("images whose Dice changed most", driver.find_element("id", "cmp-out").text)
        # The same figures as `tally compare` writes (its JSON), shown to the page's precision.
        cmp = json.loads(get(f"{url}/api/compare?a={job}&b={other}", t["alice"][0])[2])
        dice = next(cls["dice"] for cls in cmp["classes"] if cls["class"] == 1)
        ci = dice["diff_ci95"]
        shown = "—" if ci is None or None in ci else f"[{ci[0]:.4f}, {ci[1]:.4f}]"
        self.assertIn(shown, table)
        self.shot(driver, "compare")


if __name__ == "__main__":
    unittest.main()
