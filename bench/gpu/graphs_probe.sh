#!/usr/bin/env bash
# CUDA graphs of a launch (worker/torch/torch_runner_graph.cc) on one GPU: `tally run` of LRASPP (and
# DeepLabV3) fp32 batch 32 on photograph-like PNGs with graphs on (the default; TALLY_CUDA_GRAPHS=1
# says so) and off, each job's per_image.csv compared with its graphs-off twin, the wall, the steady
# rate, the CPU seconds of the command and its children and the pipeline's profile (ms a batch).
#   OUT=/tmp/logs [COUNT=3200] [REPS=2] bash bench/gpu/graphs_probe.sh [STAGES]   (build,setup,speed,options,limits,deeplab)
set -uo pipefail
stages=${1:-build,setup,speed,options}
source "$(dirname "$0")/lib.sh"
work=/tmp/gp; mkdir -p "$work/out"
build_stage
bin=$src/build-gpu/bin
if has setup; then
  python3 bench/gpu/export_models.py "$work/models" lraspp $(has deeplab && echo deeplabv3) > $OUT/export.log 2>&1 || tail -5 $OUT/export.log
  "$bin/tally-make-dataset" --out "$work/png" --count ${COUNT:-3200} --size 512 --format png --noise 4 > /dev/null
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
run() {  # tag twin_tag model [env...]: EXTRA holds more `tally run` flags
  local tag=$1 twin=$2 model=$3; shift 3
  local s=$(date +%s.%N) rc e
  TIMEFORMAT="cpu: user %U s, sys %S s"
  local cpu
  cpu=$( { time env TALLY_PIPELINE_PROFILE=1 "$@" "$bin/tally" run --model "$work/models/$model.pt" \
    --manifest "$work/png/manifest.csv" --out "$work/out/$tag" --gpus all --precision fp32 --batch-size 32 ${EXTRA:-} \
    > "$OUT/run_$tag.log" 2>&1; } 2>&1 )
  rc=$?; e=$(date +%s.%N)
  echo "== $tag: rc $rc, command $(python3 -c "print(round($e - $s, 2))") s, $cpu"
  cat "$work/out/$tag/.tally/"*.log > "$OUT/worker_$tag.log" 2>/dev/null  # tallyd's and the workers' logs
  grep -hE "CUDA graph|pipeline profile|error|failed" "$OUT/run_$tag.log" "$OUT/worker_$tag.log" | cut -c1-700 | head -8
  [ -f "$work/out/$tag/report.json" ] && python3 -c "
import json; r = json.load(open('$work/out/$tag/report.json')); w = r['workers']
print('images', r['images_evaluated'], 'wall', round(r['wall_seconds'], 3), 'steady', round(sum(x['images_per_second'] for x in w), 1), 'first', [round(x['first_batch_seconds'], 3) for x in w])"
  if [ "$twin" != - ]; then
    cmp -s "$work/out/$twin/per_image.csv" "$work/out/$tag/per_image.csv" && echo "per_image.csv identical to $twin" || echo "per_image.csv DIFFERS from $twin"
  fi
}
if has speed; then
  for rep in $(seq ${REPS:-2}); do
    run off_$rep off_1 lraspp TALLY_CUDA_GRAPHS=0
    run on_$rep off_1 lraspp TALLY_CUDA_GRAPHS=1
  done
fi
if has options; then
  # Predictions saved (labels to the host), and a job without surface distances (the default
  # metrics of the speed stage have them: hd95).
  EXTRA="--save-predictions $work/out/PRED" run pred_off - lraspp TALLY_CUDA_GRAPHS=0
  mv "$work/out/PRED" "$work/out/pred_off/pred" 2>/dev/null
  EXTRA="--save-predictions $work/out/PRED" run pred_on pred_off lraspp TALLY_CUDA_GRAPHS=1
  mv "$work/out/PRED" "$work/out/pred_on/pred" 2>/dev/null
  diff -rq "$work/out/pred_off/pred" "$work/out/pred_on/pred" > /dev/null && echo "saved predictions identical, graphs on and off ($(ls "$work/out/pred_on/pred" | wc -l) files)" || echo "saved predictions DIFFER"
  EXTRA="--metrics dice,iou" run plain_off - lraspp TALLY_CUDA_GRAPHS=0
  EXTRA="--metrics dice,iou" run plain_on plain_off lraspp TALLY_CUDA_GRAPHS=1
fi
if has limits; then
  # A memory limit the eager batch fits under and the graphs' pool may not: the capture fails or
  # fits, the job goes on either way with the same values.
  for gib in ${LIMITS:-3 6}; do
    EXTRA="--worker-flags=--gpu-memory-limit-gib=$gib" run limit_$gib off_1 lraspp TALLY_CUDA_GRAPHS=1
    grep -hE "batch|memory" "$OUT/worker_limit_$gib.log" | cut -c1-300 | head -4
  done
fi
if has deeplab; then
  run dl_off - deeplabv3 TALLY_CUDA_GRAPHS=0
  run dl_on dl_off deeplabv3 TALLY_CUDA_GRAPHS=1
fi
echo "total: $(( $(date +%s) - t_start )) s"
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)  # One file back: the device returns only a few.
