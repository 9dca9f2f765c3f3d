"""The spare model process: a stub started before its job, with the installed modules its job will
need already imported.

A long-lived worker (tally-worker --spare-interpreter, on by default; `tally run` turns it on for
--follow only) starts the next job's model process once the current job's model is loaded: a stub
with TALLY_STUB_SPARE=1 and the environment the next stub of this interpreter would get. Before its
job is known it imports what the last model process of this interpreter on the host imported from
the standard library and installed packages (the list each stub adds to after its first batch, under
TALLY_PRELOAD_DIR, one file per interpreter): torch, torchvision, inductor's runtime for a precompiled model,
transformers... A job whose model process was prepared so skips those imports (seconds each).

Nothing of a job runs before the job: the model's file, its folder and the folders on PYTHONPATH
are never imported ahead; nothing touches a GPU. When the job's first message arrives, and before
it is read, every module file imported so far is checked against the size and modification time
it had when imported; if one changed (a package upgraded meanwhile), the process replaces itself
(exec) with a fresh interpreter, which reads the same messages: a prepared process never runs code
older than the files on disk.
"""

import hashlib
import importlib
import json
import os
import select
import site
import sys
import sysconfig
import time

from tally.compile_trial import replace_file

_MAX_LIST_BYTES = 8 << 20  # The kept list is read whole: a bound on a file anyone could have grown.
_MAX_MODULES = 50000


def _list_path(folder):
    """The list of this interpreter (its path, version and prefix) in `folder`."""
    key = "\0".join((os.path.abspath(sys.executable), sys.version, sys.prefix))
    return os.path.join(folder, "%s.json" % hashlib.sha256(key.encode()).hexdigest()[:20])


def _installed_roots():
    """The folders of the standard library and of installed packages, each ending with a separator."""
    paths = sysconfig.get_paths()
    roots = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # An interpreter started without site's functions.
        pass
    out = set()
    for r in roots:
        if r:
            for p in (os.path.abspath(r), os.path.realpath(r)):
                out.add(p.rstrip(os.sep) + os.sep)
    return tuple(sorted(out))


def installed_modules():
    """The names of the imported modules whose files lie in the standard library or an installed
    package, in import order (a package before the modules it imports)."""
    roots = _installed_roots()
    names = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(path, str):
            continue
        if os.path.abspath(path).startswith(roots):
            names.append(name)
    return names[:_MAX_MODULES]


def record(folder):
    """Adds this process's installed modules to the list the next spare process of this interpreter
    imports (the kept list first, in its order: jobs with and without --compile, or of two models,
    leave what both need; written whole, by rename). Returns the list's path, or "" where nothing
    was written."""
    if not folder:
        return ""
    kept = _kept_list(folder)
    known = set(kept)
    names = (kept + [n for n in installed_modules() if n not in known])[:_MAX_MODULES]
    path = _list_path(folder)
    if names == kept and os.path.exists(path):
        return path
    try:
        os.makedirs(folder, exist_ok=True)
        replace_file(path, json.dumps(names).encode())
    except OSError:
        return ""
    return path


def _kept_list(folder):
    if not folder:
        return []
    try:
        with open(_list_path(folder), "rb") as f:
            data = f.read(_MAX_LIST_BYTES + 1)
        if len(data) > _MAX_LIST_BYTES:
            return []
        names = json.loads(data)
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names[:_MAX_MODULES] if isinstance(n, str) and n and n != "__main__"]


def _files():
    """Every imported module's file with its size and modification time (ns)."""
    out = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in out:
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def _readable(fd):
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (InterruptedError, ValueError, OSError):
        return False


def prepare(folder, fd=-1):
    """Imports the kept list's modules (a module that fails is skipped: its job meets the same error
    where it imports it), stopping early once its job's first message can be read from `fd`: the
    job then imports the rest as it needs them. Returns (modules imported, seconds, whether the job
    came first, the imported files' snapshot)."""
    t0 = time.perf_counter()
    before = len(sys.modules)
    interrupted = False
    for name in _kept_list(folder):
        if name in sys.modules:
            continue
        if fd >= 0 and _readable(fd):
            interrupted = True
            break
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: B036 - SystemExit and KeyboardInterrupt from a module's body too.
            pass
    return len(sys.modules) - before, time.perf_counter() - t0, interrupted, _files()


def changed_file(snapshot):
    """The first file of the snapshot whose size or modification time changed (or that is gone), else None."""
    for path, (size, mtime) in snapshot.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if st.st_size != size or st.st_mtime_ns != mtime:
            return path
    return None


def wait_for_job(fd, snapshot):
    """Blocks until the job's first message can be read from `fd`; then, if a prepared module's
    file changed meanwhile, execs a fresh stub (same descriptor, environment and arguments, the
    messages still unread) and does not return."""
    while True:
        try:
            readable, _, _ = select.select([fd], [], [])
        except InterruptedError:
            continue
        if readable:
            break
    path = changed_file(snapshot)
    if path is None:
        return
    print("the prepared model process is stale (%s changed since it was imported): starting a fresh one" % path,
          flush=True)
    sys.stderr.flush()
    argv = [sys.executable] + list(getattr(sys, "orig_argv", [sys.executable, "-u", "-m", "tally.stub"])[1:])
    os.execv(sys.executable, argv)
