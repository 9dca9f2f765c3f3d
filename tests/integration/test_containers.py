"""Containers for real: the project's Dockerfile built by podman on a base image that
debootstrap made from Debian's own packages (no registry is reachable), then tallyd and two
workers as three containers on a podman network, run as the Kubernetes manifests run them
(uid 10001, read-only root file system, no capabilities, gRPC health check):

- a job submitted with `tally submit` from outside the containers equals `tally run`'s report;
- a worker container SIGKILLed mid-job is replaced and the job ends with nothing lost or doubled;
- tallyd's container killed mid-job and started again on its state volume resumes the same job;
- nothing is left running or defined (containers, network, volume) afterwards.

The base image is cached as a tarball (TALLY_CACHE_DIR, default /var/cache/tally) so that later
runs on the same machine skip debootstrap; debootstrap and the image's apt step take their .deb
files from the host's apt cache when they are there (scripts/install-deps.sh leaves them), which
keeps a first run within a few minutes on the 2-core machine. The engine's configuration is this
test's own (CONTAINERS_CONF): runc, and ulimits the VM lets an unprivileged container set
(docs/deployment.md "Containers" says why).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import tallytest as tt

FLAGS = ("--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4")
BASE = "docker.io/library/debian:bookworm-slim"  # What the Dockerfile's runtime stage starts FROM.
IMAGE = "localhost/tally:latest"                  # What deploy/kubernetes runs (tally:latest).
CACHE = os.environ.get("TALLY_CACHE_DIR", "/var/cache/tally")
CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
"""


def missing():
    if os.geteuid() != 0:
        return "needs root (rootful podman)"
    for b in ("podman", "debootstrap", "runc", "cmake"):
        if shutil.which(b) is None and not os.path.exists("/usr/sbin/" + b):
            return f"{b} is not installed (podman, runc, debootstrap: scripts/install-deps.sh)"
    return None


