#!/usr/bin/env bash
# Suite `coco`: the whole `tally run --coco ... --coco-results ...` command, from process start to the
# report, on tally-make-coco's COCO-val2017-sized set (5000 images, 100 detections each, compressed
# RLE: 144 MB of results) on every core and on one core (taskset -c 0, as in a one-CPU container), with
# the peak RSS of tallyd and of each worker; against the real pycocotools on the same set and box
# (stage anchor: COCO + loadRes + evaluate + accumulate + summarize, segm, built from its source in
# COCOAPI=DIR, default .gpu/cocoapi: tools/pycocotools_anchor.sh), free and on one core. The 12
# numbers must equal pycocotools' in every run.
#   bench/gpu/run.sh coco [STAGES]    (build,setup,run,anchor; default all)
# Settings: IMAGES (5000) and DETECTIONS (100 an image), SHAPES=realistic (polygon references,
# fragmented detections), REPS (3), ANCHOR_CPUS (pycocotools' CPU lists, ';'-separated, "" for every
# core; default every core, then core 0), CPUS (the CPU sets,
# ';'-separated; default every core, then core 0), THREADS=1 (each run's CPU seconds per process and
# thread, tools/thread_cpu.py, and its timeline), RUN_FLAGS (more flags for tally run), BIN (other binaries).
set -uo pipefail
stages=${1:-build,setup,run,anchor}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/coco}/${SHAPES:-simple}-${IMAGES:-5000}x${DETECTIONS:-100}; mkdir -p "$work"
build_stage
tests_stage
echo "cores: $(nproc); binaries: $bin"
if has setup; then
  "$bin/tally-make-coco" --out "$work/set" --images ${IMAGES:-5000} --detections ${DETECTIONS:-100} --shapes ${SHAPES:-simple} > /dev/null
  mkdir -p "$work/img"
  ls -la "$work/set"
fi
peak() {  # pattern: the largest VmHWM (MB) among running processes matching it, sampled until none
  local best=0
  while pgrep -f "$1" > /dev/null; do
    for p in $(pgrep -f "$1"); do
      v=$(awk '/VmHWM/ {print int($2/1024)}' /proc/$p/status 2>/dev/null); [ -n "$v" ] && [ "$v" -gt "$best" ] && best=$v
    done
    sleep 0.05
  done
  echo $best
}
if has run; then
  IFS=';' read -ra cpusets <<< "${CPUS:-;taskset -c 0}"
  for cpu in "${cpusets[@]}"; do
    for rep in $(seq ${REPS:-3}); do
      rm -rf "$work/out"
      s=$(date +%s.%N)
      $cpu "$bin/tally" run --coco "$work/set/gt.json" --images "$work/img" --coco-results "$work/set/results.json" \
        --out "$work/out" ${RUN_FLAGS:-} > "$work/run.log" 2>&1 &
      pid=$!
      [ -n "${THREADS:-}" ] && $py bench/gpu/tools/thread_cpu.py "$bin/tallyd" "$bin/tally-worker" > "$work/threads" &
      sleep 0.2
      peak "$bin/tallyd" > "$work/peak_tallyd" & peak "$bin/tally-worker" > "$work/peak_worker" &
      wait $pid; rc=$?
      e=$(date +%s.%N)
      wait
      grep -h "read in" "$work/out/.tally/tallyd.log" | cut -c12- || true
      if [ -n "${THREADS:-}" ]; then  # the timeline: tallyd's and the worker's milestones
        echo "  started $(date -u -d @$s +%T.%3N)"
        grep -h -E "serving on|registered:|submitted|SUCCEEDED|signal" "$work/out/.tally/tallyd.log" | cut -c12-130 | sed 's/^/  /'
        grep -h -E "main reached|scoring" "$work/out/.tally/"worker-*.log | cut -c12-130 | sed 's/^/  /'
        echo "  ended $(date -u -d @$e +%T.%3N)"
      fi
      python3 - "$work/out/report.json" "${cpu:-all cores}" "$(python3 -c "print($e - $s)")" "$(cat $work/peak_tallyd)" \
        "$(cat $work/peak_worker)" "$rc" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["instances"]["stats"]
print(f"{sys.argv[2]}: command {float(sys.argv[3]):.2f} s (rc {sys.argv[6]}), job wall {r['wall_seconds']:.2f} s, "
      f"workers {len(r['workers'])}, peak RSS tallyd {sys.argv[4]} MB, worker {sys.argv[5]} MB, "
      f"AP {s['AP']:.6f} AP50 {s['AP50']:.6f} AR100 {s['AR100']:.6f}")
PY
      [ -n "${THREADS:-}" ] && cat "$work/threads"
    done
  done
fi
if has anchor; then
  IFS=';' read -ra anchor_cpus <<< "${ANCHOR_CPUS-;0}"
  for cpu in "${anchor_cpus[@]}"; do
    echo "pycocotools${cpu:+, cores $cpu}: $(bash bench/gpu/tools/pycocotools_anchor.sh "${COCOAPI:-$src/.gpu/cocoapi}" "$work/set/gt.json" "$work/set/results.json" $cpu)"
  done
fi
echo "total: $(( $(date +%s) - t_start )) s"
