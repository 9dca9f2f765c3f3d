"""A Python model's start on this machine: the precompiled artifact's file (--compile) and the
bytecode the stub keeps for packages installed without it (python/tally/bytecode.py).
"""
import os
import shutil
import sys
import textwrap
import unittest

import numpy as np

import tallytest as tt
from test_python_backend import PY, run, write_model


class PrecompiledArtifactTest(unittest.TestCase):
    """The precompiled artifact's file (python/tally/compile_trial.py) on this machine: Debian's
    torch 1.13 cannot precompile, so torch's saver and loader are stand-ins here (the real ones run
    in test_gpu.py); the file format, its checks and the globals handed back are Tally's own."""

    def setUp(self):
        sys.path.insert(0, os.path.join(tt.SRC, "python"))
        self.addCleanup(sys.path.remove, os.path.join(tt.SRC, "python"))
        from tally import compile_trial
        self.ct = compile_trial
        self.root = tt.tmpdir(self)

    class Saved:  # torch's compiled function: save_compiled_function(path) writes its bytes.
        def __init__(self, payload):
            self.payload = payload

        def save_compiled_function(self, path):
            with open(path, "wb") as f:
                f.write(self.payload)

    class Torch:  # torch.compiler.load_compiled_function as torch 2.11 behaves: it names the globals it lacks.
        def __init__(self, needs):
            self.needs, self.calls = needs, 0
            self.compiler = self

        def load_compiled_function(self, f, f_globals=None):
            self.calls += 1
            missing = [n for n in self.needs if n not in (f_globals or {})]
            if missing:
                raise RuntimeError("Missing required external references: %r. Please load AOT compiled function "
                                   "with `f_globals=<enclosing global scope>`" % missing)
            return f.read(), f_globals

    def test_round_trip_with_the_globals_torch_leaves_out(self):
        import builtins
        import collections
        import json.decoder
        path = os.path.join(self.root, "a.bin")
        self.ct._write_artifact(self.Saved(b"compiled code"), path)
        self.assertEqual(os.listdir(self.root), ["a.bin"])  # No temporary file left.
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"TALLYPC1")
        self.assertEqual(data[8:40], __import__("hashlib").sha256(b"compiled code").digest())
        torch = self.Torch(["___module_collections_139654816351152_c0", "__builtins_dict___3",
                            "___module_json_decoder_140000000000000_c1"])
        payload, globs = self.ct._read_artifact(torch, path, {"mine": 1})
        self.assertEqual(payload, b"compiled code")
        self.assertIs(globs["___module_collections_139654816351152_c0"], collections)
        self.assertIs(globs["___module_json_decoder_140000000000000_c1"], json.decoder)
        self.assertIs(globs["__builtins_dict___3"], vars(builtins))
        self.assertEqual(globs["mine"], 1)

    def test_a_graph_break_is_remembered_and_a_passing_failure_is_not(self):
        import types

        class Unsupported(Exception):  # torch._dynamo.exc.Unsupported: dynamo cannot take it whole.
            pass

        class Torch:  # torch.compile(fullgraph=True)'s aot_compile raising `error`; counts the attempts.
            def __init__(self, error):
                self.error, self.attempts = error, 0
                self.nn = types.SimpleNamespace(Module=object)
                self._dynamo = types.SimpleNamespace(exc=types.SimpleNamespace(Unsupported=Unsupported))

            def compile(self, module, fullgraph, dynamic):
                torch = self

                def aot_compile(example):
                    torch.attempts += 1
                    raise torch.error

                return types.SimpleNamespace(forward=types.SimpleNamespace(aot_compile=aot_compile))

        key = self.ct._artifact_key
        self.ct._artifact_key = lambda *a: "k1"
        self.addCleanup(setattr, self.ct, "_artifact_key", key)
        folder = os.path.join(self.root, "tally-precompiled")
        for error, remembered in ((RuntimeError("CUDA out of memory"), False),
                                  (Unsupported("graph break: data-dependent branch"), True)):
            torch, state = Torch(error), self.ct.CompileState(None)
            self.assertEqual(self.ct._precompiled(torch, object(), (), {}, folder, state), (None, None))
            self.assertEqual(torch.attempts, 1)
            self.assertIn("not precompiled (%s: %s)" % (type(error).__name__, error), state.notes)
            self.assertEqual(os.path.exists(os.path.join(folder, "k1.declined")), remembered)
        # The next process does not trace it whole again, and says why.
        torch, state = Torch(AssertionError("not called")), self.ct.CompileState(None)
        self.assertEqual(self.ct._precompiled(torch, object(), (), {}, folder, state), (None, None))
        self.assertEqual(torch.attempts, 0)
        self.assertEqual(len(state.notes), 1)
        self.assertIn("Unsupported: graph break: data-dependent branch; an earlier job found so", state.notes[0])
        self.assertEqual(sorted(os.listdir(folder)), ["k1.declined"])  # No temporary file left.

    def test_damaged_truncated_foreign_and_unresolvable_files_are_refused(self):
        path = os.path.join(self.root, "a.bin")
        self.ct._write_artifact(self.Saved(b"x" * 100), path)
        with open(path, "r+b") as f:
            f.seek(60)
            f.write(b"y")
        with self.assertRaisesRegex(ValueError, "differ from the digest"):
            self.ct._read_artifact(self.Torch([]), path, {})
        with open(path, "wb") as f:
            f.write(b"TALLYPC1" + b"\0" * 20)
        with self.assertRaisesRegex(ValueError, "truncated"):
            self.ct._read_artifact(self.Torch([]), path, {})
        with open(path, "wb") as f:
            f.write(b"PK\3\4" + b"\0" * 100)
        with self.assertRaisesRegex(ValueError, "not a Tally precompiled artifact"):
            self.ct._read_artifact(self.Torch([]), path, {})
        self.ct._write_artifact(self.Saved(b"z" * 100), path)
        budget = self.ct._ARTIFACT_BUDGET
        self.ct._ARTIFACT_BUDGET = 50
        self.addCleanup(setattr, self.ct, "_ARTIFACT_BUDGET", budget)
        with self.assertRaisesRegex(ValueError, "over the 50-byte budget"):
            self.ct._read_artifact(self.Torch([]), path, {})
        self.ct._ARTIFACT_BUDGET = budget
        with self.assertRaisesRegex(RuntimeError, "cannot give: ___module_no_such_module_1_c0"):
            self.ct._read_artifact(self.Torch(["___module_no_such_module_1_c0"]), path, {})

    def test_the_trial_timings_of_an_artifact_are_kept_for_the_next_job(self):
        calls = []
        path = os.path.join(self.root, "k1.timing")
        state = self.ct.CompileState(None)
        state.timing_path = path
        first = self.ct._timings(state, lambda: calls.append("eager"), lambda: calls.append("compiled"))
        self.assertEqual(calls, ["eager"] * 3 + ["compiled"] * 3)
        self.assertEqual(state.notes, [])
        with open(path) as f:
            self.assertEqual(__import__("json").load(f), first)
        later = self.ct.CompileState(None)
        later.timing_path = path
        self.assertEqual(self.ct._timings(later, lambda: calls.append("eager"), lambda: calls.append("compiled")), first)
        self.assertEqual(len(calls), 6)  # Not timed again.
        self.assertIn("timings kept by the job that first ran this artifact (%s)" % path, later.notes)
        for damaged in (b'{"eager_ms": -1, "compiled_ms": 2}', b"{", b'{"eager_ms": 1}', b"[]"):
            with open(path, "wb") as f:
                f.write(damaged)
            self.ct._timings(later, lambda: calls.append("eager"), lambda: calls.append("compiled"))
            self.assertEqual(len(calls), 12, damaged)  # Timed again, and kept again.
            del calls[6:]
        no_artifact = self.ct.CompileState(None)  # Not precompiled: timed every time, nothing written.
        self.ct._timings(no_artifact, lambda: calls.append("eager"), lambda: calls.append("compiled"))
        self.assertEqual(len(calls), 12)



