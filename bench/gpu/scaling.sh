#!/usr/bin/env bash
# Suite `scaling`: 1, 2 and every GPU of the box. Warm (stage resident): tallyd and one tally-worker
# per GPU already running (tallyd --spawn-workers: CUDA and LibTorch started, the model loaded by a
# first 640-row job), then a 12 800-row LRASPP fp32 job by `tally submit`: each worker's first batch
# after submission, the job's wall (submission to last result) and steady rate (the workers' summed),
# the box's CPU while it ran, each process's CPU by thread name (tools/thread_delta.py) and the GPUs'
# utilisation; every job's per_image.csv compared with the first of its format (any GPU count must
# give the same bytes). Cold (stage cold): `tally run` on 1 and every GPU, starting everything with
# the job. Photograph-like 512x512 PNG and JPEG q90.
#   bench/gpu/run.sh scaling [STAGES]    (build,setup,resident,cold; default all)
# Settings: FORMATS ("png jpeg"), KS (GPU counts, default "1 2 N"), REPS (runs each, 1), MODEL (lraspp
# or deeplabv3, lraspp), PRECISION (fp32), VARIANTS (';'-separated environment assignments for tallyd
# and its workers, each a run of its own; "base" = none, e.g. "base;TALLY_CUDA_GRAPHS=0"), PROFILE=1
# (TALLY_PIPELINE_PROFILE=1 and the workers' profiles printed).
set -uo pipefail
stages=${1:-build,setup,resident,cold}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/scaling}; mkdir -p "$work/out"
build_stage
tests_stage
model=${MODEL:-lraspp}; precision=${PRECISION:-fp32}
cores=$(nproc)
echo "gpus: $gpus; cores: $cores; numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
echo "cpu0's siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null); $(lscpu 2>/dev/null | grep -E '^(Model name|Thread|Core|Socket)' | tr -s ' ' | paste -sd';')"
if has setup; then
  export_models "$work/models"
  for f in ${FORMATS:-png jpeg}; do
    make_images "$work/$f" 12800 $f
    head -641 "$work/$f/manifest.csv" > "$work/$f/warm.csv"
  done
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
if has resident; then
  IFS=';' read -ra variants <<< "${VARIANTS:-base}"
  for fmt in ${FORMATS:-png jpeg}; do
    for k in ${KS:-1 2 $gpus}; do
      for variant in "${variants[@]}"; do
      for rep in $(seq ${REPS:-1}); do
      env_args=(); [ "$variant" != base ] && read -ra env_args <<< "$variant"
      [ -n "${PROFILE:-}" ] && env_args+=(TALLY_PIPELINE_PROFILE=1)
      tag=${fmt}_$k; [ "$variant" != base ] && tag=${tag}_$(echo "$variant" | tr -c 'A-Za-z0-9\n' _)
      port=$((50900 + k)); state=$work/state_$tag; rm -rf $state
      # tallyd starts and supervises the workers, each on its share of the cores (as tally run places them).
      env "${env_args[@]}" "$bin/tallyd" --listen 127.0.0.1:$port --state-dir $state --spawn-workers --gpus $(seq -s, 0 $((k - 1))) \
        > $OUT/tallyd_$tag.log 2>&1 &
      tpid=$!
      for _ in $(seq 100); do [ "$(grep -c "tallyd: worker .* registered" $OUT/tallyd_$tag.log)" -ge "$k" ] && break; sleep 0.1; done
      for job in warm measured; do
        manifest=$work/$fmt/manifest.csv; [ $job = warm ] && manifest=$work/$fmt/warm.csv
        id=$("$bin/tally" submit --server 127.0.0.1:$port --model "$work/models/$model.pt" --manifest "$manifest" \
          --precision $precision --metrics dice --batch-size 32 --name $job 2>&1 | tail -1)
        if [ $job = measured ]; then
          $py bench/gpu/tools/thread_delta.py save $work/threads_before "$bin/tallyd" "$bin/tally-worker"
          nvidia-smi --query-gpu=index,utilization.gpu,clocks.sm --format=csv,noheader,nounits -lms 100 > $work/smi 2>/dev/null &
          smi=$!
        fi
        read -r _ u0 n0 s0 i0 w0 q0 sq0 st0 _ < /proc/stat; c0=$(date +%s.%N)
        "$bin/tally" wait --server 127.0.0.1:$port "$id" > /dev/null 2>&1
        read -r _ u1 n1 s1 i1 w1 q1 sq1 st1 _ < /proc/stat; c1=$(date +%s.%N)
        # The box's CPU while the job ran (submission to its end): cores busy, CPU seconds an image.
        if [ $job = measured ]; then
          python3 -c "
