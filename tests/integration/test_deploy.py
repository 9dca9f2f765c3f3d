"""The systemd units in deploy/: hardened (systemd-analyze's offline security score), their flags
known to the binaries, and the readiness/watchdog protocol (sd_notify) they rely on, spoken by the
real tallyd and tally-worker to a datagram socket standing in for systemd."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import unittest

import tallytest as tt

UNITS = {"tallyd.service": "tallyd", "tally-worker@.service": "tally-worker"}
ANALYZE = shutil.which("systemd-analyze")


def unit_text(name):
    with open(os.path.join(tt.SRC, "deploy", name)) as f:
        return f.read()


class UnitTest(unittest.TestCase):
    @unittest.skipIf(ANALYZE is None, "systemd-analyze is not installed (Debian's systemd package)")
    def test_exposure_at_most_5(self):
        for name in UNITS:
            p = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager",
                                os.path.join(tt.SRC, "deploy", name)], capture_output=True, text=True)
            m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout + p.stderr)
            self.assertIsNotNone(m, p.stdout + p.stderr)
            self.assertLessEqual(float(m.group(1)), 5.0, f"{name}:\n{p.stdout}")

    def test_notify_type_watchdog_and_flags_the_binaries_know(self):
        for name, binary in UNITS.items():
            text = unit_text(name)
            self.assertIn("Type=notify", text)
            self.assertRegex(text, r"WatchdogSec=\d+")
            exec_start = re.search(r"^ExecStart=(\S+) (.*)$", text, re.M)
            self.assertEqual(os.path.basename(exec_start.group(1)), binary)
            helptext = subprocess.run([os.path.join(tt.BIN, binary), "--helpfull"], capture_output=True,
                                      text=True).stdout
            for flag in re.findall(r"--([a-z][a-z0-9_-]*)", exec_start.group(2)):
                self.assertRegex(helptext, r"--%s\b" % flag.replace("-", "[-_]"), f"{name}: --{flag}")


# In every Debian image already.
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6"}


def package_of(path):
    """The Debian package that installed a library file (merged /usr: try both spellings)."""
    real = os.path.realpath(path)
    for candidate in (path, "/usr" + path, real, "/usr" + real):
        p = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if p.returncode == 0:
            return p.stdout.split(":")[0]
    return None


class DockerfileTest(unittest.TestCase):
    def setUp(self):
        with open(os.path.join(tt.SRC, "Dockerfile")) as f:
            self.text = f.read()

    def test_the_build_stage_is_the_readme_s(self):
        with open(os.path.join(tt.SRC, "README.md")) as f:
            readme = f.read()
        build = self.text[self.text.index(" AS build"):self.text.index(" AS runtime")]
        for script in ("scripts/install-deps.sh", "scripts/build.sh"):
            self.assertIn(script, build)
        with open(os.path.join(tt.SRC, "scripts", "demo.sh")) as f:
            demo = f.read()
        # The README's set-up command is scripts/demo.sh, which runs the same two scripts.
        self.assertIn("./scripts/demo.sh", readme)
        self.assertIn("scripts/install-deps.sh", demo)
        self.assertIn("scripts/build.sh", demo)

    @unittest.skipIf(shutil.which("dpkg") is None or shutil.which("readelf") is None, "needs dpkg and readelf")
    def test_the_runtime_image_has_every_library_the_binaries_link_and_no_root(self):
        runtime = self.text[self.text.index(" AS runtime"):]
        install = re.search(r"apt-get install -y --no-install-recommends(.*?)&&", runtime, re.S).group(1)
        packages = set(install.replace("\\", " ").split())
        for binary in ("tallyd", "tally-worker", "tally"):
            path = os.path.join(tt.BIN, binary)
            needed = re.findall(r"\(NEEDED\).*\[(.+)\]", subprocess.run(["readelf", "-d", path], capture_output=True,
                                                                        text=True).stdout)
            resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", subprocess.run(["ldd", path], capture_output=True,
                                                                           text=True).stdout, re.M))
            self.assertTrue(needed)
            for lib in needed:
                package = package_of(resolved[lib])
                self.assertIsNotNone(package, f"{binary}: {lib}")
                if package not in BASE_PACKAGES:
                    self.assertIn(package, packages, f"{binary} links {lib} from {package}, missing in the runtime image")
        self.assertRegex(runtime, r"\nUSER tally\n")
        self.assertIn("python3-numpy", packages)  # The Python backend's stub.


def known_flags(binary):
    """Flags a binary takes: its --helpfull (tally: the help of the verbs used here), plus
    --data-root, which tallyd and tally-worker read by hand because it repeats."""
    if binary == "tally":
        text = "".join(subprocess.run([os.path.join(tt.BIN, "tally"), verb, "--help"], capture_output=True,
                                      text=True).stdout for verb in ("submit", "wait", "report", "jobs"))
    else:
        text = subprocess.run([os.path.join(tt.BIN, binary), "--helpfull"], capture_output=True, text=True).stdout
    flags = {f.replace("-", "_") for f in re.findall(r"--([a-z][a-z0-9_-]*)", text)}
    return flags | ({"data_root"} if binary != "tally" else set())


def flag_names(args):
    return {a[2:].split("=")[0].replace("-", "_") for a in args if a.startswith("--")}


class KubernetesTest(unittest.TestCase):
    DIR = os.path.join(tt.SRC, "deploy", "kubernetes")

    def load(self, name):
        import yaml
        with open(os.path.join(self.DIR, name)) as f:
            return [d for d in yaml.safe_load_all(f) if d]

    def test_manifests(self):
        kustomization = self.load("kustomization.yaml")[0]
        files = sorted(f for f in os.listdir(self.DIR) if f.endswith(".yaml") and f != "kustomization.yaml")
        self.assertEqual(sorted(kustomization["resources"]), files)
        docs = {}
        for f in files:
            for d in self.load(f):
                docs[(d["kind"], d["metadata"]["name"])] = d
        tallyd = docs[("StatefulSet", "tallyd")]
        self.assertEqual(tallyd["spec"]["replicas"], 1)
        self.assertEqual(tallyd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "state")
        c = tallyd["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["args"][0], "tallyd")
        self.assertLessEqual(flag_names(c["args"]), known_flags("tallyd"))
        port = c["ports"][0]["containerPort"]
        self.assertIn(f"--listen=0.0.0.0:{port}", c["args"])
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["grpc"]["port"], port)  # grpc.health.v1 (docs/deployment.md "Deployment").
        self.assertIn({"name": "state", "mountPath": "/var/lib/tally"}, c["volumeMounts"])
        self.assertIn("--state-dir=/var/lib/tally", c["args"])
        service = docs[("Service", "tallyd")]
        self.assertEqual(service["spec"]["ports"][0]["port"], port)
        self.assertEqual(service["spec"]["selector"], tallyd["spec"]["template"]["metadata"]["labels"])
        workers = docs[("Deployment", "tally-worker")]
        w = workers["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(w["args"][0], "tally-worker")
        self.assertEqual(w["args"][2], "--device=cuda:0")  # The overlay replaces args[2].
        self.assertLessEqual(flag_names(w["args"]), known_flags("tally-worker"))
        self.assertIn(f"--coordinator=tallyd:{port}", w["args"])
        self.assertEqual(w["resources"]["limits"]["nvidia.com/gpu"], 1)
        for pod in (tallyd, workers):
            spec = pod["spec"]["template"]["spec"]
            self.assertTrue(spec["securityContext"]["runAsNonRoot"])
            self.assertEqual(spec["securityContext"]["runAsUser"], 10001)  # The image's user.
            mounted = {m["name"] for m in spec["containers"][0]["volumeMounts"]}
            self.assertEqual(mounted, {v["name"] for v in spec["volumes"]} | ({"state"} if pod is tallyd else set()))
            for v in spec["volumes"]:
                if "secret" in v:  # Every Secret a pod needs is one kustomization.yaml says to create.
                    with open(os.path.join(self.DIR, "kustomization.yaml")) as f:
                        self.assertIn(v["secret"]["secretName"], f.read())
        overlay = self.load(os.path.join("overlays", "cpu-workers", "kustomization.yaml"))[0]
        self.assertEqual(overlay["resources"], ["../.."])
        # The images test_containers builds and runs: tallyd's is the Dockerfile's (tally:latest),
        # the CPU workers' overlay runs the same; the GPU workers' is its GPU variant.
        self.assertEqual(c["image"], "tally:latest")
        self.assertEqual(w["image"], "tally-gpu:latest")
        self.assertIn("value: tally:latest", str(overlay["patches"][0]["patch"]))
        for pod in (tallyd, workers):
            c0 = pod["spec"]["template"]["spec"]["containers"][0]
            self.assertFalse(c0["securityContext"]["allowPrivilegeEscalation"])
            self.assertEqual(c0["securityContext"]["capabilities"]["drop"], ["ALL"])
        self.assertEqual(tallyd["spec"]["template"]["spec"]["securityContext"]["runAsGroup"], 10001)
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        with open(os.path.join(tt.SRC, "Dockerfile")) as f:
            dockerfile = f.read()
        self.assertIn("--uid 10001 --gid 10001", dockerfile)  # The manifests' runAsUser and runAsGroup.
        self.assertIn('"tally", "health", "--server", "127.0.0.1:50051"', dockerfile)  # As the grpc probes.

    @unittest.skipIf(shutil.which("yamllint") is None, "yamllint is not installed")
    def test_yamllint(self):
        p = subprocess.run(["yamllint", "-d", "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}",
                            self.DIR], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


class SlurmTest(unittest.TestCase):
    def test_scripts_parse_and_use_flags_the_binaries_know(self):
        wanted = {"tallyd": {"listen", "state_dir"}, "tally-worker": {"coordinator", "device", "threads", "name"},
                  "tally": {"server", "model", "manifest", "out"}}
        for name in ("tally.sbatch", "workers.sbatch"):
            path = os.path.join(tt.SRC, "deploy", "slurm", name)
            self.assertEqual(subprocess.run(["bash", "-n", path]).returncode, 0, name)
            with open(path) as f:
                text = f.read()
            self.assertIn("--gpus-per-task=1", text)   # GPU jobs: a GPU a task, seen as cuda:0...
            self.assertIn("device=cuda:0", text)
            self.assertIn("device=cpu", text)          # ...CPU jobs: the task's CPUs (test_slurm runs them).
        for binary, flags in wanted.items():
            self.assertLessEqual(flags, known_flags(binary), binary)


class NotifyTest(unittest.TestCase):
    """tallyd and tally-worker tell a NOTIFY_SOCKET READY=1 once they serve, WATCHDOG=1 at half
    WATCHDOG_USEC while alive, and STOPPING=1 when stopped."""

    def listen(self, root, name):
        path = os.path.join(root, name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.2)
        self.addCleanup(sock.close)
        return sock, path

    @staticmethod
    def messages(sock, until, deadline):
        got = []
        while time.time() < deadline:
            try:
                got.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
            if until(got):
                break
        return got

    def test_ready_watchdog_and_stopping(self):
        root = tt.tmpdir(self)
        tallyd_sock, tallyd_path = self.listen(root, "tallyd.sock")
        worker_sock, worker_path = self.listen(root, "worker.sock")
        env = dict(os.environ)
        env.update(NOTIFY_SOCKET=tallyd_path, WATCHDOG_USEC="400000")
        port_file = os.path.join(root, "port")
        tallyd = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--state-dir", os.path.join(root, "state")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(tallyd.kill)
        got = self.messages(tallyd_sock, lambda g: sum("WATCHDOG=1" in m for m in g) >= 2, time.time() + 20)
        self.assertTrue(got and got[0].startswith("READY=1\nSTATUS=serving on 127.0.0.1:0"), got)
        self.assertGreaterEqual(sum(m == "WATCHDOG=1" for m in got), 2, got)
        with open(port_file) as f:
            address = "127.0.0.1:" + f.read().strip()
        env.update(NOTIFY_SOCKET=worker_path, WATCHDOG_USEC="400000")
        worker = subprocess.Popen([os.path.join(tt.BIN, "tally-worker"), "--coordinator", address, "--threads", "1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(worker.kill)
        got = self.messages(worker_sock, lambda g: sum("WATCHDOG=1" in m for m in g) >= 2, time.time() + 20)
        self.assertTrue(got and got[0] == f"READY=1\nSTATUS=registered with {address}", got)
        self.assertGreaterEqual(sum(m == "WATCHDOG=1" for m in got), 2, got)
        for p, sock in ((worker, worker_sock), (tallyd, tallyd_sock)):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=60), 0)
            got = self.messages(sock, lambda g: "STOPPING=1" in g, time.time() + 5)
            self.assertIn("STOPPING=1", got)
        # A watchdog meant for another process (WATCHDOG_PID) is not this one's to feed.
        env.update(NOTIFY_SOCKET=tallyd_path, WATCHDOG_PID="1")
        other = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--state-dir",
                                  os.path.join(root, "state2")], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        self.addCleanup(other.kill)
        got = self.messages(tallyd_sock, lambda g: False, time.time() + 2.5)
        self.assertTrue(got and got[0].startswith("READY=1"), got)
        self.assertNotIn("WATCHDOG=1", got)


if __name__ == "__main__":
    unittest.main()