class BytecodeTest(unittest.TestCase):
    """python/tally/bytecode.py in real interpreters: a stand-in `torch` package without bytecode,
    under PYTHONDONTWRITEBYTECODE (this user is root here, so an unwritable folder cannot be made)."""

    SCRIPT = textwrap.dedent("""
        import os, subprocess, sys
        from tally.bytecode import keep_bytecode
        print(repr(keep_bytecode(sys.argv[1])))
        import torch
        print(torch.VALUE, torch.__spec__.cached)
        child = "import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)"
        print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
    """)

    def setUp(self):
        self.root = tt.tmpdir(self)
        self.pkgs = os.path.join(self.root, "pkgs")
        os.makedirs(os.path.join(self.pkgs, "torch"))
        with open(os.path.join(self.pkgs, "torch", "__init__.py"), "w") as f:
            f.write("VALUE = 41 + 1\n")
        self.folder = os.path.join(self.root, "cache", "python-bytecode")

    def run_script(self, **env):
        import subprocess
        full = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "TALLY_BYTECODE"}
        full.update(PYTHONPATH=self.pkgs + ":" + os.path.join(tt.SRC, "python"), **env)
        p = subprocess.run([PY, "-c", self.SCRIPT, self.folder], capture_output=True, text=True, env=full)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.strip().split("\n")

    def test_a_package_without_bytecode_gets_it_in_the_folder_once(self):
        note, loaded, child = self.run_script(PYTHONDONTWRITEBYTECODE="1")
        self.assertEqual(note, repr("bytecode kept in %s (torch installed without it where it cannot be written)"
                                    % self.folder))
        value, cached = loaded.split(" ", 1)
        self.assertEqual(value, "42")
        self.assertTrue(cached.startswith(self.folder + os.sep) and os.path.isfile(cached), cached)
        self.assertFalse(os.path.exists(os.path.join(self.pkgs, "torch", "__pycache__")))
        self.assertEqual(child, self.folder + " False")  # Interpreters it starts keep theirs there too.
        first = os.stat(cached)
        self.assertEqual(self.run_script(PYTHONDONTWRITEBYTECODE="1")[1], loaded)
        second = os.stat(cached)  # Read by the second process, not written again.
        self.assertEqual((first.st_ino, first.st_mtime_ns), (second.st_ino, second.st_mtime_ns))

    def test_nothing_is_changed_where_bytecode_is_there_can_be_written_or_is_not_wanted(self):
        import py_compile
        own = os.path.join(self.root, "own-prefix")
        for env in ({"PYTHONDONTWRITEBYTECODE": "1", "TALLY_BYTECODE": "0"},  # Turned off.
                    {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": own},  # The user's own prefix.
                    {}):  # Python writes it beside the source itself.
            note, loaded, _ = self.run_script(**env)
            self.assertEqual(note, "''", env)
            self.assertFalse(os.path.exists(self.folder), env)
        self.assertTrue(os.path.isdir(os.path.join(self.pkgs, "torch", "__pycache__")))  # From the last run.
        shutil.rmtree(os.path.join(self.pkgs, "torch", "__pycache__"))
        py_compile.compile(os.path.join(self.pkgs, "torch", "__init__.py"))  # Installed with bytecode.
        note, loaded, _ = self.run_script(PYTHONDONTWRITEBYTECODE="1")
        self.assertEqual(note, "''")
        self.assertIn(os.path.join(self.pkgs, "torch", "__pycache__"), loaded)

    def test_the_worker_gives_the_stub_its_cache_folder(self):
        # The folder reaches the stub from the worker's --cache-dir (auto: $XDG_CACHE_HOME/tally).
        root = self.root
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(2), 2, [(4, 6)], classes=2)
        seen = os.path.join(root, "seen.txt")
        model = write_model(root, "env_model.py", """
            import os
            import numpy as np

            class Model:
                num_classes = 2
                def __init__(self, devices, options):
                    with open(options["seen"], "w") as f:
                        f.write(os.environ.get("TALLY_BYTECODE_DIR", "(unset)"))
                def predict(self, images, rows):
                    return [np.zeros(im.shape[:2], np.uint8) for im in images]
        """)
        from unittest import mock
        with mock.patch.dict(os.environ, XDG_CACHE_HOME=os.path.join(root, "xdg")):
            run(model, manifest, os.path.join(root, "out"), "--model-option", "seen=" + seen)
        with open(seen) as f:
            self.assertEqual(f.read(), os.path.join(root, "xdg", "tally", "python-bytecode"))


