"""--compile for Python models (used by tally.stub): each torch.nn.Module attribute of the model is
paired with its torch.compile'd twin, and the job runs one of them everywhere.

The first call of the first module is the trial: the same inputs through the compiled module (its
compile, timed) and the eager one, then three timed passes of each, and the outputs compared (the
largest |compiled - eager| over floating outputs, and for N x C x H x W scores the pixels whose
argmax over C changed). The trial goes to the worker (`compile_trial`), which asks the coordinator
for the job's choice: the first worker's trial decides for every worker, so every row of a job
comes from the same kernels. The stub waits for that `compile_decision` inside the call and
returns the chosen output. Compiled is kept when it is at least 3 % faster on the trial;
otherwise the job runs eager and the report says compiling was declined, with both timings.

Compiles of a shape this worker has not run yet hold a file lock in inductor's cache folder, so
the workers of a host compile one at a time and the later ones take the first one's kernels (and
its autotuning choices) from the cache instead of tuning their own.

Where torch has precompiling (torch.compiler.load_compiled_function, torch 2.10 and newer) and a
cache folder is set (TALLY_PRECOMPILE=0 turns it off), each module is compiled ahead of its call (`aot_compile`, whole graph: dynamo,
AOTAutograd and inductor) and the result saved in the cache folder's `tally-precompiled/`, keyed by
what the compiled code depends on (see _artifact_key); a later process on this machine loads it
instead of tracing the module again (dynamo's tracing is most of a warm compile).
Every worker of the host then runs the one saved artifact. A module dynamo cannot take whole
(graph breaks) is compiled the usual way, and the trial's note says why; a `<key>.declined` file
beside the artifacts keeps that reason, so later processes compile it the usual way at once
instead of tracing it whole again.
"""

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import sys
import time

_ARTIFACT_MAGIC = b"TALLYPC1"  # Then the payload's SHA-256 (32 bytes), then the payload.
_ARTIFACT_BUDGET = 8 << 30  # A saved artifact larger than this is not read (compiled again instead).

_GAIN = 0.97  # Compiled is kept when its pass takes under 97 % of eager's.


class CompileState:
    """What every compiled attribute of one model shares: the job's choice and the trial."""

    def __init__(self, on_trial):
        self.mode = "trial"  # "trial" | "compiled" | "eager"
        self.on_trial = on_trial  # on_trial(trial dict) -> True to run compiled (blocks for the job's choice)
        self.trial = None
        self.precompiled = []  # "loaded" / "saved" / "kept in memory" for each precompiled call shape
        self.notes = []  # Why a module was not precompiled or its artifact not saved, once each.
        self.timing_path = None  # Beside the trial module's saved or loaded artifact: its timed passes.

    def note(self, text):
        if text not in self.notes:
            self.notes.append(text)


