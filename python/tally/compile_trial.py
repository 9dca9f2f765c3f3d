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
"""

import contextlib
import fcntl
import os
import statistics
import sys
import time

_GAIN = 0.97  # Compiled is kept when its pass takes under 97 % of eager's.


class CompileState:
    """What every compiled attribute of one model shares: the job's choice and the trial."""

    def __init__(self, on_trial):
        self.mode = "trial"  # "trial" | "compiled" | "eager"
        self.on_trial = on_trial  # on_trial(trial dict) -> True to run compiled (blocks for the job's choice)
        self.trial = None


class Switch:
    """A module attribute under --compile: calls go to the compiled or the eager module as the job
    chose; attributes are the eager module's."""

    def __init__(self, eager, compiled, state):
        self.__dict__.update(_eager=eager, _compiled=compiled, _state=state, _shapes=set())

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
        """The compiled call; a shape not run here before (a compile, or the cache) under the host's lock."""
        shapes = _signature(args, kwargs)
        if shapes in self._shapes:
            return self._compiled(*args, **kwargs), 0.0
        t0 = time.perf_counter()
        with _host_lock():
            waited = time.perf_counter() - t0
            out = self._compiled(*args, **kwargs)
            _synchronize()
        self._shapes.add(shapes)
        return out, waited

    def _trial(self, args, kwargs):
        torch = sys.modules["torch"]
        counters = _cache_counters()
        _synchronize()
        t0 = time.perf_counter()
        note = ""
        try:
            compiled_out, waited = self._call_compiled(args, kwargs)
            if waited > 0.1:
                note = "waited %.1f s for another worker's compile on this host" % waited
        except Exception as e:  # Compiling failed: propose eager, saying why.
            compiled_out, note = None, "compiling failed: %s: %s" % (type(e).__name__, str(e)[:300])
        compile_seconds = time.perf_counter() - t0
        hits, misses = (a - b for a, b in zip(_cache_counters(), counters))
        eager_out = self._eager(*args, **kwargs)
        trial = {"batch": _batch_size(args), "compile_seconds": compile_seconds, "cache_hits": hits,
                 "cache_misses": misses, "note": note, "faster": False}
        if compiled_out is not None:
            trial["eager_ms"] = _time_passes(lambda: self._eager(*args, **kwargs))
            trial["compiled_ms"] = _time_passes(lambda: self._compiled(*args, **kwargs))
            trial["faster"] = trial["compiled_ms"] < _GAIN * trial["eager_ms"]
            with torch.no_grad():
                trial.update(_compare(torch, eager_out, compiled_out))
        state = self._state
        state.trial = trial
        state.mode = "compiled" if state.on_trial(trial) else "eager"
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

    def compile_fn(module):
        return Switch(module, torch.compile(module, dynamic=False), state)

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


def _time_passes(fn, passes=3):
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
