#!/usr/bin/env bash
# Suite `python`: the Python model backend against the TorchScript backend on one GPU. Stage `backends`:
# torchvision's LRASPP and DeepLabV3 (same seeds, same data, fp32, batch 32) through both
# (tools/torchvision_model.py: the eager network as a Tally Python model), then a TorchScript
# single-logit model's threshold sweep on the GPU against the same sweep on two CPU workers. Stage
# `split`: a transformers SegFormer (examples/python-model/segformer.py, random weights from a config)
# split over two GPUs by one worker (--gpus-per-worker 2, device_map=auto) against the same model on
# one GPU: per-GPU peak memory and whether per_image.csv is identical (needs two GPUs). Stage `graphs`:
# LRASPP fp32 eager as a Python model with CUDA graphs (the default) and with TALLY_CUDA_GRAPHS=0, the
# stub's profile (TALLY_STUB_PROFILE=1: its thread's share of a CPU, predict() and the wait for the
# worker's next request) and whether per_image.csv is identical.
#   bench/gpu/run.sh python [STAGES]    (build,backends,split,graphs; default build,backends)
# Settings: COUNT (images, default 3200; split: 512).
set -uo pipefail
stages=${1:-build,backends}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/python}; mkdir -p "$work/out"
n=${COUNT:-3200}
build_stage
tests_stage
results=$work/python_backend.jsonl
if has backends; then
: > "$results"
export_models "$work/models"
make_images "$work/png" "$n" png

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
  "$bin/tally" run --model "$src/bench/gpu/tools/torchvision_model.py" --model-option "arch=$arch" --python "$py" \
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
fi

if has split; then
  make_images "$work/split_png" 512 png
  src_manifest=$work/split_png/manifest.csv
common=(--model "$src/examples/python-model/segformer.py" --model-option num_labels=2 --python "$py"
        --manifest "$src_manifest" --metrics dice,iou,hd95 --batch-size 16)
CUDA_VISIBLE_DEVICES=0 "$bin/tally" run "${common[@]}" --out "$work/out/split_one" --gpus all > "$work/out/split_one.log" 2>&1 \
  || tail -20 "$work/out/split_one.log"
"$bin/tally" run "${common[@]}" --model-option device_map=auto --out "$work/out/split_two" --gpus all --gpus-per-worker 2 \
  > "$work/out/split_two.log" 2>&1 || tail -20 "$work/out/split_two.log"
$py - "$work/out/split_one/report.json" "$work/out/split_two/report.json" <<'PY'
import json, sys
for name, path in zip(("one GPU", "split over 2"), sys.argv[1:3]):
    r = json.load(open(path))
    for w in r["workers"]:
        print(json.dumps({"run": name, "worker": w["name"], "device": w["device"], "images": w["images"],
                          "images_per_second": round(w["images_per_second"], 1),
                          "gpus": [{"device": g["device"], "name": g["name"],
                                    "peak_memory_mib": round(g["peak_memory_bytes"] / 2**20, 1)} for g in w["gpus"]],
                          "dice_mean": [c["dice_mean"] for c in r["classes"]]}))
PY
cmp "$work/out/split_one/per_image.csv" "$work/out/split_two/per_image.csv" && echo "per_image.csv identical" || echo "per_image.csv DIFFERS"
fi
echo "total: $(( $(date +%s) - t_start )) s"
if has graphs; then
  export_models "$work/models"
  make_images "$work/png" "$n" png
  for mode in graphs nographs; do
    env_mode=(); [ "$mode" = nographs ] && env_mode=(TALLY_CUDA_GRAPHS=0)
    o=$work/out/py_lraspp_$mode
    env "${env_mode[@]}" TALLY_STUB_PROFILE=1 "$bin/tally" run --model "$src/bench/gpu/tools/torchvision_model.py" \
      --model-option arch=lraspp --model-option precision=fp32 --python "$py" --manifest "$work/png/manifest.csv" \
      --out "$o" --gpus all --metrics dice --batch-size 32 > "$OUT/py_lraspp_$mode.log" 2>&1 || tail -20 "$OUT/py_lraspp_$mode.log"
    summary "$o" "python_lraspp_eager_$mode"
    grep -h "CUDA graph" "$o"/.tally/*.log | head -2 | cut -c1-300
    grep -h "stub profile over 100 " "$o"/.tally/*.log | tail -1 | cut -c1-400
  done
  echo "per_image.csv graphs vs none: $(same_rows "$work/out/py_lraspp_graphs/per_image.csv" "$work/out/py_lraspp_nographs/per_image.csv")"
fi