class Switch:
    """A module attribute under --compile: calls go to the compiled or the eager module as the job
    chose; attributes are the eager module's."""

    def __init__(self, eager, compile_module, state, precompile=None):
        # compile_module() -> the usual torch.compile wrapper, made only when a shape needs it: a job
        # that loads every shape's artifact never imports what the wrapper does. precompile(args,
        # kwargs) -> (a callable for that shape, its output), or (None, None): the usual torch.compile.
        self.__dict__.update(_eager=eager, _compile_module=compile_module, _compiled=None, _state=state,
                             _precompile=precompile, _fns={})

    def __getattr__(self, name):
        return getattr(self.__dict__["_eager"], name)

    def __call__(self, *args, **kwargs):
        state = self._state
        if state.mode == "trial":
            return self._trial(args, kwargs)
        if state.mode == "eager":
            return self._eager(*args, **kwargs)
        return self._call_compiled(args, kwargs)[0]

    def _call_compiled(self, args, kwargs):
        """The compiled call; a shape not run here before (a compile, a saved artifact or the cache)
        under the host's lock."""
        shapes = _signature(args, kwargs)
        fn = self._fns.get(shapes)
        if fn is not None:
            return fn(*args, **kwargs), 0.0
        t0 = time.perf_counter()
        with _host_lock():
            waited = time.perf_counter() - t0
            fn, out = None, None
            if self._precompile is not None:
                fn, out = self._precompile(args, kwargs)
            if fn is None:
                if self._compiled is None:
                    self.__dict__["_compiled"] = self._compile_module()
                fn = self._compiled
                out = fn(*args, **kwargs)
            _synchronize()
        self._fns[shapes] = fn
        return out, waited

    def _trial(self, args, kwargs):
        torch = sys.modules["torch"]
        counters = _cache_counters()
        _synchronize()
        phase("trial starts")
        t0 = time.perf_counter()
        note = ""
        try:
            compiled_out, waited = self._call_compiled(args, kwargs)
            if waited > 0.1:
                note = "waited %.1f s for another worker's compile on this host" % waited
        except Exception as e:  # Compiling failed: propose eager, saying why.
            compiled_out, note = None, "compiling failed: %s: %s" % (type(e).__name__, str(e)[:300])
        compile_seconds = time.perf_counter() - t0
        phase("compiled call")
        hits, misses = (a - b for a, b in zip(_cache_counters(), counters))
        eager_out = self._eager(*args, **kwargs)
        _synchronize()
        phase("eager call")
        trial = {"batch": _batch_size(args), "compile_seconds": compile_seconds, "cache_hits": hits,
                 "cache_misses": misses, "note": note, "faster": False}
        if compiled_out is not None:
            compiled_fn = self._fns[_signature(args, kwargs)]
            trial.update(_timings(self._state, lambda: self._eager(*args, **kwargs),
                                  lambda: compiled_fn(*args, **kwargs)))
            trial["faster"] = trial["compiled_ms"] < _GAIN * trial["eager_ms"]
            phase("timed passes")
            with torch.no_grad():
                trial.update(_compare(torch, eager_out, compiled_out))
            phase("compared")
        state = self._state
        trial["precompiled"] = ", ".join(state.precompiled)
        if state.notes:
            trial["note"] = "; ".join(([note] if note else []) + state.notes)
        state.trial = trial
        state.mode = "compiled" if state.on_trial(trial) else "eager"
        phase("the job's choice")
        if state.mode == "compiled" and compiled_out is None:
            raise RuntimeError("the job runs the model compiled (another worker's trial), but compiling failed here: "
                               + note)
        return compiled_out if state.mode == "compiled" else eager_out


def make_switches(model, class_name, on_trial):
    """Wraps the model's torch.nn.Module attributes (or lets its tally_compile(compile) hook choose
    what to wrap). Returns (error or None, names wrapped, the shared CompileState)."""
    try:
        import torch
    except ImportError:
        return "--compile needs torch (torch.compile), which the model's interpreter does not have", [], None
    if not hasattr(torch, "compile"):
        return ("--compile needs torch.compile (PyTorch 2.0 or newer), but the model's interpreter (%s) has torch %s: "
                "run without --compile, or give --python an interpreter with torch 2" % (sys.executable, torch.__version__)), [], None
    _raise_recompile_limit(torch)
    state = CompileState(on_trial)
    folder = _artifact_folder(torch)

    def compile_fn(module):
        precompile = None
        if folder:
            def precompile(args, kwargs):
                return _precompiled(torch, module, args, kwargs, folder, state)
        return Switch(module, lambda: torch.compile(module, dynamic=False), state, precompile)

    hook = getattr(model, "tally_compile", None)
    if callable(hook):
        hook(compile_fn)
        return None, ["tally_compile"], state
    names = sorted(n for n, v in vars(model).items() if isinstance(v, torch.nn.Module))
    if not names:
        return ("--compile found no torch.nn.Module attribute of %s to compile: keep the network in one "
                "(self.net = ...), or define tally_compile(self, compile) to apply compile yourself" % class_name), [], None
    for n in names:
        setattr(model, n, compile_fn(getattr(model, n)))
    return None, names, state


def _raise_recompile_limit(torch):
    # One compile per input shape (dynamic=False): past dynamo's limit (8) new shapes would run eager,
    # and which ones would depend on the order a worker met them.
    try:
        import torch._dynamo
    except ImportError:  # A torch.compile of the model's own (a stand-in): no dynamo to tell.
        return
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 256))


_seen_modules = set()  # TALLY_STUB_PROFILE=2: the modules imported before the last step.


