#!/usr/bin/python3
"""Compiles every Tally translation unit but the CUDA kernels with clang's thread-safety analysis and
every warning as an error (-Wthread-safety -Werror), so that ABSL_GUARDED_BY /
ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations are checked, not just comments.
Syntax only: no objects are written.

  tests/thread_safety/check.py BUILD_DIR     # BUILD_DIR configured with CMAKE_EXPORT_COMPILE_COMMANDS=ON

Skips (exit 0, with a message) when clang++ is not installed. Ends with 'N passed, N failed'.
"""
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys

SKIP = (".cu", "/tests/", "/bench/")


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    clang = shutil.which("clang++")
    if clang is None:
        print("clang++ not found: thread-safety analysis skipped (apt-get install clang)")
        return 0
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    jobs = []
    for c in commands:
        source = c["file"]
        if any(s in source for s in SKIP) or source.startswith(build):
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

    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for source, rc, err in pool.map(run, jobs):
            if rc == 0:
                passed += 1
            else:
                failed += 1
                print(f"{source}:\n{err}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
