#!/usr/bin/env bash
# Multi-GPU determinism check: DeepLabV3 on GPU 0 alone and on all GPUs, once with cuDNN's
# benchmark mode (the default) and once without; reports whether per_image.csv is identical and,
# if not, how many rows differ.   bench/gpu/scaling_check.sh WORK_DIR (after run_bench.sh setup)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/tally-bench}
bin=${TALLY_BUILD:-$src/build-gpu}/bin
for mode in benchmark deterministic; do
  flags=()
  [ "$mode" = deterministic ] && flags=(--worker-flags=--cudnn-benchmark=false)
  for g in one all; do
    env=()
    [ "$g" = one ] && env=(CUDA_VISIBLE_DEVICES=0)
    env "${env[@]}" "$bin/tally" run --model "$work/models/deeplabv3.pt" --manifest "$work/png/manifest.csv" \
      --out "$work/det_${mode}_$g" --gpus all --metrics dice --batch-size 32 "${flags[@]}" > /dev/null 2>&1
  done
  python3 - "$work/det_${mode}_one" "$work/det_${mode}_all" "$mode" <<'PY'
import csv, json, sys
a = list(csv.DictReader(open(sys.argv[1] + "/per_image.csv")))
b = list(csv.DictReader(open(sys.argv[2] + "/per_image.csv")))
diff = [(x["index"], x["class"]) for x, y in zip(a, b) if x != y]
pix = sum(abs(int(x["tp"]) - int(y["tp"])) for x, y in zip(a, b) if x != y)
ra, rb = json.load(open(sys.argv[1] + "/report.json")), json.load(open(sys.argv[2] + "/report.json"))
print(json.dumps({"kind": "determinism", "mode": sys.argv[3], "rows": len(a), "rows_differing": len(diff),
                  "tp_pixels_differing": pix, "gpus": len(rb["workers"]),
                  "one_gpu_img_s": sum(w["images_per_second"] for w in ra["workers"]),
                  "all_gpus_img_s": sum(w["images_per_second"] for w in rb["workers"]),
                  "dice_one": [c["dice_mean"] for c in ra["classes"]],
                  "dice_all": [c["dice_mean"] for c in rb["classes"]]}))
PY
done
