#!/usr/bin/env bash
# Suite `first_run`: a network's first run on a machine (`tally run`, one GPU, 3200 photograph-like
# PNGs, batch 32): the command's wall, the job's, the first results after the command started, and
# the memory layout the job ran in with the trial's own words.
#   trial  LRASPP fp32: the first run (a fresh trial cache: a job this short cannot repay the layout
#          trial and skips it) against the next run, REPS times; then the trial forced
#          (TALLY_TEST_TRIAL_COST_SECONDS=0) and the run after it (its kept answer)
#   bf16   DeepLabV3 bf16: default flags with a kept trial, --channels-last off and on, REPS times
#          each; default flags on a fresh cache; the eager model-only ceiling of both layouts
#          (tools/eager_ceiling.py)
#   tests  the GPU tests (lib.sh tests_stage)
#   bench/gpu/run.sh first_run [STAGES]    (build,tests,trial,bf16; default build,trial,bf16)
set -uo pipefail
stages=${1:-build,trial,bf16}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/first_run}; mkdir -p "$work/out"
build_stage
tests_stage
export_models "$work/models"
make_images "$work/png" 3200 png
# run LABEL CACHE MODEL [FLAGS...]: one `tally run` (XDG_CACHE_HOME=CACHE), its command wall, the
# report's wall and steady rates, the first batch's results after the command started, the layout
# and the trial's text.
run() {
  local label=$1 cache=$2 model=$3; shift 3
  local out=$work/out/$label; rm -rf $out
  local t0=$(date +%s.%N)
  XDG_CACHE_HOME=$cache $bin/tally run --out $out --gpus 0 --batch-size 32 --model $work/models/$model.pt \
    --manifest $work/png/manifest.csv "$@" > $out.log 2>&1 || tail -3 $out.log
  local t1=$(date +%s.%N)
  $py - $out $label $t0 $t1 <<'PY'
import json, sys
out, label, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(out + '/report.json')); w = r['workers'][0]
first = r['created_unix'] + w['first_batch_seconds'] - t0 if w['first_batch_seconds'] else -1
print(f"{label}: command wall {t1 - t0:.2f} s, job wall {r['wall_seconds']:.2f} s ({r['images_per_second']:.0f} img/s), "
      f"steady {w['images_per_second']:.0f} img/s, first batch {first:.2f} s after start, layout {r['channels_last']}: "
      f"{r['channels_last_trial'][:170]}")
PY
}
if has trial; then
  echo "== trial: LRASPP fp32, 3200 PNGs"
  for k in $(seq 1 ${REPS:-3}); do
    c=$work/cache-lr-$k; rm -rf $c
    run lr-first-$k $c lraspp
    run lr-next-$k $c lraspp
  done
  grep -h "layout trial skipped" $work/out/lr-first-1/.tally/worker-0.log | cut -c1-300
  for k in 1 2; do
    c=$work/cache-lr-forced-$k; rm -rf $c
    TALLY_TEST_TRIAL_COST_SECONDS=0 run lr-forced-first-$k $c lraspp
    run lr-forced-next-$k $c lraspp
  done
  echo "trial done at $(( $(date +%s) - t_start )) s"
fi
if has bf16; then
  echo "== bf16: DeepLabV3 bf16, 3200 PNGs"
  c=$work/cache-dl; rm -rf $c
  TALLY_TEST_TRIAL_COST_SECONDS=0 run dl-forced-first $c deeplabv3 --precision bf16
  for k in $(seq 1 ${REPS:-3}); do
    run dl-default-kept-$k $c deeplabv3 --precision bf16
    run dl-off-$k $c deeplabv3 --precision bf16 --channels-last off
    run dl-on-$k $c deeplabv3 --precision bf16 --channels-last on
  done
  rm -rf $work/cache-dl-fresh
  run dl-default-fresh $work/cache-dl-fresh deeplabv3 --precision bf16
  for k in 1 2; do $py bench/gpu/tools/eager_ceiling.py --arch deeplabv3 --precision bf16 --layouts 2>&1 | grep -v Warning | tail -8; done
  echo "bf16 done at $(( $(date +%s) - t_start )) s"
fi
echo "total: $(( $(date +%s) - t_start )) s"
