#!/usr/bin/env bash
# Issue 45 item 2: where start-up goes as workers are added. LRASPP fp32, batch 32, 12 800 512x512
# photograph-like PNGs (tally-make-dataset --noise 4); `tally run` with 1, 2 and every GPU, twice
# each on the warm machine. Each worker's log lines (exec -> main, CUDA ready, registered, model
# loaded) and the report's first batch are put on one time line, from the job's submission.
#   OUT=/tmp/logs bash bench/gpu/issue45_startup.sh [STAGES]   (build,setup,startup)
set -uo pipefail
stages=${1:-build,setup,startup}
source "$(dirname "$0")/lib.sh"
work=/tmp/i45s; mkdir -p "$work/out"
build_stage
bin=$src/build-gpu/bin
gpus=$(nvidia-smi -L | wc -l)
echo "gpus: $gpus; cores: $(nproc)"
if has setup; then
  python3 bench/gpu/export_models.py "$work/models" > $OUT/export.log 2>&1 || tail -5 $OUT/export.log
  "$bin/tally-make-dataset" --out "$work/png" --count 12800 --size 512 --format png --noise 4 > /dev/null
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
if has startup; then
  for rep in 1 2; do
    for k in 1 2 $gpus; do
      name=startup_${k}_$rep
      s=$(date +%s.%N)
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((k - 1))) "$bin/tally" run --model "$work/models/lraspp.pt" \
        --manifest "$work/png/manifest.csv" --out "$work/out/$name" --gpus all --precision fp32 --metrics dice \
        --batch-size 32 > "$work/out/$name.log" 2>&1 || { tail -5 "$work/out/$name.log"; continue; }
      e=$(date +%s.%N)
      mkdir -p $OUT/$name && cp "$work/out/$name"/.tally/*.log "$work/out/$name/report.json" $OUT/$name/
      python3 bench/gpu/startup_timeline.py "$work/out/$name" "$(python3 -c "print($e - $s)")" | tee -a $OUT/timeline.txt
    done
  done
fi
echo "total: $(( $(date +%s) - t_start )) s"
