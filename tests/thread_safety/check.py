#!/usr/bin/python3
"""Compiles Tally's translation units (but the CUDA kernels) with clang's thread-safety analysis and
every warning as an error (-Wthread-safety -Werror), so that ABSL_GUARDED_BY /
ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations are checked, not just comments.
Syntax only: no objects are written.

Only the units the analysis can say something about are compiled: those where the file or a Tally
header it includes (followed through Tally's own includes) names absl's Mutex or CondVar or a
thread-safety annotation. The analysis checks the code that touches annotated locks; a unit whose
Tally code names none has nothing for it (about 60 % of the units, and half of this check's time on
2 cores). --all compiles every unit.

  tests/thread_safety/check.py BUILD_DIR [--all]   # BUILD_DIR configured with CMAKE_EXPORT_COMPILE_COMMANDS=ON

Skips (exit 0, with a message) when clang++ is not installed. Ends with 'N passed, N failed, N without
locks not compiled'.
"""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SKIP = (".cu", "/tests/", "/bench/")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LOCKS = re.compile(r"Mutex|CondVar|ABSL_[A-Z_]*(GUARDED_BY|LOCKS_|LOCKABLE|ACQUIRE|RELEASE|ASSERT_|CAPABILITY)")


class LockUse:
    """Whether a file, or a Tally header it includes (transitively), names a lock or an annotation.
    Each file is read once; each unit walks its own include closure (an include cycle cannot cut
    a header off from what lies beyond it)."""

    def __init__(self, roots):
        self.roots = roots
        self.files = {}  # Real path -> (it names a lock, the Tally files it includes).

    def _read(self, path):
        if path not in self.files:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                self.files[path] = (True, [])  # Unreadable: compiled, to be safe.
                return self.files[path]
            included = []
            for name in INCLUDE.findall(text):
                for root in (os.path.dirname(path),) + self.roots:
                    candidate = os.path.join(root, name)
                    if os.path.isfile(candidate):
                        included.append(os.path.realpath(candidate))
                        break
            self.files[path] = (bool(LOCKS.search(text)), included)
        return self.files[path]

    def __call__(self, path):
        pending, seen = [os.path.realpath(path)], set()
        while pending:
            path = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            locks, included = self._read(path)
            if locks:
                return True
            pending.extend(included)
        return False


def self_check(job):
    """The selection and the analysis on files of their own, with the flags of a real unit: a read
    of a guarded member through a header that declares it must be chosen and must fail; a unit that
    reaches the lock through a cycle of headers must be chosen; a file without locks must be left
    out. Returns what went wrong, or ""."""
    source, argv, cwd = job
    with tempfile.TemporaryDirectory() as tmp:
        files = {"locked.h": '#include "absl/synchronization/mutex.h"\n'
                             "struct Counter { absl::Mutex mu; int n ABSL_GUARDED_BY(mu) = 0; };\n",
                 "reads.cc": '#include "locked.h"\nint Read(Counter& c) { return c.n; }\n',
                 "plain.cc": "int Twice(int x) { return 2 * x; }\n",
                 # Headers including each other: ring.cc reaches the lock through ring_b.h's cycle.
                 "ring_a.h": '#include "ring_b.h"\n#include "locked.h"\n', "ring_b.h": '#include "ring_a.h"\n',
                 "ring.cc": '#include "ring_b.h"\n'}
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        uses_locks = LockUse((tmp,))
        chosen = [uses_locks(os.path.join(tmp, name)) for name in ("reads.cc", "ring_a.h", "ring.cc", "plain.cc")]
        if chosen != [True, True, True, False]:
            return "the selection of units with locks is wrong on its own example"
        reads = [os.path.join(tmp, "reads.cc") if a == source else a for a in argv] + ["-I" + tmp]
        p = subprocess.run(reads, cwd=cwd, capture_output=True, text=True)
        if p.returncode == 0 or "thread-safety" not in p.stderr:
            return "an unguarded read of a guarded member was not caught:\n" + p.stderr[-2000:]
    return ""


def main():
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    build = os.path.abspath(dirs[0] if dirs else "build")
    clang = shutil.which("clang++")
    if clang is None:
        print("clang++ not found: thread-safety analysis skipped (apt-get install clang)")
        return 0
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    uses_locks = LockUse((SOURCE, build))
    jobs, lockless = [], 0
    for c in commands:
        source = c["file"]
        if any(s in source for s in SKIP) or source.startswith(build):
            continue
        if "--all" not in sys.argv and not uses_locks(source):
            lockless += 1
            continue
        args = shlex.split(c["command"])[1:]
        if "-o" in args:
            i = args.index("-o")
            del args[i:i + 2]
        args = [a for a in args if a != "-c"]
        jobs.append((source, [clang] + args + ["-fsyntax-only", "-Wthread-safety", "-Werror",
                                               "-Wno-unknown-warning-option"], c["directory"]))

    def run(job):
        source, argv, cwd = job
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        return source, p.returncode, p.stderr

    broken = self_check(jobs[0]) if jobs else "no unit to check"
    if broken:
        print("self-check: " + broken)
        return 1
    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for source, rc, err in pool.map(run, jobs):
            if rc == 0:
                passed += 1
            else:
                failed += 1
                print(f"{source}:\n{err}")
    print(f"{passed} passed, {failed} failed, {lockless} without locks not compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
