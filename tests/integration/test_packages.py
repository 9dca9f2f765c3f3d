"""Installing Tally the usual way: `cpack -G DEB` gives a .deb that unpacks into a scratch root and
runs (`tally --version`), with the systemd units, docs and the Python package in it; `pip install
./python` into a fresh virtual environment (offline) gives a `tally` package whose client passes the
Python client test from there (no sys.path editing, gRPC modules generated at build time)."""
import glob
import os
import shutil
import subprocess
import sys
import unittest

import tallytest as tt

BUILD = os.path.dirname(os.path.abspath(tt.BIN))
SOURCE = os.environ.get("TALLY_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))


class PackagesTest(unittest.TestCase):
    def test_the_deb_unpacks_and_runs(self):
        root = tt.tmpdir(self)
        out = os.path.join(root, "pkg")
        p = subprocess.run(["cpack", "-G", "DEB", "-B", out], cwd=BUILD, capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        debs = glob.glob(os.path.join(out, "tally_*.deb"))
        self.assertEqual(len(debs), 1, os.listdir(out))
        depends = subprocess.run(["dpkg-deb", "-f", debs[0], "Depends"], capture_output=True, text=True).stdout
        for lib in ("libtorch", "libgrpc++", "python3-grpcio"):
            self.assertIn(lib, depends)
        scratch = os.path.join(root, "scratch")
        subprocess.run(["dpkg-deb", "-x", debs[0], scratch], check=True)
        files = [os.path.relpath(os.path.join(d, f), scratch) for d, _, fs in os.walk(scratch) for f in fs]
        tally = [f for f in files if f.endswith("bin/tally")]
        self.assertEqual(len(tally), 1, files)
        v = subprocess.run([os.path.join(scratch, tally[0]), "--version"], capture_output=True, text=True)
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertTrue(v.stdout.startswith("tally "), v.stdout)
        for want in ("bin/tallyd", "bin/tally-worker", "bin/tally-coco-eval", "lib/systemd/system/tallyd.service",
                     "lib/systemd/system/tally-worker@.service", "share/doc/tally/README.md",
                     "lib/python3/dist-packages/tally/client.py", "lib/python3/dist-packages/tally_pb2.py",
                     "lib/python3/dist-packages/tally_pb2_grpc.py"):
            self.assertTrue(any(f.endswith(want) for f in files), want)

    def test_pip_install_into_a_fresh_venv_and_the_client_test_passes(self):
        root = tt.tmpdir(self)
        # A copy of python/ and proto/ alone: the build generates the gRPC modules with protoc.
        src = os.path.join(root, "src")
        shutil.copytree(os.path.join(SOURCE, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        shutil.copytree(os.path.join(SOURCE, "proto"), os.path.join(src, "proto"))
        venv = os.path.join(root, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TALLY_PROTO_DIR")}
        p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
                            os.path.join(src, "python")], capture_output=True, text=True, env=env, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        where = subprocess.run([py, "-c", "import tally.client, tally_pb2; print(tally.client.__file__); "
                                "print(tally_pb2.__file__)"], capture_output=True, text=True, env=env,
                               cwd=root).stdout.split()
        self.assertEqual(len(where), 2)
        for path in where:
            self.assertTrue(path.startswith(venv), where)
        # The Python client test, run by the venv's Python without the checkout on its path.
        t = subprocess.run([py, "-m", "unittest", "test_python_client"], capture_output=True, text=True, env=env,
                           cwd=os.path.dirname(os.path.abspath(__file__)), timeout=900)
        self.assertEqual(t.returncode, 0, t.stdout[-3000:] + t.stderr[-3000:])
        self.assertIn("OK", t.stderr)


if __name__ == "__main__":
    unittest.main()
