#!/usr/bin/env bash
# Suite `throughput`: one GPU. Tally's steady rate (tally run, one worker) against the model-only
# ceiling measured beside it on the same GPU (the same TorchScript model, inputs already on the GPU,
# forward pass alone: tools/ceiling.py; and the eager network: tools/eager_ceiling.py) and against
# the best PyTorch DataLoader loop (tools/python_reference.py: PIL decoding, pinned memory, the same
# per-image Dice). LRASPP-MobileNetV3 fp32 (light: the data path shows) and DeepLabV3-ResNet50 fp32
# and bf16 (compute bound), batch 32, on photograph-like 512x512 PNG and JPEG q90; then a table.
#   bench/gpu/run.sh throughput [STAGES]    (build,setup,decode,ceiling,tally,python,metrics,cudnn_benchmark;
#                                            default all but cudnn_benchmark)
# Settings: COUNT (images per format, default 6400). Results: $WORK/results.jsonl, $WORK/table.md.
set -uo pipefail
stages=${1:-build,setup,decode,ceiling,tally,python,metrics}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/throughput}
n=${COUNT:-6400}
cores=$(nproc)
mkdir -p "$work/out"
results=$work/results.jsonl
log() { echo "== $(date +%T) $*" >&2; }
record() { echo "$1" >> "$results"; echo "$1" >&2; }
build_stage
tests_stage

if has setup; then
  : > "$results"
  log "models"; export_models "$work/models"
  log "datasets"
  make_images "$work/png" "$n" png
  make_images "$work/jpg" "$n" jpeg
  record "{\"kind\":\"dataset\",\"png_kib\":$(du -k "$work/png/images" | tail -1 | cut -f1),\"jpg_kib\":$(du -k "$work/jpg/images" | tail -1 | cut -f1),\"images\":$n}"
fi

if has decode; then
  for fmt in png jpg; do
    for t in 1 "$cores"; do
      out=$("$bin/tally-bench-cpu" --mode decode --manifest "$work/$fmt/manifest.csv" --threads "$t" --seconds 4)
      rate=$(echo "$out" | sed -E 's/.* ([0-9.]+) images\/s.*/\1/')
      record "{\"kind\":\"decode\",\"format\":\"$fmt\",\"threads\":$t,\"images_per_second\":$rate}"
    done
  done
fi

if has ceiling; then
  for spec in "lraspp fp32" "deeplabv3 fp32" "deeplabv3 bf16"; do
    set -- $spec
    log "ceiling $1 $2"
    r=$($py bench/gpu/tools/ceiling.py "$work/models/$1.pt" --precision "$2")
    record "{\"kind\":\"ceiling\",\"model\":\"$1\",\"precision\":\"$2\",\"result\":$r}"
    log "eager ceiling $1 $2"; $py bench/gpu/tools/eager_ceiling.py --arch "$1" --precision "$2" 2>&1 | tail -1
  done
fi

tally_run() {  # name model dataset precision metrics [extra...]
  local name=$1 model=$2 data=$3 precision=$4 metrics=$5; shift 5
  log "tally $name"
  local t0; t0=$(date +%s.%N)
  "$bin/tally" run --model "$work/models/$model.pt" --manifest "$work/$data/manifest.csv" --out "$work/out/$name" \
    --gpus all --precision "$precision" --metrics "$metrics" --batch-size 32 "$@" > "$work/out/$name.log" 2>&1 || {
      tail -20 "$work/out/$name.log"; return 1; }
  $py - "$work/out/$name/report.json" "$name" "$model" "$data" "$precision" "$metrics" "$t0" <<'PY' >> "$results"
import json, sys
r = json.load(open(sys.argv[1]))
t0 = float(sys.argv[7])
w = r["workers"]
print(json.dumps({"kind": "tally", "name": sys.argv[2], "model": sys.argv[3], "format": sys.argv[4],
                  "precision": sys.argv[5], "metrics": sys.argv[6], "gpus": len(w),
                  "images": r["images_evaluated"], "failed": r["images_failed"],
                  "steady_images_per_second": sum(x["images_per_second"] for x in w),
                  "wall_images_per_second": r["images_per_second"], "wall_seconds": r["wall_seconds"],
                  "first_batch_seconds_from_run": [x["first_batch_seconds"] + r["created_unix"] - t0 for x in w],
                  "peak_memory_gib": [x["peak_memory_bytes"] / 2**30 for x in w],
                  "gpu": [x["gpu_name"] for x in w], "batch_size": [x["batch_size"] for x in w],
                  "oom_retries": [x["oom_retries"] for x in w],
                  "dice": [c["dice_mean"] for c in r["classes"]]}))
PY
  tail -1 "$results" >&2
}

if has tally; then
  tally_run lraspp_png_fp32 lraspp png fp32 dice
  tally_run lraspp_jpg_fp32 lraspp jpg fp32 dice
  tally_run deeplab_png_fp32 deeplabv3 png fp32 dice
  tally_run deeplab_png_bf16 deeplabv3 png bf16 dice
fi

if has cudnn_benchmark; then
  # cuDNN benchmark mode (off by default: it breaks bit-identical results across processes).
  tally_run lraspp_jpg_fp32_cudnnbench lraspp jpg fp32 dice --worker-flags=--cudnn-benchmark=true
  tally_run deeplab_png_fp32_cudnnbench deeplabv3 png fp32 dice --worker-flags=--cudnn-benchmark=true
fi

if has metrics; then
  tally_run deeplab_png_fp32_all deeplabv3 png fp32 all
  tally_run lraspp_jpg_fp32_all lraspp jpg fp32 all
fi

python_ref() {  # model dataset precision workers pin
  log "python $*"
  r=$($py bench/gpu/tools/python_reference.py "$work/models/$1.pt" "$work/$2/manifest.csv" --precision "$3" \
        --workers "$4" --pin "$5")
  record "{\"kind\":\"python\",\"model\":\"$1\",\"format\":\"$2\",\"result\":$r}"
}

if has python; then
  for data in png jpg; do
    for w in $(printf "%s\n" 8 16 "$cores" | sort -un); do
      for pin in 1 0; do python_ref lraspp "$data" fp32 "$w" "$pin"; done
    done
  done
  for w in $(printf "%s\n" 8 16 | sort -un); do python_ref deeplabv3 png fp32 "$w" 1; done
  python_ref deeplabv3 png bf16 8 1
fi

$py bench/gpu/tools/summarize.py "$results" | tee "$work/table.md"
echo "total: $(( $(date +%s) - t_start )) s"
