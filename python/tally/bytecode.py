"""Compiled bytecode for packages installed without it, kept in Tally's cache folder.

Python compiles a module's source each time it is imported unless a .pyc of it is kept: beside the
source (__pycache__/), written at the first import where that folder can be written. A package
installed without bytecode (uv and `pip --no-compile` leave it out) in a folder this user cannot
write (a shared environment, a read-only container image), or an interpreter told not to write it
(PYTHONDONTWRITEBYTECODE), compiles again in every process: on a GPU host with torch 2.11 so
installed, loading a precompiled model compiled the source of 551 of inductor's modules (2.2 s of
builtins.compile under the profiler), and `import torch` took 6-10 s.

keep_bytecode(folder) points the stub's interpreter (and the interpreters it starts: inductor's
compile workers) at `folder` for bytecode (sys.pycache_prefix) where torch lacks bytecode that this
process could write beside it. Python then reads and writes every module's .pyc there
(written whole, by rename; checked against the source's size and time as usual), so the second
process on the host imports from it. Imports only os, sys and importlib: called before torch.
"""

import importlib.util
import os
import sys

PACKAGES = ("torch",)  # Where a missing .pyc costs most (numpy is imported before: tally/__init__).


def _lacks_bytecode(name):
    """Whether package `name` has no .pyc beside its __init__ and none will be written there."""
    try:
        spec = importlib.util.find_spec(name)  # A top-level name: found, not imported.
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return False
    cached = importlib.util.cache_from_source(origin)
    if os.path.exists(cached):
        return False
    if sys.dont_write_bytecode:
        return True
    folder = os.path.dirname(cached)
    return not os.access(folder if os.path.isdir(folder) else os.path.dirname(folder), os.W_OK)


def keep_bytecode(folder, packages=PACKAGES):
    """Keeps bytecode under `folder` where a package of `packages` lacks its own (see the module's
    comment). Returns what it did, for the stub's log, or "" where nothing was needed or asked
    (no folder, TALLY_BYTECODE=0, or a PYTHONPYCACHEPREFIX of the user's)."""
    if not folder or sys.pycache_prefix or os.environ.get("TALLY_BYTECODE") == "0":
        return ""
    lacking = [name for name in packages if _lacks_bytecode(name)]
    if not lacking:
        return ""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return "bytecode not kept (%s: %s): %s compiled again in each process" % (folder, e.strerror, ", ".join(lacking))
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = folder  # The interpreters this one starts.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return "bytecode kept in %s (%s installed without it where it cannot be written)" % (folder, ", ".join(lacking))
