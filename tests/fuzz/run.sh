#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into BUILD_DIR and runs each for SECONDS on a
# copy of its seed corpus (tests/fuzz/corpus/<target>). Fails if any target finds a crash, a leak
# or a failed check; the input that did it is left in BUILD_DIR/artifacts. Then replays the sequences
# of tests/fuzz/make_sequences.py, each in one process.
#   tests/fuzz/run.sh build/fuzz 20          # what ctest's fuzz.short runs
#   tests/fuzz/run.sh build/fuzz 3600 4      # a long run: an hour per target, 4 jobs each
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR SECONDS [JOBS]}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS [JOBS]}
jobs=${3:-1}
CC=clang CXX=clang++ cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
mkdir -p "$build/artifacts"
status=0
# Two targets at a time (each on one core, its own seconds): the short run takes half the wall time
# and fuzzes each target as long. FUZZ_PARALLEL sets how many. Each target runs in a folder of its
# own, where libFuzzer writes its fuzz-N.log files.
parallel=${FUZZ_PARALLEL:-2}
fuzz_one() {  # TARGET: runs it, prints its line; exit 1 on a finding
  local target=$1 work="$build/corpus/$1" log="$build/$1.log" here="$build/jobs/$1"
  rm -rf "$here"
  mkdir -p "$work" "$here"
  # New inputs go to the work folder; the repository's seeds are only read.
  if ! (cd "$here" && "$build/${target}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -jobs="$jobs" \
       -workers="$jobs" -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
       "$work" "$src/corpus/$target" >"$log" 2>&1); then
    echo "fuzz $target: FAILED (see $log and $here)"; tail -30 "$log"; tail -30 "$here"/fuzz-*.log 2>/dev/null; return 1
  fi
  local runs
  runs=$(grep -h "stat::number_of_executed_units" "$log" "$here"/fuzz-*.log 2>/dev/null | awk '{s+=$2} END {print s+0}')
  echo "fuzz $target: ${runs} executions in ${seconds} s, corpus $(ls "$work" | wc -l) + $(ls "$src/corpus/$target" | wc -l) seeds, no crash"
}
running=0
for target in manifest png_fast png_libpng image report_strings coco_json dashboard nifti tiff webp dicom tar store_entry store_settings \
    package_metadata; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
# Sequences that crashed a target only in that order (tests/fuzz/make_sequences.py), each replayed
# in one process.
rm -rf "$build/sequences"
/usr/bin/python3 "$src/make_sequences.py" "$build/sequences"
for dir in "$build/sequences"/*; do
  target=$(basename "$dir")
  if ! "$build/${target}_fuzz" -rss_limit_mb=2048 "$dir"/* >"$build/$target.sequence.log" 2>&1; then
    echo "fuzz $target: a replayed sequence FAILED (see $build/$target.sequence.log)"; tail -30 "$build/$target.sequence.log"
    status=1; continue
  fi
  echo "fuzz $target: sequence of $(ls "$dir" | wc -l) inputs replayed in one process, no crash"
done
exit $status