busy = (($u1+$n1+$s1+$q1+$sq1+$st1) - ($u0+$n0+$s0+$q0+$sq0+$st0)) / 100.0; wall = $c1 - $c0
print(f'cpu while the job ran ($tag): {busy / wall:.1f} of $cores cores busy over {wall:.2f} s, {busy / 12800 * 1000:.2f} ms of CPU an image')"
          $py bench/gpu/tools/thread_delta.py diff $work/threads_before "$(python3 -c "print($c1 - $c0)")" "$bin/tallyd" "$bin/tally-worker"
          kill $smi 2>/dev/null
          # The GPUs' utilisation (share of 100 ms samples with a kernel running) and SM clocks while it ran.
          python3 - $work/smi <<'PY'
import sys
by = {}
for line in open(sys.argv[1]):
    try:
        i, u, c = (int(x) for x in line.split(","))
    except ValueError:
        continue
    by.setdefault(i, []).append((u, c))
print("  gpus: " + "; ".join(f"{i}: util mean {sum(u for u, _ in v) / len(v):.0f}% median "
      f"{sorted(u for u, _ in v)[len(v) // 2]}%, sm clock {min(c for _, c in v)}-{max(c for _, c in v)} MHz"
      for i, v in sorted(by.items())))
PY
        fi
        "$bin/tally" report --server 127.0.0.1:$port "$id" --out "$work/out/${tag}_$job" > /dev/null 2>&1
        [ $job = measured ] && { summary "$work/out/${tag}_$job" "resident $tag ($variant)" || { echo "job id: $id"; tail -5 $OUT/tallyd_$tag.log; }; }
      done
      kill $tpid 2>/dev/null; wait 2>/dev/null
      [ -n "${PROFILE:-}" ] && grep -rh "pipeline profile\|decode profile" $OUT/tallyd_$tag.log $state 2>/dev/null | tail -$((2 * k)) | cut -c1-400
      done
      done
    done
  done
  # Every measured job of a format against the first one's per_image.csv (GPU counts and variants).
  for fmt in ${FORMATS:-png jpeg}; do
    first=""; same=0; differ=""
    for d in "$work"/out/${fmt}_*_measured; do
      [ -f "$d/per_image.csv" ] || continue
      if [ -z "$first" ]; then first=$d/per_image.csv; continue; fi
      if cmp -s "$first" "$d/per_image.csv"; then same=$((same + 1)); else differ="$differ $(basename "$d")"; fi
    done
    echo "per_image.csv ($fmt): $same jobs identical to $(basename "$(dirname "$first")")${differ:+; DIFFERENT:$differ}"
  done
fi
if has cold; then
  for k in 1 $gpus; do
    s=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((k - 1))) "$bin/tally" run --model "$work/models/$model.pt" --manifest "$work/png/manifest.csv" \
      --out "$work/out/cold_$k" --gpus all --precision $precision --metrics dice --batch-size 32 > "$work/out/cold_$k.log" 2>&1 \
      || { tail -5 "$work/out/cold_$k.log"; continue; }
    e=$(date +%s.%N)
    summary "$work/out/cold_$k" "tally run (cold) png $k GPU(s), command $(python3 -c "print(round($e - $s, 2))") s"
  done
fi
echo "total: $(( $(date +%s) - t_start )) s"