def phase(what):
    """TALLY_STUB_PROFILE=1: when the stub reached each step of its start and of a compiled
    module's first call, on stderr (the worker's log); 2 adds the packages imported since the last
    step (the new modules whose parent is not new)."""
    level = os.environ.get("TALLY_STUB_PROFILE")
    if level not in ("1", "2"):
        return
    line = "tally.stub %.3f %s" % (time.time(), what)
    if level == "2":
        names = set(sys.modules)
        new = names - _seen_modules
        roots = sorted(n for n in new if n.rpartition(".")[0] not in new)
        if _seen_modules and roots:
            line += " (%d modules imported: %s)" % (len(new), " ".join(roots[:40]) + (" ..." if len(roots) > 40 else ""))
        _seen_modules.update(names)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _artifact_folder(torch):
    """Where precompiled artifacts live ("" where this torch cannot precompile or no cache is set)."""
    if os.environ.get("TALLY_PRECOMPILE") == "0":  # Off where asked (docs/models.md).
        return ""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not folder or not hasattr(getattr(torch, "compiler", None), "load_compiled_function"):
        return ""
    try:
        import torch._dynamo
        if hasattr(torch._dynamo.config, "enable_aot_compile"):
            torch._dynamo.config.enable_aot_compile = True
    except Exception:
        return ""
    return os.path.join(folder, "tally-precompiled")


def _precompiled(torch, module, args, kwargs, folder, state):
    """The module compiled for this call's shapes, and its output for the call: loaded from the
    artifact an earlier process saved, else compiled ahead of the call and saved. (None, None) where
    it cannot be compiled whole (the caller then uses the usual torch.compile), with the reason in
    the state's notes. An artifact that fails to load or to run is deleted, and compiled again."""
    is_module = isinstance(module, torch.nn.Module)
    try:
        key = _artifact_key(torch, module, args, kwargs)
    except Exception as e:
        state.note("not precompiled (its key: %s)" % _reason(e))
        return None, None

    def bind(compiled):
        return (lambda *a, **k: compiled(module, *a, **k)) if is_module else compiled

    path = os.path.join(folder, key + ".bin")
    declined = os.path.join(folder, key + ".declined")
    timing = os.path.join(folder, key + ".timing")  # The trial's timed passes of this artifact (_timings).
    phase("key")
    if os.path.exists(declined):  # An earlier process found it cannot be precompiled: said once, not traced again.
        try:
            with open(declined, "rb") as f:
                why = f.read(400).decode("utf-8", "replace").strip()
        except OSError as e:
            why = _reason(e)
        state.note("not precompiled (%s; an earlier job found so: %s)" % (why, declined))
        return None, None
    if os.path.exists(path):
        try:
            fn = bind(_read_artifact(torch, path, _globals_of(module)))
            phase("artifact loaded")
            out = fn(*args, **kwargs)
            _synchronize()
            phase("first call of the loaded artifact")
            state.precompiled.append("loaded")
            state.timing_path = state.timing_path or timing
            return fn, out
        except Exception as e:
            state.note("the saved artifact %s was not used (%s); compiled again" % (path, _reason(e)))
            with contextlib.suppress(OSError):
                os.unlink(path)
    try:
        target = torch.compile(module, fullgraph=True, dynamic=False)
        compiled = (target.forward if is_module else target).aot_compile((tuple(args), dict(kwargs)))
    except Exception as e:
        state.note("not precompiled (%s)" % _reason(e))
        if not _graph_break(torch, e):
            return None, None  # Perhaps passing (memory, a disk): tried again by the next process.
        with contextlib.suppress(OSError):  # Remembered for the next process: a graph break stays one.
            os.makedirs(folder, exist_ok=True)
            replace_file(declined, _reason(e).encode())
        return None, None
    phase("precompiled")
    try:
        _write_artifact(compiled, path)
        phase("artifact saved")
        state.precompiled.append("saved")
        state.timing_path = state.timing_path or timing
    except Exception as e:
        state.precompiled.append("kept in memory")
        state.note("the precompiled artifact was not saved (%s)" % _reason(e))
    fn = bind(compiled)
    return fn, fn(*args, **kwargs)


