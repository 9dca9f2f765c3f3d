#!/usr/bin/env python3
"""Where a compiled model's start-up goes, and whether an AOTInductor package can be built here.

  python3 bench/gpu/tools/compile_probe.py warm --arch deeplabv3 --precision bf16 [--megacache FILE]
      torch.compile'd first call (dynamic=False, as Tally's --compile applies it) with the inductor
      cache in $TORCHINDUCTOR_CACHE_DIR: seconds to the first output, dynamo's phase times, the FX
      graph and AOTAutograd cache hits. --megacache FILE loads torch.compiler's cache artifacts from
      FILE first when it exists, and saves them there after. --profile N: the N costliest calls of
      the first compiled call (cProfile, cumulative) on stderr. --precompile: dynamo's
      caching_precompile on (where this torch has it).
  python3 bench/gpu/tools/compile_probe.py precompile --arch deeplabv3 --artifact FILE [--load]
      torch.compile(fullgraph=True).forward.aot_compile (dynamo, AOTAutograd and inductor ahead of
      the call) saved to FILE; with --load a fresh process reads FILE back
      (torch.compiler.load_compiled_function): the seconds of the load and of the first call.
      --wrap: torch.compile(model) first, as Tally's --compile wraps a module before its trial
      (what that wrapper imports, against the load alone). Both say the modules imported and the
      processes this one started (inductor's compile worker pool; TORCH_WARM_POOL=0 keeps it cold), and
      the load's attempts (each missing global costs one). --profile N: the N costliest calls of the
      load and its first call (cProfile, cumulative; then by own time) on stderr.
  python3 bench/gpu/tools/compile_probe.py load --package FILE.pt2
      aoti_load_package of an existing package and its first call, timed apart.
  python3 bench/gpu/tools/compile_probe.py aoti --arch lraspp --precision fp32 --package FILE.pt2
      torch.export + torch._inductor.aoti_compile_and_package, then aoti_load_package: the seconds of
      each, the package's rate and its outputs against eager (faulthandler on: a crash prints its stack).

One JSON line on stdout.
"""
import time

_T_START = time.perf_counter()
import argparse
import faulthandler
import json
import os
import sys
import time

faulthandler.enable()

import torch

torch._C._set_print_stack_traces_on_fatal_signal(True)  # A native crash prints its C++ frames too.
from torchvision.models.segmentation import deeplabv3_resnet50, lraspp_mobilenet_v3_large


class Net(torch.nn.Module):
    """The network's "out" as a plain tensor, under the job's precision (autocast inside)."""

    def __init__(self, arch, precision):
        super().__init__()
        ctor = {"lraspp": lraspp_mobilenet_v3_large, "deeplabv3": deeplabv3_resnet50}[arch]
        torch.manual_seed(0)
        self.net = ctor(weights=None, weights_backbone=None, num_classes=2).eval()
        self.bf16 = precision == "bf16"

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            return self.net(x)["out"]