def debian_mirror():
    """The host's Debian mirror (its apt sources), so that the image sees the same archive."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            with open(path) as f:
                for line in f:
                    words = line.split()
                    if words[:1] == ["URIs:"] or (words[:1] == ["deb"] and len(words) > 2):
                        uri = words[1] if words[0] == "URIs:" else next(w for w in words[1:] if "://" in w)
                        if "debian-security" not in uri:
                            return uri
        except (OSError, StopIteration):
            pass
    return "http://deb.debian.org/debian"


@unittest.skipIf(missing(), missing() or "")
class ContainersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-containers-")
        cls.tag = f"tally-test-{os.getpid()}"
        conf = os.path.join(cls.root, "containers.conf")
        with open(conf, "w") as f:
            f.write(CONF)
        cls.env = {**os.environ, "CONTAINERS_CONF": conf}
        cls.timings = {}
        cls.ensure_base_image()
        cls.build_image()
        data = os.path.join(cls.root, "data")
        # Large enough that slow.pt takes ~0.4 s a row on one core: the job lasts while containers
        # are killed and started (podman takes a second or two for each).
        cls.manifest = tt.write_dataset(data, np.random.default_rng(146), 80, [(160, 160), (144, 176)], classes=2)
        cls.model = os.path.join(data, "slow.pt")
        shutil.copy(tt.fixture("slow.pt"), cls.model)
        cls.data = data
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(cls.model, cls.manifest, cls.reference, "--workers", "2", *FLAGS)

    @classmethod
    def podman(cls, *args, check=True, timeout=600):
        p = subprocess.run(["podman", *args], env=cls.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    @classmethod
    def ensure_base_image(cls):
        """debian:bookworm-slim from debootstrap (or the cached tarball of an earlier run)."""
        if cls.podman("image", "exists", BASE, check=False).returncode == 0:
            return
        start = time.time()
        tarball = os.path.join(CACHE, "debian-bookworm-minbase.tar")
        if not os.path.exists(tarball):
            rootfs = os.path.join(cls.root, "rootfs")
            mirror = debian_mirror()
            argv = ["debootstrap", "--variant=minbase", "bookworm", rootfs, mirror]
            if os.path.isdir("/var/cache/apt/archives"):
                argv.insert(1, "--cache-dir=/var/cache/apt/archives")
            p = subprocess.run(argv, capture_output=True, text=True)
            if p.returncode != 0:
                raise AssertionError(f"debootstrap failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            # As Debian's own images: the release, its updates and its security archive.
            security = mirror.rsplit("/debian", 1)[0] + "/debian-security" if mirror.endswith("/debian") else \
                "http://deb.debian.org/debian-security"
            if os.path.exists(os.path.join(rootfs, "etc/apt/sources.list")):
                os.remove(os.path.join(rootfs, "etc/apt/sources.list"))
            with open(os.path.join(rootfs, "etc/apt/sources.list.d/debian.sources"), "w") as f:
                f.write(f"Types: deb\nURIs: {mirror}\nSuites: bookworm bookworm-updates\nComponents: main\n"
                        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
                        f"Types: deb\nURIs: {security}\nSuites: bookworm-security\nComponents: main\n"
                        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run(["tar", "-C", rootfs, "-cf", tarball + ".part", "."], check=True)
            os.rename(tarball + ".part", tarball)
            shutil.rmtree(rootfs, True)
            cls.timings["debootstrap"] = time.time() - start
        cls.podman("import", tarball, BASE)
        cls.timings["base image"] = time.time() - start

    @classmethod
    def build_image(cls):
        """The project's Dockerfile, its runtime stage fed with this machine's build (the
        `prebuilt` stage: cmake --install --strip), as docs/deployment.md "Containers" shows."""
        start = time.time()
        ctx = os.path.join(cls.root, "context")
        os.makedirs(ctx)
        for name in ("Dockerfile", ".dockerignore"):
            shutil.copy(os.path.join(tt.SRC, name), ctx)
        build = os.path.dirname(os.path.abspath(tt.BIN))
        subprocess.run(["cmake", "--install", build, "--strip", "--prefix", os.path.join(ctx, ".prebuilt/opt/tally")],
                       check=True, capture_output=True)
        argv = ["build", "--format", "docker", "--build-arg", "TALLY_BINARIES=prebuilt", "-t", IMAGE]
        if os.path.isdir("/var/cache/apt/archives"):  # The .deb files the host already has.
            argv += ["-v", "/var/cache/apt/archives:/var/cache/apt/archives"]
        cls.podman(*argv, ctx, timeout=900)
        cls.timings["image build"] = time.time() - start
        cls.image_size = int(cls.podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip())
        print(f"\nimage {IMAGE}: {cls.image_size / 1e6:.0f} MB; " +
              ", ".join(f"{k} {v:.0f} s" for k, v in cls.timings.items()), file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        # Everything this test made, by its label, whatever happened.
        ids = cls.podman("ps", "-aq", "--filter", f"label=tally-test={cls.tag}", check=False).stdout.split()
        if ids:
            cls.podman("rm", "-f", "-t", "0", *ids, check=False)
        cls.podman("network", "rm", "-f", cls.tag, check=False)
        cls.podman("volume", "rm", "-f", cls.tag, check=False)
        shutil.rmtree(cls.root, True)

    # The containers, as deploy/kubernetes runs them: uid 10001 (the image's USER), read-only root,
    # no capabilities, no privilege escalation; the data at the same path as on the host.
    def run_container(self, name, options=(), command=(), health=False):
        flags = ["--name", name, "--label", f"tally-test={self.tag}", "--network", self.tag,
                 "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
                 "-v", f"{self.data}:{self.data}:ro", *options]
        if not health:
            flags.append("--no-healthcheck")  # Workers serve no gRPC; the image's check is tallyd's.
        return self.podman("run", "-d", *flags, IMAGE, *command).stdout.strip()

    def start_tallyd(self):
        # The image's CMD: tallyd on 0.0.0.0:50051, its state in /var/lib/tally (the volume).
        self.run_container("tallyd", ["--network-alias", "tallyd", "-v", f"{self.tag}:/var/lib/tally",
                                      "-p", f"127.0.0.1:{self.port}:50051"], health=True)

    def start_worker(self, name):
        self.run_container(name, command=["tally-worker", "--coordinator", "tallyd:50051", "--device", "cpu",
                                          "--threads", "1", "--name", name])

    def cli(self, *args, check=True):
        return tt.tally(*args, "--server", f"127.0.0.1:{self.port}", check=check)

    def wait_until(self, what, predicate, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n{getattr(self, 'last_error', '')}" + self.logs())

    def logs(self):
        out = []
        for name in ("tallyd", "w1", "w2", "w3"):
            p = self.podman("logs", "--tail", "15", name, check=False)
            out.append(f"--- {name}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return "\n".join(out)

    def progress(self, job):
        p = self.cli("status", job, check=False)
        if p.returncode != 0:
            self.last_error = p.stderr
            return None
        fields = p.stdout.split()
        done, total = fields[2].split("/")
        return fields[1], int(done), int(total)

    def health(self):
        p = self.podman("healthcheck", "run", "tallyd", check=False)
        return p.returncode == 0 and self.podman("inspect", "tallyd", "--format",
                                                 "{{.State.Health.Status}}").stdout.strip() == "healthy"

    def test_three_containers_equal_tally_run_survive_a_killed_worker_and_a_restarted_tallyd(self):
        self.dns_before = subprocess.run(["pgrep", "aardvark-dns"], capture_output=True).returncode == 0
        self.podman("network", "create", self.tag)
        self.podman("volume", "create", self.tag)
        self.port = tt.free_port()
        self.start_tallyd()
        self.wait_until("tallyd's health check", self.health, timeout=60)
        # As the manifests expect: the unprivileged user and a root file system nobody can write.
        self.assertEqual(self.podman("exec", "tallyd", "id", "-u").stdout.strip(), "10001")
        self.assertEqual(self.podman("exec", "tallyd", "id", "-g").stdout.strip(), "10001")
        denied = self.podman("exec", "tallyd", "touch", "/opt/tally/x", check=False)
        self.assertNotEqual(denied.returncode, 0)
        self.assertIn("Read-only file system", denied.stderr)
        self.assertEqual(self.cli("health").stdout.strip(), "SERVING")
        for w in ("w1", "w2"):
            self.start_worker(w)

        job = self.cli("submit", "--model", self.model, "--manifest", self.manifest, *FLAGS).stdout.strip()
        submitted = time.time()
        # Mid-job, whatever the machine's speed: once a shard is in, both workers are frozen
        # (SIGSTOP, one command), so nothing moves while the rest happens.
        state = self.wait_until("the first rows", lambda: (lambda s: s and s[1] > 0 and s)(self.progress(job)))
        self.podman("kill", "--signal", "STOP", "w1", "w2")
        state = self.progress(job)
        print(f"{state[1]}/{state[2]} rows when the workers froze, {time.time() - submitted:.1f} s after the "
              "submission", file=sys.stderr)
        self.assertLess(state[1], state[2], "the job ended before the workers froze")
        # A worker container SIGKILLed mid-job (no chance to hand back its rows), then replaced.
        self.podman("kill", "--signal", "KILL", "w1")
        self.start_worker("w3")
        # tallyd's container SIGKILLed and started again on the same state volume; the frozen worker
        # then goes on, finding a coordinator that no longer knows its leases.
        self.podman("kill", "--signal", "KILL", "tallyd")
        self.podman("rm", "tallyd")
        self.start_tallyd()
        self.podman("kill", "--signal", "CONT", "w2")
        self.wait_until("tallyd's health check after the restart", self.health, timeout=60)
        final = self.wait_until("the job's end", lambda: (lambda s: s and s[0] in ("succeeded", "failed", "cancelled")
                                                          and s)(self.progress(job)), timeout=300)
        self.assertEqual(final[0], "succeeded", self.logs())
        out = os.path.join(self.root, "out")
        self.wait_until("the report", lambda: self.cli("report", job, "--out", out, check=False).returncode == 0)
        rows = tt.read_per_image(out)
        keys = [(r["index"], r["class"]) for r in rows]
        self.assertEqual(len(keys), len(set(keys)))  # Nothing doubled...
        self.assertTrue(tt.same_files(out, self.reference), "per_image.csv differs from tally run's")
        report, reference = tt.read_report(out), tt.read_report(self.reference)
        for key in ("images_evaluated", "images_failed", "classes", "foreground_dice_mean", "foreground_hd95_mean"):
            self.assertEqual(report[key], reference[key], key)  # ...nothing lost, the same numbers.
        self.assertTrue(report["complete"])
        logs = self.podman("logs", "tallyd")
        self.assertIn(f"resuming job {job}", logs.stdout + logs.stderr)

        # Clean-up: workers stop on SIGTERM (podman stop), nothing of this test is left.
        self.podman("stop", "-t", "30", "w2", "w3", "tallyd")
        # Every one exits 0: a worker that once needed SIGKILL 30 s after SIGTERM was waiting in gRPC's
        # shutdown (common/job/rpc.h KeepGrpcUntilExit), which no binary runs any more.
        for name in ("w2", "w3", "tallyd"):
            self.assertEqual(self.podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip(), "0",
                             name + "\n" + self.logs())
        self.podman("rm", "w1", "w2", "w3", "tallyd")
        self.podman("network", "rm", self.tag)
        self.podman("volume", "rm", self.tag)
        self.assertEqual(self.podman("ps", "-aq", "--filter", f"label=tally-test={self.tag}").stdout.strip(), "")
        # No process of it either: its containers' conmon, and the network's DNS daemon when none
        # ran before the test.
        def left():
            found = subprocess.run(["pgrep", "-af", self.tag], capture_output=True, text=True).stdout.strip()
            if not self.dns_before:
                found += subprocess.run(["pgrep", "-af", "aardvark-dns"], capture_output=True, text=True).stdout.strip()
            return found
        deadline = time.time() + 20
        while left() and time.time() < deadline:
            time.sleep(0.2)
        self.assertEqual(left(), "", "processes left")


if __name__ == "__main__":
    unittest.main()