def _graph_break(torch, e):
    """Whether dynamo refused to take the module whole (fullgraph): the same in every process."""
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    unsupported = getattr(exc, "Unsupported", None)
    return isinstance(unsupported, type) and isinstance(e, unsupported)


def _globals_of(fn):
    """The global scope of the code that a compiled module or function runs first."""
    code = getattr(type(fn), "forward", None) if not hasattr(fn, "__globals__") else fn
    return dict(getattr(code, "__globals__", {}) or {})


def _reason(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0][:200] if text else "")


def _artifact_key(torch, fn, args, kwargs):
    """What a compiled module's code depends on: torch and Python, the GPUs' names and capabilities,
    the code of the module's classes (or the function's), its structure and its parameters' and
    buffers' names, shapes and dtypes (not their values: the artifact reads them at each call),
    the call's shapes and dtypes, and the grad and autocast modes. The artifact's own guards are
    checked again at its first call."""
    h = hashlib.sha256()

    def add(*parts):
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")

    add("tally-precompiled-1", torch.__version__, tuple(sys.version_info[:3]))
    leaves = list(args) + [kwargs[k] for k in sorted(kwargs)]
    devices = sorted({str(x.device) for x in leaves if isinstance(x, torch.Tensor) and x.is_cuda})
    for d in devices:
        add(d, torch.cuda.get_device_name(d), torch.cuda.get_device_capability(d))
    add(_signature(args, kwargs), torch.is_grad_enabled(), torch.is_inference_mode_enabled())
    for device_type in ("cuda", "cpu"):
        try:
            add(device_type, torch.is_autocast_enabled(device_type), str(torch.get_autocast_dtype(device_type)))
        except Exception:
            pass
    if isinstance(fn, torch.nn.Module):
        add(repr(fn))
        classes = []
        for m in fn.modules():
            if type(m) not in classes:
                classes.append(type(m))
        for c in classes:
            add(c.__module__, c.__qualname__, _source(c))
        for name, t in list(fn.named_parameters()) + list(fn.named_buffers()):
            add(name, tuple(t.shape), str(t.dtype), str(t.device), bool(t.requires_grad))
    else:
        add(getattr(fn, "__module__", ""), getattr(fn, "__qualname__", type(fn).__qualname__), _source(fn))
    return h.hexdigest()[:40]


