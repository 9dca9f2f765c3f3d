#!/usr/bin/env bash
# Issue 35 on a GPU box (items 8 and 9), the stages named (comma list; default all):
#   build    scripts/gpu/build.sh build-gpu
#   tests    the GPU tests: gpu_jpeg_test, surface_kernel_test, ModelRunnerTest.*, test_gpu.py
#   trial    LRASPP fp32, 3200 PNGs, batch 32, default flags: a network's first run (fresh trial
#            cache: the trial cannot repay itself and is skipped) against the next run, REPS times;
#            then the trial forced (TALLY_TEST_TRIAL_COST_SECONDS=0: what every first run did
#            before) and the run after it (its kept trial)
#   bf16     DeepLabV3 bf16, 3200 PNGs, batch 32: default flags with a kept trial (made first by a
#            forced trial), --channels-last off and on, REPS times each; default flags on a fresh
#            cache (skipped); the eager model-only ceiling of both layouts (bench/gpu/eager_ceiling.py)
#   volumes  bench/volume_bench.py, 5 runs of each configuration (min/median/max), no MONAI paths
#   OUT=/tmp/logs REPS=3 bash bench/gpu/issue35.sh [STAGES]
set -uo pipefail
stages=${1:-build,tests,trial,bf16,volumes}
source "$(dirname "$0")/lib.sh"
work=/tmp/i35; mkdir -p "$work/out"
build_stage
has build && grep -E "Tally: (CUDA|JPEG)" $OUT/build.log
bin=$src/build-gpu/bin
export TALLY_BIN=$bin TALLY_SOURCE=$src PYTHONPATH=$src/python:$src/build-gpu/python
if has tests; then
  (timeout 120 $bin/gpu_jpeg_test; timeout 120 $bin/surface_kernel_test; timeout 120 $bin/worker_test --gtest_filter="ModelRunnerTest.*") > $OUT/unit.log 2>&1
  grep -E "PASSED|FAILED|SKIPPED" $OUT/unit.log
  (cd tests/integration && timeout 420 python3 -m unittest -v ${GPU_TESTS:-test_gpu} > $OUT/gputest.log 2>&1)
  grep -E "ok$|FAIL|ERROR|Error:|Ran|OK|skip" $OUT/gputest.log | tail -25
  echo "tests done at $(( $(date +%s) - t_start )) s"
fi
[ -f $work/models/deeplabv3.pt ] || python3 bench/gpu/export_models.py $work/models > /dev/null 2>&1
[ -f $work/png/manifest.csv ] || $bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png > /dev/null 2>&1
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
  python3 - $out $label $t0 $t1 <<'PY'
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
  for k in 1 2; do python3 bench/gpu/eager_ceiling.py --arch deeplabv3 --precision bf16 --layouts 2>&1 | grep -v Warning | tail -8; done
  echo "bf16 done at $(( $(date +%s) - t_start )) s"
fi
if has volumes; then
  echo "== volumes"
  nproc
  python3 bench/volume_bench.py --bin $bin --work $work/vb --sizes ${VOLUME_SIZES:-160x192x160:16,512x512x300:4} \
    --workers ${VOLUME_WORKERS:-1,4,16} --monai-volumes 0 --repeats 5 2> $OUT/volumes.err
  echo "volumes done at $(( $(date +%s) - t_start )) s"
fi
