"""tally export: a segmentation network as an AOTInductor package (.pt2) that tally-worker's C++
runner loads with LibTorch (`tally run --model net.pt2`), compiled once ahead of time by inductor.

  tally export --model net.pt --input-size 512x512 --batch-size 32 --precision bf16 --out net.pt2
  (the same as: python3 -m tally.export ...)

--model is a TorchScript file (what Tally's C++ runner takes) or a Python model file (`file.py` or
`file.py:Class`, with --model-option KEY=VALUE as `tally run` passes them): its network is the
torch.nn.Module attribute of the model instance (exactly one), or what its `tally_export()` returns.

The package takes what the C++ runner feeds a TorchScript model: float N x 3 x H x W, N from 1 to
--batch-size (or exactly --batch-size where the network's code fixes it, as TorchScript's often
does: the worker pads a smaller last batch), H x W the --input-size (the images' size, or the job's
--input-size). It returns the
logits (a tensor; of a tuple or list the first element, of a dict its "out"), computed under
autocast to --precision as the runner runs a TorchScript model. What it was made for goes into the
package's metadata (tally.*) and tally-worker checks every batch against it.

The package's C++ wrapper is compiled by the system's g++ (--cxx to choose): it must use the
libstdc++ of the processes that load it. A compiler that links its own copy of libstdc++ into the
wrapper (some toolchains do by default) makes a package that crashes when loaded into a Python
process (docs/models.md). So the package is checked before this command succeeds: a fresh process
loads it, runs the export's batch and compares with the network's own outputs (--no-check skips).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

METADATA_PREFIX = "tally."


def _fail(message):
    print("tally export: " + message, file=sys.stderr)
    sys.exit(1)


def _parse_size(text):
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and 0 < int(p) <= 65536 for p in parts):
        _fail("--input-size '%s': expected HxW, e.g. 512x512" % text)
    return int(parts[0]), int(parts[1])


def _options(pairs):
    out = {}
    for p in pairs:
        if "=" not in p:
            _fail("--model-option '%s': expected KEY=VALUE" % p)
        k, v = p.split("=", 1)
        out[k] = v
    return out


def _logits(out):
    """The C++ runner's rule (ExtractLogits): a tensor, a tuple's or list's first element, a dict's "out"."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict):
        if isinstance(out.get("out"), torch.Tensor):
            return out["out"]
        if len(out) == 1 and isinstance(next(iter(out.values())), torch.Tensor):
            return next(iter(out.values()))
    raise TypeError("the network returned %s; expected a tensor of logits [N, C, H, W], a tuple whose first "
                    "element is one, or a dict with key 'out'" % type(out).__name__)


def _network(model, options, device):
    """The torch.nn.Module to export, from a TorchScript file or a Python model file."""
    import torch

    path, class_name = model.rsplit(":", 1) if ".py:" in model else (model, "")
    if not os.path.exists(path):
        _fail("--model '%s' does not exist" % path)
    if not path.endswith(".py"):
        try:
            return torch.jit.load(path, map_location=device).eval(), "torchscript"
        except Exception as e:  # noqa: BLE001 - the loader's own message says what is wrong
            _fail("--model '%s' is not a loadable TorchScript file: %s" % (path, str(e).splitlines()[0][:300]))
    from tally.model_file import NoSuchClass, load_model_class

    try:
        cls = load_model_class(path, class_name or "Model")
    except NoSuchClass as e:
        _fail(str(e))
    instance = cls([str(device)], options)
    hook = getattr(instance, "tally_export", None)
    if callable(hook):
        net = hook()
    else:
        nets = sorted((n, v) for n, v in vars(instance).items() if isinstance(v, torch.nn.Module))
        if len(nets) != 1:
            _fail("%s: export takes the model's one torch.nn.Module attribute, but it has %d (%s); define "
                  "tally_export(self) returning the network" % (path, len(nets), ", ".join(n for n, _ in nets) or "none"))
        net = nets[0][1]
    return net.eval().to(device), "python"