def _source(obj):
    import inspect  # Here, not at the top: the stub imports this module for phase() in every job.

    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _write_artifact(compiled, path):
    """Saves atomically (a whole file or none), with the payload's digest before it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    raw = "%s.%d.raw" % (path, os.getpid())
    try:
        compiled.save_compiled_function(raw)
        with open(raw, "rb") as f:
            payload = f.read()
        replace_file(path, _ARTIFACT_MAGIC + hashlib.sha256(payload).digest(), payload)
    finally:
        if os.path.exists(raw):
            os.unlink(raw)


def replace_file(path, *parts):
    """Writes `parts` to `path` whole or not at all: a temporary file, synced, then renamed."""
    tmp = "%s.%d.partial" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_artifact(torch, path, f_globals):
    """Loads what _write_artifact saved, after checking its size against the budget and its bytes
    against the digest written with them (a truncated or altered file is refused)."""
    size = os.path.getsize(path)
    head = len(_ARTIFACT_MAGIC) + 32
    if size > _ARTIFACT_BUDGET:
        raise ValueError("%d bytes, over the %d-byte budget" % (size, _ARTIFACT_BUDGET))
    if size <= head:
        raise ValueError("%d bytes: truncated" % size)
    with open(path, "rb") as f:
        data = f.read(_ARTIFACT_BUDGET + 1)
    if data[:len(_ARTIFACT_MAGIC)] != _ARTIFACT_MAGIC:
        raise ValueError("not a Tally precompiled artifact")
    payload = memoryview(data)[head:]
    if hashlib.sha256(payload).digest() != data[len(_ARTIFACT_MAGIC):head]:
        raise ValueError("its bytes differ from the digest saved with them")
    return load_compiled(torch, payload, f_globals)


def load_compiled(torch, payload, f_globals):
    """torch.compiler.load_compiled_function with the compiled code's globals. Before torch 2.12
    the saved function does not carry every global dynamo installed while tracing (the modules and
    builtins that the traced code reached, such as torchvision's `collections`): the load names
    them ("Missing required external references: ['___module_collections_<id>_c0']"), and they are
    given from this process's modules and builtins, then the load is tried again."""
    import builtins

    globs = dict(f_globals)
    for _ in range(64):
        try:
            return torch.compiler.load_compiled_function(io.BytesIO(payload), f_globals=globs)
        except RuntimeError as e:
            text = str(e)
            if "Missing required external references" not in text:
                raise
            missing = [m for m in re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", text) if m not in globs]
            resolved = {name: _external_reference(name, builtins) for name in missing}
            unresolved = [name for name, value in resolved.items() if value is None]
            if not missing or unresolved:
                raise RuntimeError("the saved function needs globals this process cannot give: %s"
                                   % ", ".join(unresolved or missing)) from e
            globs.update(resolved)
    raise RuntimeError("the saved function kept asking for more globals")


def _external_reference(name, builtins):
    """A global that dynamo named while tracing: `__builtins_dict___N` (the builtins' dict) or
    `___module_<module, dots as underscores>_<id>_c<N>` (a module), else None."""
    if re.fullmatch(r"__builtins_dict___\d+", name):
        return vars(builtins)
    m = re.fullmatch(r"___module_(.+)_\d+_c\d+", name)
    if m:
        for module_name, module in list(sys.modules.items()):
            if module is not None and module_name.replace(".", "_") == m.group(1):
                return module
    return None


@contextlib.contextmanager
def _host_lock():
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not folder:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, "tally-compile.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _synchronize():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _timings(state, eager, compiled):
    """The trial's timed passes of the eager and the compiled module (three each, their medians in
    ms), or, for a saved artifact, those the process that first ran it timed (`<key>.timing` beside
    it): the same code, shapes and GPU, and six passes fewer before the first batch's rows."""
    path = state.timing_path
    if path:
        try:
            with open(path, "rb") as f:
                kept = json.loads(f.read(4096))
            timed = {k: float(kept[k]) for k in ("eager_ms", "compiled_ms")}
            if all(0 < v < 1e7 for v in timed.values()):
                state.note("timings kept by the job that first ran this artifact (%s)" % path)
                return timed
        except (OSError, ValueError, TypeError, KeyError):
            pass  # None yet, or unreadable: timed again (and kept).
    timed = {"eager_ms": _time_passes(eager), "compiled_ms": _time_passes(compiled)}
    if path:
        with contextlib.suppress(OSError):
            replace_file(path, json.dumps(timed).encode())
    return timed


def _time_passes(fn, passes=3):
    import statistics  # Here, not at the top: as _source's inspect.

    times = []
    for _ in range(passes):
        _synchronize()
        t0 = time.perf_counter()
        fn()
        _synchronize()
        times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def _cache_counters():
    try:
        from torch._dynamo.utils import counters
        return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
    except Exception:
        return 0, 0


def _signature(args, kwargs):
    torch = sys.modules["torch"]
    leaves = list(args) + [kwargs[k] for k in sorted(kwargs)]
    return tuple((tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor) else type(x).__name__
                 for x in leaves)


def _batch_size(args):
    torch = sys.modules["torch"]
    for x in args:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return 0


def _compare(torch, eager_out, compiled_out):
    """Largest |difference| over the floating outputs; pixels whose argmax over dim 1 changed in
    N x C x H x W (C >= 2) outputs, of all such pixels."""
    from torch.utils._pytree import tree_flatten

    a, _ = tree_flatten(eager_out)
    b, _ = tree_flatten(compiled_out)
    diff, changed, pixels = 0.0, 0, 0
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
            continue
        if x.is_floating_point() and x.numel():
            diff = max(diff, float((x.float() - y.float()).abs().max()))
            if x.dim() == 4 and x.shape[1] >= 2:
                changed += int((x.argmax(1) != y.argmax(1)).sum())
                pixels += x.shape[0] * x.shape[2] * x.shape[3]
    return {"max_abs_diff": diff, "argmax_changed": changed, "pixels": pixels}
