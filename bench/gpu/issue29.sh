#!/usr/bin/env bash
# Issue 29 on a GPU box: the restructured build against the build before it (an archive of that
# commit's tree in OLD_TAR), on the same machine.
#   build   both builds (in parallel, half the cores each)
#   tests   the GPU tests of this build: gpu_jpeg_test, surface_kernel_test, ModelRunnerTest.*, test_gpu.py
#   ab      LRASPP fp32 and DeepLabV3 bf16 on 3200 PNGs, each build in turn, REPS times: steady and wall
#           img/s, and per_image.csv and the report's numbers byte-compared between the builds
#   OUT=/tmp/logs OLD_TAR=.gpu/old.tar bash bench/gpu/issue29.sh [STAGES]
set -uo pipefail
stages=${1:-build,tests,ab}
has() { [[ ",$stages," == *",$1,"* ]]; }
t_start=$(date +%s)
src=$PWD; old=/tmp/old-src; work=/tmp/i29; mkdir -p "$work/out"
export DEB_DIR=$src/.gpu/debs XDG_CACHE_HOME=$work/cache
if has build; then
  rm -rf "$old"; mkdir -p "$old"; tar -xf "${OLD_TAR:-.gpu/old.tar}" -C "$old"
  half=$(( $(nproc) / 2 ))
  ( CMAKE_BUILD_PARALLEL_LEVEL=$half scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1; echo "new rc=$?" ) &
  ( cd "$old" && sed -i "s/-j \"\$(nproc)\"/-j $half/" scripts/gpu/build.sh && \
    scripts/gpu/build.sh "$old/build-gpu" > $OUT/build-old.log 2>&1; echo "old rc=$?" ) &
  wait
  grep -E "error" $OUT/build.log | head -20
  grep -E "Tally: (CUDA|JPEG)" $OUT/build.log
  echo "build: $(( $(date +%s) - t_start )) s"
fi
bin=$src/build-gpu/bin; obin=$old/build-gpu/bin
export TALLY_BIN=$bin TALLY_SOURCE=$src PYTHONPATH=$src/python:$src/build-gpu/python
if has tests; then
  (timeout 120 $bin/gpu_jpeg_test; timeout 120 $bin/surface_kernel_test; timeout 120 $bin/worker_test --gtest_filter="ModelRunnerTest.*") > $OUT/unit.log 2>&1
  grep -E "PASSED|FAILED|SKIPPED" $OUT/unit.log
  (cd tests/integration && timeout 420 python3 -m unittest -v ${GPU_TESTS:-test_gpu} > $OUT/gputest.log 2>&1)
  grep -E "ok$|FAIL|ERROR|Error:|Ran|OK|skip" $OUT/gputest.log | tail -25
  echo "tests done at $(( $(date +%s) - t_start )) s"
fi
if has ab; then
  [ -f $work/models/deeplabv3.pt ] || python3 bench/gpu/export_models.py $work/models > /dev/null 2>&1
  [ -f $work/png/manifest.csv ] || $bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png > /dev/null 2>&1
  run() {  # label bin model precision layout
    local out=$work/out/$1; rm -rf $out
    $2/tally run --out $out --gpus 0 --batch-size 32 --model $work/models/$3.pt --manifest $work/png/manifest.csv \
      --precision $4 --channels-last $5 > $out.log 2>&1 || tail -3 $out.log
    python3 -c "
import json; r = json.load(open('$out/report.json')); w = r['workers'][0]
print('$1: steady %.0f wall %.0f layout %s' % (w['images_per_second'], r['images_per_second'], r['channels_last']))"
  }
  for rep in $(seq 1 ${REPS:-2}); do
    for spec in "lraspp fp32 off" "deeplabv3 bf16 on"; do
      set -- $spec
      run new-$1-$rep $bin $1 $2 $3
      run old-$1-$rep $obin $1 $2 $3
      cmp -s $work/out/new-$1-$rep/per_image.csv $work/out/old-$1-$rep/per_image.csv && echo "  per_image.csv identical" || echo "  per_image.csv DIFFERS"
      python3 $src/tests/tools/report_snapshot.py --compare $work/out/new-$1-$rep $work/out/old-$1-$rep
    done
  done
  echo "ab done at $(( $(date +%s) - t_start )) s"
fi