def _make_wrapper(torch, net, precision):
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    class Exported(torch.nn.Module):
        """The network as the C++ runner calls it: autocast to the job's precision, logits out."""

        def __init__(self):
            super().__init__()
            if isinstance(net, torch.jit.ScriptModule):
                # Not a submodule: a TorchScript module's weights are plain tensors, which the export
                # refuses as parameters; unregistered, they become the program's constants.
                object.__setattr__(self, "net", net)
            else:
                self.net = net

        def forward(self, x):
            if dtype is None:
                return _logits(self.net(x))
            with torch.autocast(x.device.type, dtype=dtype):
                return _logits(self.net(x))

    return Exported().eval()


def _export_program(torch, wrapper, x, batch, kind):
    """(ExportedProgram, whether its batch dimension is dynamic). A batch of 1..`batch` first; where
    the network's code fixes the batch size (TorchScript often does), the export's size exactly, and
    the worker pads a smaller last batch up to it."""
    errors = []
    for dynamic in (True, False):
        shapes = {"x": {0: torch.export.Dim("batch", min=1, max=batch)}} if dynamic else None
        for strict in ((False,) if kind == "torchscript" else (False, True)):
            try:
                with torch.no_grad():
                    return torch.export.export(wrapper, (x,), dynamic_shapes=shapes, strict=strict), dynamic
            except Exception as e:  # noqa: BLE001 - reported below with every way tried
                errors.append("torch.export (%s batch, strict=%s): %s: %s" % (
                    "dynamic" if dynamic else "fixed", strict, type(e).__name__, str(e).splitlines()[0][:400]))
    if kind == "torchscript":
        try:
            from torch._export.converter import TS2EPConverter

            with torch.no_grad():
                return TS2EPConverter(wrapper.net, (x,)).convert(), False
        except Exception as e:  # noqa: BLE001
            errors.append("TS2EPConverter: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:400]))
    _fail("the network could not be exported:\n  " + "\n  ".join(errors) +
          "\n(a Python model file of the same network exports where TorchScript does not)")


def _check(package, reference, device):
    """In a fresh process: load `package`, run the reference batch, compare. One JSON line."""
    import torch

    ref = torch.load(reference, map_location=device)
    t0 = time.perf_counter()
    loaded = torch._inductor.aoti_load_package(package)
    with torch.no_grad():
        got = loaded(ref["x"])
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.cuda.synchronize() if str(device).startswith("cuda") else None
    seconds = time.perf_counter() - t0
    want = ref["out"]
    out = {"load_and_first_call_seconds": round(seconds, 3), "shape": list(got.shape),
           "max_abs_diff": float((got.float() - want.float()).abs().max())}
    if want.dim() == 4 and want.shape[1] >= 2:
        out["argmax_changed_fraction"] = float((got.argmax(1) != want.argmax(1)).float().mean())
    print(json.dumps(out))


def _check_in_fresh_process(torch, partial, x, want, device, cxx, out):
    """Loads the package `partial` in a new Python process and runs `x` (_check): its comparison
    with the network's `want`. A process that fails or dies removes the package and ends the export."""
    with tempfile.TemporaryDirectory() as tmp:
        reference = os.path.join(tmp, "reference.pt")
        torch.save({"x": x, "out": want}, reference)
        p = subprocess.run([sys.executable, "-m", "tally.export", "--check", partial, reference, "--device", device],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                               [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] +
                               [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q])))
    if p.returncode != 0:
        os.remove(partial)
        how = ("was killed by signal %d" % -p.returncode) if p.returncode < 0 else ("failed (exit %d)" % p.returncode)
        _fail("the package built by %s %s when a fresh process loaded it; nothing was written to %s.\n%s\n"
              "A wrapper compiled by a toolchain that links its own libstdc++ crashes this way: give --cxx the "
              "compiler of the system's libstdc++ (docs/models.md)." % (cxx or "inductor's compiler", how, out,
                                                                        p.stderr.strip()[-1500:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tally export", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="TorchScript file, or a Python model file (file.py or file.py:Class)")
    ap.add_argument("--model-option", action="append", default=[], help="KEY=VALUE for a Python model (repeatable)")
    ap.add_argument("--out", help="the package to write (.pt2)")
    ap.add_argument("--input-size", help="HxW of the model's input (the images' size, or the job's --input-size)")
    ap.add_argument("--batch-size", type=int, default=32, help="the largest batch the package takes (default 32)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cxx", default="", help="C++ compiler of the package's wrapper (default: g++ on PATH)")
    ap.add_argument("--no-check", action="store_true", help="skip loading the package in a fresh process")
    ap.add_argument("--check", nargs=2, metavar=("PACKAGE", "REFERENCE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.check:
        _check(a.check[0], a.check[1], a.device)
        return
    if not a.model or not a.out or not a.input_size:
        _fail("--model, --out and --input-size are required (tally export --help)")
    if not a.out.endswith(".pt2"):
        _fail("--out '%s': an AOTInductor package's name ends in .pt2" % a.out)
    if not 1 <= a.batch_size <= 4096:
        _fail("--batch-size %d: expected 1..4096" % a.batch_size)
    h, w = _parse_size(a.input_size)
    cxx = a.cxx or shutil.which("g++") or shutil.which("c++") or os.environ.get("CXX", "")
    if cxx:
        os.environ["CXX"] = cxx  # Before torch reads it (torch._inductor.config.cpp.cxx).
    try:
        import torch
    except ImportError:
        _fail("needs torch in this interpreter (%s)" % sys.executable)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < (2, 6) or not hasattr(torch, "export"):
        _fail("needs torch 2.6 or newer (torch.export and AOTInductor packages); this interpreter (%s) has torch %s"
              % (sys.executable, torch.__version__))
    import torch._inductor
    import torch._inductor.config

    if cxx:
        torch._inductor.config.cpp.cxx = (None, cxx)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        _fail("--device %s: no CUDA device is visible" % a.device)
    net, kind = _network(a.model, _options(a.model_option), device)
    wrapper = _make_wrapper(torch, net, a.precision)
    torch.manual_seed(0)
    x = torch.rand(a.batch_size, 3, h, w, device=device)
    with torch.no_grad():
        want = wrapper(x)
    if want.dim() != 4 or want.shape[0] != a.batch_size:
        _fail("the network's logits have shape %s for an input of %s; expected [N, C, H, W]"
              % (list(want.shape), list(x.shape)))
    t0 = time.perf_counter()
    ep, dynamic = _export_program(torch, wrapper, x, a.batch_size, kind)
    export_seconds = time.perf_counter() - t0
    metadata = {METADATA_PREFIX + "input": "3x%dx%d" % (h, w), METADATA_PREFIX + "batch_max": str(a.batch_size),
                METADATA_PREFIX + "batch_dynamic": "1" if dynamic else "0",
                METADATA_PREFIX + "precision": a.precision, METADATA_PREFIX + "classes": str(int(want.shape[1])),
                METADATA_PREFIX + "device": device.type, METADATA_PREFIX + "torch": torch.__version__,
                METADATA_PREFIX + "source": os.path.basename(a.model)}
    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    partial = a.out[:-len(".pt2")] + ".partial.pt2"  # inductor wants the .pt2 ending
    t0 = time.perf_counter()
    torch._inductor.aoti_compile_and_package(ep, package_path=partial,
                                             inductor_configs={"aot_inductor.metadata": metadata})
    package_seconds = time.perf_counter() - t0
    summary = {"out": a.out, "export_seconds": round(export_seconds, 2), "package_seconds": round(package_seconds, 2),
               "bytes": os.path.getsize(partial), "cxx": cxx, "metadata": metadata}
    if not a.no_check:
        summary["check"] = _check_in_fresh_process(torch, partial, x, want, a.device, cxx, a.out)
    os.replace(partial, a.out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