class SpareModelProcessTest(unittest.TestCase):
    """A long-lived worker starts the next job's model process ahead (python/tally/spare.py): real
    tallyd, worker and interpreters (a venv, whose site-packages holds an installed package the
    model imports)."""

    def setUp(self):
        import subprocess
        self.root = tt.tmpdir(self)
        self.venv = os.path.join(self.root, "venv")
        subprocess.run([PY, "-m", "venv", "--system-site-packages", "--without-pip", self.venv], check=True)
        self.python = os.path.join(self.venv, "bin", "python3")
        site = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        self.package = os.path.join(site, "tally_fixture_pkg.py")
        self.write_package(1)
        self.manifest = tt.write_dataset(os.path.join(self.root, "data"), np.random.default_rng(5), 4, [(6, 8)],
                                         classes=2)
        self.seen = os.path.join(self.root, "seen.txt")
        self.model = write_model(self.root, "pkg_model.py", """
            import os, time
            import numpy as np
            import tally_fixture_pkg as pkg

            class Model:
                num_classes = 2
                def __init__(self, devices, options):
                    with open(options["seen"], "a") as f:
                        f.write("%s %d %d %r %r\\n" % (options["job"], os.getpid(), pkg.VALUE, pkg.IMPORTED_AT, time.time()))
                def predict(self, images, rows):
                    return [np.full(im.shape[:2], pkg.VALUE, np.uint8) for im in images]
        """)
        self.cluster = tt.Cluster(self, os.path.join(self.root, "cluster"))
        self.cluster.start_worker("--cache-dir", os.path.join(self.root, "cache"), "--batch-size", "2")
        self.cluster.wait_registered(1)

    def write_package(self, value):
        with open(self.package, "w") as f:
            f.write("import time\nVALUE = %d\nIMPORTED_AT = time.time()\n" % value)

    def job(self, name):
        """Runs job `name` to its end; returns (its model process's line in seen.txt, submit time, per_image rows)."""
        t = __import__("time").time()
        job_id = self.cluster.submit(self.model, self.manifest, "--python", self.python, "--metrics", "dice",
                                     "--model-option", "seen=" + self.seen, "--model-option", "job=" + name)
        self.assertEqual(self.cluster.wait(job_id)["state"], "succeeded")
        out = os.path.join(self.root, "out-" + name)
        self.cluster.fetch(job_id, out)
        with open(self.seen) as f:
            line = [l.split() for l in f if l.startswith(name + " ")][-1]
        return {"pid": int(line[1]), "value": int(line[2]), "imported": float(line[3]), "built": float(line[4]),
                "submitted": t, "rows": tt.read_per_image(out)}

    def worker_log(self):
        return self.cluster.log("worker-0.log")

    def wait_for_spares(self, n):
        import time
        deadline = time.time() + 60
        while self.worker_log().count("preparing a model process for the next job") < n:
            self.assertLess(time.time(), deadline, self.worker_log())
            time.sleep(0.05)
        while self.worker_log().count("model process prepared for the next job:") < n:  # Its imports done.
            self.assertLess(time.time(), deadline, self.worker_log())
            time.sleep(0.05)

    def test_the_next_job_takes_a_prepared_process_and_a_changed_package_is_imported_afresh(self):
        first = self.job("a")
        self.assertEqual(first["value"], 1)
        self.assertGreater(first["imported"], first["submitted"])  # The first job's own process imported it.
        lists = os.listdir(os.path.join(self.root, "cache", "python-preload"))
        self.assertEqual(len(lists), 1, lists)
        with open(os.path.join(self.root, "cache", "python-preload", lists[0])) as f:
            kept = __import__("json").load(f)
        self.assertIn("tally_fixture_pkg", kept)
        self.assertIn("numpy", kept)
        self.assertNotIn("pkg_model", " ".join(kept))  # The model's own file is never imported ahead.
        # Job b's process was prepared while job a's model loaded (before a's first batch kept the
        # list); job c's while b's did, from the list.
        self.wait_for_spares(1)
        second = self.job("b")
        self.assertIn("the model process prepared while the last job ran (pid %d) takes this job" % second["pid"],
                      self.worker_log())
        self.assertNotEqual(second["pid"], first["pid"])
        self.wait_for_spares(2)
        third = self.job("c")
        self.assertIn("(pid %d) takes this job" % third["pid"], self.worker_log())
        self.assertLess(third["imported"], third["submitted"])  # Imported before its job existed.
        for job in (second, third):
            self.assertEqual(job["value"], 1)
            self.assertEqual(job["rows"], first["rows"])  # The same numbers as a process started for its job.
        # A package changed after the spare imported it: the spare replaces itself with a fresh interpreter.
        self.wait_for_spares(3)
        self.write_package(0)
        fourth = self.job("d")
        self.assertIn("the prepared model process is stale (%s changed since it was imported)" % self.package,
                      self.worker_log())
        self.assertEqual(fourth["value"], 0)
        self.assertGreater(fourth["imported"], fourth["submitted"])
        self.assertNotEqual({r["dice"] for r in fourth["rows"]}, {r["dice"] for r in first["rows"]})

    def test_a_prepared_process_that_died_is_replaced(self):
        import re
        import signal
        self.job("a")
        self.wait_for_spares(1)
        pid = int(re.findall(r"preparing a model process for the next job \(pid (\d+)\)", self.worker_log())[-1])
        os.kill(pid, signal.SIGKILL)
        second = self.job("b")
        self.assertIn("the spare model process (pid %d) had exited; starting a new one" % pid, self.worker_log())
        self.assertNotEqual(second["pid"], pid)
        self.assertEqual(second["value"], 1)

    def test_a_job_that_arrives_while_its_process_imports_is_served_at_once(self):
        # spare.prepare in a real interpreter: the kept list names two modules; the first one's import
        # sends a byte down the socket, as a job arriving then would: the second is left to the job.
        import subprocess
        pkgs = os.path.join(self.root, "pkgs")
        os.makedirs(pkgs)
        with open(os.path.join(pkgs, "arrives.py"), "w") as f:
            f.write("import os\nos.write(int(os.environ['JOB_FD']), b'x')\n")
        with open(os.path.join(pkgs, "later.py"), "w") as f:
            f.write("")
        script = textwrap.dedent("""
            import json, os, socket, sys
            from tally import spare
            folder = sys.argv[1]
            os.makedirs(folder)
            with open(spare._list_path(folder), "w") as f:
                json.dump(["arrives", "later"], f)
            worker, stub = socket.socketpair()
            os.environ["JOB_FD"] = str(worker.fileno())
            count, _, interrupted, files = spare.prepare(folder, stub.fileno())
            print(count, interrupted, "arrives" in sys.modules, "later" in sys.modules, os.path.join(sys.argv[2], "arrives.py") in files)
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = os.path.join(tt.SRC, "python") + ":" + pkgs
        p = subprocess.run([PY, "-c", script, os.path.join(self.root, "lists"), pkgs], capture_output=True, text=True,
                           env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["1", "True", "True", "False", "True"])

    def test_tally_run_starts_none(self):
        tt.tally_run(self.model, self.manifest, os.path.join(self.root, "out"), "--python", self.python, "--batch-size", "2",
            "--model-option", "seen=" + self.seen, "--model-option", "job=r")
        with open(os.path.join(self.root, "out", ".tally", "worker-0.log")) as f:
            log = f.read()
        self.assertIn("[model]", log)
        self.assertNotIn("preparing a model process", log)


if __name__ == "__main__":
    unittest.main()