def rate(fn, x, iters=20):
    with torch.no_grad():
        for _ in range(5):
            fn(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(x)
        torch.cuda.synchronize()
    return x.shape[0] * iters / (time.perf_counter() - t0)


def timed_call(fn, x):
    """fn(x) without grad, to the GPU's end: (its output, its seconds)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        got = fn(x)
    torch.cuda.synchronize()
    return got, time.perf_counter() - t0


def compare(ref, got):
    return {"max_abs_diff": float((ref.float() - got.float()).abs().max()),
            "argmax_changed": int((ref.argmax(1) != got.argmax(1)).sum()), "pixels": int(ref[:, 0].numel())}


def warm(a, model, x):
    out = {"mode": "warm", "arch": a.arch, "precision": a.precision}
    if a.megacache and os.path.exists(a.megacache):
        t0 = time.perf_counter()
        with open(a.megacache, "rb") as f:
            info = torch.compiler.load_cache_artifacts(f.read())
        out["megacache_load_seconds"] = time.perf_counter() - t0
        out["megacache_loaded"] = str(info)[:300]
    t0 = time.perf_counter()
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401
    out["import_inductor_seconds"] = time.perf_counter() - t0
    out["has_caching_precompile"] = hasattr(torch._dynamo.config, "caching_precompile")
    if a.precompile and out["has_caching_precompile"]:
        torch._dynamo.config.caching_precompile = True
    compiled = torch.compile(model, dynamic=False)
    profiler = None
    if a.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    got, out["first_call_seconds"] = timed_call(compiled, x)
    if profiler is not None:
        import pstats
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(a.profile)
    _, out["eager_after_compiled_seconds"] = timed_call(model, x)
    from torch._dynamo.utils import counters, compile_times
    out["counters"] = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd", "dynamo_cache")}
    out["compile_times"] = compile_times(repr="str", aggregate=True)[:1500] if callable(compile_times) else ""
    with torch.no_grad():
        out.update(compare(model(x), got))
    out["compiled_images_per_second"] = rate(compiled, x)
    if a.megacache and not os.path.exists(a.megacache):
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            with open(a.megacache, "wb") as f:
                f.write(saved[0])
            out["megacache_bytes"] = len(saved[0])
    return out


def precompile(a, model, x):
    out = {"mode": "precompile", "arch": a.arch, "precision": a.precision, "load": a.load}
    t0 = time.perf_counter()
    import torch._dynamo
    torch._dynamo.config.enable_aot_compile = True  # Else torch 2.11's compiled forward has no aot_compile.
    out["import_dynamo_seconds"] = time.perf_counter() - t0
    fn = None
    if a.wrap:
        t0, before = time.perf_counter(), len(sys.modules)
        torch.compile(model, dynamic=False)
        out["wrap_seconds"] = time.perf_counter() - t0
        out["wrap_modules_imported"] = len(sys.modules) - before
    profiler = None
    if a.profile:
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
    if a.load:
        t0, before = time.perf_counter(), len(sys.modules)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
        from tally.compile_trial import load_compiled  # Tally's load: the globals torch < 2.12 leaves out.
        attempts = [0]
        real_load = torch.compiler.load_compiled_function

        def counted(*args, **kwargs):
            attempts[0] += 1
            return real_load(*args, **kwargs)
        torch.compiler.load_compiled_function = counted
        with open(a.artifact, "rb") as f:
            fn = load_compiled(torch, f.read(), Net.forward.__globals__)
        out["load_seconds"] = time.perf_counter() - t0
        out["load_attempts"] = attempts[0]
        out["load_modules_imported"] = len(sys.modules) - before
    else:
        t0 = time.perf_counter()
        with torch.no_grad():
            fn = torch.compile(model, fullgraph=True, dynamic=False).forward.aot_compile(((x,), {}))
        out["aot_compile_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn.save_compiled_function(a.artifact)
        out["save_seconds"] = time.perf_counter() - t0
        out["artifact_bytes"] = os.path.getsize(a.artifact)
    got, out["first_call_seconds"] = timed_call(lambda t: fn(model, t), x)
    if profiler is not None:  # The load and its first call: where their seconds go.
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(a.profile)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(a.profile // 2)
    with torch.no_grad():
        out.update(compare(model(x), got))
    out["precompiled_images_per_second"] = rate(lambda t: fn(model, t), x)
    out["descendant_processes"] = descendants(os.getpid())
    return out


def descendants(pid):
    """How many processes descend from pid (inductor's compile pool: a sidecar and its workers)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    count, frontier = 0, {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier}
        count += len(frontier)
    return count


def load(a, model, x):
    out = {"mode": "load"}
    t0 = time.perf_counter()
    import torch._inductor
    loaded = torch._inductor.aoti_load_package(a.package)
    out["load_seconds"] = time.perf_counter() - t0
    got, out["first_call_seconds"] = timed_call(loaded, x)
    with torch.no_grad():
        out.update(compare(model(x), got))
    return out


def aoti(a, model, x):
    out = {"mode": "aoti", "arch": a.arch, "precision": a.precision}
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
    out["export_seconds"] = time.perf_counter() - t0
    print("exported", flush=True, file=sys.stderr)
    t0 = time.perf_counter()
    path = torch._inductor.aoti_compile_and_package(ep, package_path=a.package)
    out["package_seconds"] = time.perf_counter() - t0
    out["package_bytes"] = os.path.getsize(path)
    print("packaged", path, flush=True, file=sys.stderr)
    if a.steps:
        import subprocess, zipfile
        folder = a.package + ".d"
        zipfile.ZipFile(path).extractall(folder)
        sos = [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs if f.endswith(".so")]
        print("members:", [os.path.relpath(os.path.join(r, f), folder) for r, _, fs in os.walk(folder) for f in fs][:20],
              file=sys.stderr, flush=True)
        for so in sos:
            print(subprocess.run(["ldd", so], capture_output=True, text=True).stdout, file=sys.stderr, flush=True)
        import ctypes
        # The crash (std::regex in the generated parse_device_str, through std::locale facets): the
        # wrapper .so binds to its own copy of libstdc++'s locale code when loaded RTLD_DEEPBIND.
        for so in sos:
            ctypes.CDLL(so, mode=os.RTLD_NOW | os.RTLD_DEEPBIND)
            print("dlopen (RTLD_DEEPBIND) ok:", so, file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        runner = torch._C._aoti.AOTIModelContainerRunnerCuda(sos[0], 1, "cuda", os.path.dirname(sos[0]))
        print("container runner ok", file=sys.stderr, flush=True)
        with torch.no_grad():
            got = runner.run([x])[0]
        torch.cuda.synchronize()
        out["deepbind_load_and_first_call_seconds"] = time.perf_counter() - t0
        with torch.no_grad():
            out.update(compare(model(x), got))
        out["package_images_per_second"] = rate(lambda t: runner.run([t])[0], x)
        out["eager_images_per_second"] = rate(model, x)
        return out
    t0 = time.perf_counter()
    loaded = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        got = loaded(x)
    torch.cuda.synchronize()
    out["load_and_first_call_seconds"] = time.perf_counter() - t0
    with torch.no_grad():
        out.update(compare(model(x), got))
    out["package_images_per_second"] = rate(loaded, x)
    out["eager_images_per_second"] = rate(model, x)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("warm", "aoti", "precompile", "load"))
    ap.add_argument("--arch", default="lraspp")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--megacache", default="")
    ap.add_argument("--package", default="/tmp/model.pt2")
    ap.add_argument("--steps", action="store_true", help="aoti: load the package's parts one by one first")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--artifact", default="/tmp/model.aot")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--wrap", action="store_true", help="precompile: torch.compile(model) first, as Tally does")
    a = ap.parse_args()
    out_start = time.perf_counter() - _T_START
    t0 = time.perf_counter()
    model = Net(a.arch, a.precision).cuda()
    x = torch.rand(a.batch, 3, 512, 512, device="cuda")
    with torch.no_grad():
        model(x)
    torch.cuda.synchronize()
    setup = time.perf_counter() - t0
    out = {"warm": warm, "aoti": aoti, "precompile": precompile, "load": load}[a.mode](a, model, x)
    out["setup_seconds"] = setup
    out["import_torch_seconds"] = out_start
    out["process_seconds"] = time.perf_counter() - _T_START
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
