#!/usr/bin/env bash
# The Python model backend against the TorchScript backend: torchvision's LRASPP and DeepLabV3
# (same seeds, same data, fp32, batch 32) through both, on every visible GPU; then a TorchScript
# single-logit model's threshold sweep on the GPU against the same sweep on the CPU.
#
#   bench/gpu/python_backend.sh [WORK_DIR] [IMAGES]
# Needs the build from scripts/gpu/build.sh (TALLY_BUILD, default build-gpu) and python3 with torch
# and torchvision. Prints one JSON line per run and a table.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/tally-pybench}
n=${2:-3200}
bin=${TALLY_BUILD:-$src/build-gpu}/bin
py=${PYTHON:-python3}
mkdir -p "$work/out"
results=$work/python_backend.jsonl
: > "$results"
[ -f "$work/models/lraspp.pt" ] || $py "$src/bench/gpu/export_models.py" "$work/models" >&2
[ -f "$work/png/manifest.csv" ] || "$bin/tally-make-dataset" --out "$work/png" --count "$n" --size 512 --format png >&2

summarize() {  # name backend arch
  $py - "$work/out/$1/report.json" "$1" "$2" "$3" <<'PY' >> "$results"
import json, sys
r = json.load(open(sys.argv[1]))
w = r["workers"]
print(json.dumps({"name": sys.argv[2], "backend": sys.argv[3], "arch": sys.argv[4], "gpus": len(w),
                  "images": r["images_evaluated"], "failed": r["images_failed"],
                  "steady_images_per_second": sum(x["images_per_second"] for x in w),
                  "wall_images_per_second": r["images_per_second"], "model_load_seconds": [x["model_load_seconds"] for x in w],
                  "peak_memory_gib": [x["peak_memory_bytes"] / 2**30 for x in w],
                  "gpu": [x["gpu_name"] for x in w], "dice_mean": [c["dice_mean"] for c in r["classes"]]}))
PY
  tail -1 "$results" >&2
}

for arch in lraspp deeplabv3; do
  "$bin/tally" run --model "$work/models/$arch.pt" --manifest "$work/png/manifest.csv" --out "$work/out/ts_$arch" \
    --gpus all --metrics dice --batch-size 32 > "$work/out/ts_$arch.log" 2>&1 || tail -20 "$work/out/ts_$arch.log"
  summarize "ts_$arch" torchscript "$arch"
  "$bin/tally" run --model "$src/bench/gpu/torchvision_model.py" --model-option "arch=$arch" --python "$py" \
    --manifest "$work/png/manifest.csv" --out "$work/out/py_$arch" --gpus all --worker-flags=--warmup-batches=2 --metrics dice --batch-size 32 \
    > "$work/out/py_$arch.log" 2>&1 || tail -20 "$work/out/py_$arch.log"
  summarize "py_$arch" python "$arch"
done

# Threshold sweep: the same single-logit TorchScript model on the GPU and on the CPU.
head -257 "$work/png/manifest.csv" > "$work/png/manifest256.csv"
for dev in gpu cpu; do
  if [ $dev = gpu ]; then where="--gpus all"; else where="--workers 2"; fi
  "$bin/tally" run --model "$src/tests/fixtures/single_logit.pt" --manifest "$work/png/manifest256.csv" \
    --out "$work/out/sweep_$dev" $where --thresholds 0.1,0.3,0.5,0.7,0.9 --metrics dice > "$work/out/sweep_$dev.log" 2>&1 \
    || tail -20 "$work/out/sweep_$dev.log"
done
$py - "$work/out/sweep_gpu/report.json" "$work/out/sweep_cpu/report.json" <<'PY' >> "$results"
import json, sys
g, c = (json.load(open(p)) for p in sys.argv[1:3])
print(json.dumps({"name": "threshold_sweep_gpu_vs_cpu", "equal": g["thresholds"] == c["thresholds"],
                  "gpu": g["thresholds"], "best_threshold": g.get("best_threshold")}))
PY
tail -1 "$results" >&2
$py - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {r["name"]: r for r in rows}
print("| model | TorchScript img/s | Python img/s | Python / TorchScript | dice (TS) | dice (Py) |")
print("|---|---|---|---|---|---|")
for arch in ("lraspp", "deeplabv3"):
    t, p = by.get("ts_" + arch), by.get("py_" + arch)
    if t and p:
        print("| %s | %.0f | %.0f | %.2f | %s | %s |" % (arch, t["steady_images_per_second"], p["steady_images_per_second"],
              p["steady_images_per_second"] / t["steady_images_per_second"],
              ["%.5f" % d for d in t["dice_mean"]], ["%.5f" % d for d in p["dice_mean"]]))
PY
