#!/usr/bin/env bash
# A transformers SegFormer (examples/python-model/segformer.py, random weights from a config) split
# over two GPUs by one worker (--gpus-per-worker 2, device_map=auto), against the same model on one
# GPU: per-GPU peak memory from report.json, and whether per_image.csv is identical.
#   bench/gpu/multi_gpu_python.sh [WORK_DIR] [IMAGES]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/tally-multigpu}
n=${2:-512}
bin=${TALLY_BUILD:-$src/build-gpu}/bin
py=${PYTHON:-python3}
mkdir -p "$work/out"
[ -f "$work/png/manifest.csv" ] || "$bin/tally-make-dataset" --out "$work/png" --count "$n" --size 512 --format png >&2
common=(--model "$src/examples/python-model/segformer.py" --model-option num_labels=2 --python "$py"
        --manifest "$work/png/manifest.csv" --metrics dice,iou,hd95 --batch-size 16)
CUDA_VISIBLE_DEVICES=0 "$bin/tally" run "${common[@]}" --out "$work/out/one" --gpus all > "$work/out/one.log" 2>&1 \
  || tail -20 "$work/out/one.log"
"$bin/tally" run "${common[@]}" --model-option device_map=auto --out "$work/out/split" --gpus all --gpus-per-worker 2 \
  > "$work/out/split.log" 2>&1 || tail -20 "$work/out/split.log"
$py - "$work/out/one/report.json" "$work/out/split/report.json" <<'PY'
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
cmp "$work/out/one/per_image.csv" "$work/out/split/per_image.csv" && echo "per_image.csv identical" || echo "per_image.csv DIFFERS"
