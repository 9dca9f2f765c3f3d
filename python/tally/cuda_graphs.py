"""CUDA graphs for Python models (used by tally.stub), as the TorchScript runner has them: an eager
model's forward passes replayed from a CUDA graph, one graph launch of CPU work a batch instead of
the network's kernels launched one by one by Python.

Each torch.nn.Module attribute of the model is wrapped. A call whose inputs are CUDA tensors
(positional, no keyword arguments), made without autograd and without autocast, on a module in eval
mode, is eligible. Once a wrapped module has run the same input shapes twice in a row eagerly, it
captures its forward pass for those shapes into a graph, replays it on the inputs it just ran and
compares: the graph is kept only if every output is bit for bit the eager one (the replay runs the
kernels the eager pass ran), else graphs are off for the model and the log says why. From then on
a call of those shapes copies its inputs into the graph's, replays it on the caller's stream and
returns copies of the graph's outputs (the next replay writes where they are). One graph per
module: another shape (a last, smaller batch) runs eagerly, and a new shape seen twice in a row
replaces the graph. A capture that fails (a host synchronisation inside forward, a data-dependent
shape) turns graphs off for the model, which then runs eagerly.

Off: TALLY_CUDA_GRAPHS=0 in the worker's environment (as for TorchScript), `--compile` jobs (their
own kernels), or a model class with `tally_cuda_graphs = False`, which a model must set when a
module's forward does different work for the same input shapes from call to call (Python state
outside its inputs: a graph replays what it captured).
"""

import os
import sys


class GraphState:
    """What every wrapped module of one model shares: whether graphs are on, and why not."""

    def __init__(self):
        self.enabled = True
        self.reason = ""
        self.captured = 0

    def turn_off(self, why):
        if self.enabled:
            self.enabled = False
            self.reason = why
            print("CUDA graphs off for this model: %s (it runs eagerly)" % why, flush=True)


class GraphedModule:
    """A module attribute with CUDA graphs: calls as the module's own, replayed once captured.
    Other attributes are the module's."""

    def __init__(self, module, state):
        self.__dict__.update(_module=module, _state=state, _last=None, _streak=0, _key=None, _graph=None,
                             _inputs=None, _outputs=None)

    def __getattr__(self, name):
        return getattr(self.__dict__["_module"], name)

    def __setattr__(self, name, value):
        setattr(self.__dict__["_module"], name, value)

    def __call__(self, *args, **kwargs):
        module = self._module
        key = _eligible_key(module, args, kwargs) if self._state.enabled else None
        if key is None:
            return module(*args, **kwargs)
        if key == self._key and self._graph is not None:
            return self._replay(args)
        out = module(*args)
        if key == self._last:
            self.__dict__["_streak"] += 1  # Its own state: plain assignments go to the module (__setattr__).
        else:
            self.__dict__.update(_last=key, _streak=1)
        if self._streak >= 2:
            self._capture(args, key, out)
        return out

    def _replay(self, args):
        torch = sys.modules["torch"]
        from torch.utils._pytree import tree_map

        with torch.cuda.device(args[0].device):
            for static, x in zip(self._inputs, args):
                static.copy_(x)
            self._graph.replay()
            return tree_map(lambda t: t.clone(), self._outputs)

    def _capture(self, args, key, eager_out):
        """Captures forward for `args`' shapes, replays it on `args` and keeps it if the replay's
        outputs are the eager pass's `eager_out`, bit for bit."""
        torch = sys.modules["torch"]
        from torch.utils._pytree import tree_flatten

        state = self._state
        self.__dict__.update(_key=None, _graph=None, _inputs=None, _outputs=None)  # The old graph's memory first.
        eager, _ = tree_flatten(eager_out)
        if not eager or not all(isinstance(t, torch.Tensor) and t.is_cuda for t in eager):
            state.turn_off("%s returns something other than CUDA tensors" % type(self._module).__name__)
            return
        try:
            with torch.cuda.device(args[0].device):
                inputs = [x.clone() for x in args]
                graph = torch.cuda.CUDAGraph()
                # Thread-local: the stub's answer thread waits on events meanwhile.
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    outputs = self._module(*inputs)
                graph.replay()
                replayed, _ = tree_flatten(outputs)
                same = len(replayed) == len(eager) and all(
                    isinstance(r, torch.Tensor) and r.shape == e.shape and r.dtype == e.dtype and torch.equal(r, e)
                    for r, e in zip(replayed, eager))
        except Exception as e:  # noqa: BLE001 (a capture refused: a sync, an unsupported call)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            state.turn_off("capturing %s for inputs %s failed: %s: %s" % (type(self._module).__name__, _shapes(key),
                                                                           type(e).__name__, str(e)[:300]))
            return
        if not same:
            state.turn_off("%s replayed from a graph differed from its eager pass for inputs %s" % (
                type(self._module).__name__, _shapes(key)))
            return
        self.__dict__.update(_key=key, _graph=graph, _inputs=inputs, _outputs=outputs)
        state.captured += 1
        print("CUDA graph captured for %s, inputs %s (TALLY_CUDA_GRAPHS=0 turns graphs off)" % (
            type(self._module).__name__, _shapes(key)), flush=True)


def wrap_modules(model):
    """Wraps the model's torch.nn.Module attributes when graphs can run here. Returns (the shared
    GraphState or None, names wrapped)."""
    if os.environ.get("TALLY_CUDA_GRAPHS") == "0" or getattr(model, "tally_cuda_graphs", True) is False:
        return None, []
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch.cuda, "graph") or not torch.cuda.is_available():
        return None, []
    names = sorted(n for n, v in vars(model).items() if isinstance(v, torch.nn.Module))
    state = GraphState()
    for n in names:
        setattr(model, n, GraphedModule(getattr(model, n), state))
    return state, names


def _autocast_on(torch):
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:  # Older torch: no device argument.
        return torch.is_autocast_enabled()


def _eligible_key(module, args, kwargs):
    """The call's input signature if it may run from a graph, else None."""
    torch = sys.modules["torch"]
    if kwargs or not args or torch.is_grad_enabled() or _autocast_on(torch) or getattr(module, "training", False):
        return None
    if not all(isinstance(x, torch.Tensor) and x.is_cuda for x in args):
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    return tuple((tuple(x.shape), str(x.dtype), str(x.device), tuple(x.stride())) for x in args)


def _shapes(key):
    return ", ".join("x".join(str(d) for d in shape) + " " + dtype.replace("torch.", "") for shape, dtype, _, _ in key)
