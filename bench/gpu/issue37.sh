#!/usr/bin/env bash
# Issue 37: one worker per GPU on 4 (and 8) GPUs. For 1, 2, ..., N GPUs of this machine
# (CUDA_VISIBLE_DEVICES=0..k-1): LRASPP fp32 on PNG and JPEG, DeepLabV3 fp32 and bf16 on PNG, batch
# 32, cuDNN benchmark off (the default); steady and wall img/s, tallyd's CPU time, and whether
# per_image.csv is identical to one GPU's. Then JPEG with --decode gpu on all GPUs, and the topology.
# Each run also samples tallyd's own CPU time (user+system, /proc/PID/stat) and keeps the workers'
# CPU placement lines. Stage gpudecode: where --decode gpu loses time with several workers (one
# worker alone with 16 threads against all GPUs with 16 and with 4 threads, pipeline profiles kept).
#   OUT=/tmp/logs bash bench/gpu/issue37.sh [IMAGES] [STAGES]
#   (stages: build,setup,scale,bf16,decode,numa,gpudecode,python)
set -uo pipefail
n=${1:-6400}
stages=${2:-build,setup,scale,decode}
source "$(dirname "$0")/lib.sh"
work=/tmp/i37; mkdir -p "$work/out"
build_stage
bin=$src/build-gpu/bin
gpus=$(nvidia-smi -L | wc -l)
echo "gpus: $gpus; cores: $(nproc); $(lscpu | grep -E 'Model name|NUMA node\(s\)' | sed 's/  */ /g' | tr '\n' ';')"
nvidia-smi topo -m > $OUT/topo.txt 2>&1; lscpu > $OUT/lscpu.txt
if has setup; then
  python3 bench/gpu/export_models.py "$work/models" > $OUT/export.log 2>&1 || tail -5 $OUT/export.log
  "$bin/tally-make-dataset" --out "$work/png" --count "$n" --size 512 --format png > /dev/null
  "$bin/tally-make-dataset" --out "$work/jpg" --count "$n" --size 512 --format jpeg --quality 90 > /dev/null
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
results=$OUT/results.jsonl
run() {  # name k model data precision [extra...]
  local name=$1 k=$2 model=$3 data=$4 precision=$5; shift 5
  local visible; visible=$(seq -s, 0 $((k - 1)))
  local t0; t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$visible "$bin/tally" run \
    --model "$work/models/$model.pt" --manifest "$work/$data/manifest.csv" --out "$work/out/$name" --gpus all \
    --precision "$precision" --metrics dice --batch-size 32 "$@" > "$work/out/$name.log" 2>&1 &
  local runner=$! cpu=0 pid=""
  while kill -0 $runner 2> /dev/null; do  # tallyd's utime+stime in clock ticks, last seen alive.
    [ -z "$pid" ] && pid=$(pgrep -f "tallyd --listen 127.0.0.1:.*--state-dir $work/out/$name/" | head -1)
    [ -n "$pid" ] && c=$(awk '{print $14 + $15}' /proc/$pid/stat 2> /dev/null) && [ -n "$c" ] && cpu=$c
    sleep 0.2
  done
  wait $runner || { tail -5 "$work/out/$name.log"; return 1; }
  grep -h "CPUs" "$work/out/$name.log" | head -8 > "$OUT/placement_$name.txt"
  if [ -n "${KEEP_WORKER_LOGS:-}" ]; then mkdir -p "$OUT/logs_$name"; cp "$work/out/$name"/.tally/*.log "$OUT/logs_$name/" 2> /dev/null; fi
  python3 - "$work/out/$name" "$name" "$k" "$t0" "$work/out/${model}_${data}_${precision}_1/per_image.csv" \
    "$cpu" <<'PY' >> $results
import json, os, sys
d, name, k, t0, one = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
tallyd_cpu = float(sys.argv[6]) / os.sysconf("SC_CLK_TCK")
r = json.load(open(d + "/report.json"))
w = r["workers"]
same = None
if os.path.exists(one) and k > 1:
    same = open(one, "rb").read() == open(d + "/per_image.csv", "rb").read()
print(json.dumps({"name": name, "gpus": k, "workers": len(w), "images": r["images_evaluated"],
                  "steady": round(sum(x["images_per_second"] for x in w), 1),
                  "wall": round(r["images_per_second"], 1), "wall_seconds": round(r["wall_seconds"], 2),
                  "per_worker": [round(x["images_per_second"], 1) for x in w],
                  "decode_threads": [x["decode_threads"] for x in w],
                  "first_batch_s": [round(x["first_batch_seconds"], 2) for x in w],
                  "tallyd_cpu_s": round(tallyd_cpu, 2),
                  "tallyd_cpu_us_per_row": round(1e6 * tallyd_cpu / max(1, r["images_evaluated"]), 1),
                  "identical_to_1gpu": same}))
PY
  tail -1 $results
}
if has scale; then
  for k in $(seq 1 $gpus | awk '$1==1||$1==2||$1==4||$1==8'); do
    run lraspp_png_fp32_$k $k lraspp png fp32
    run lraspp_jpg_fp32_$k $k lraspp jpg fp32
    run deeplabv3_png_fp32_$k $k deeplabv3 png fp32
    run deeplabv3_png_bf16_$k $k deeplabv3 png bf16
    echo "scale $k: $(( $(date +%s) - t_start )) s"
  done
  # tallyd's own CPU: the coordinator log's process times are not kept; sample it with the largest run.
fi
if has bf16; then
  # The layout choice must not depend on the GPU count (bf16 results follow the layout).
  run deeplabv3_png_bf16_1 1 deeplabv3 png bf16
  run deeplabv3_png_bf16_$gpus $gpus deeplabv3 png bf16
  for k in 1 $gpus; do
    python3 -c "import json; r=json.load(open('$work/out/deeplabv3_png_bf16_$k/report.json')); print('$k GPUs:', r['channels_last'], r['channels_last_trial'][:100])"
  done
fi
if has decode; then
  run lraspp_jpg_fp32_gpudecode_$gpus $gpus lraspp jpg fp32 --decode gpu
  run lraspp_jpg_fp32_autodecode_$gpus $gpus lraspp jpg fp32 --decode auto
fi
if has numa; then  # The workers' CPUs on their GPUs' NUMA nodes against contiguous ranges (2+ nodes only).
  run lraspp_jpg_fp32_1 1 lraspp jpg fp32
  run lraspp_jpg_fp32_$gpus $gpus lraspp jpg fp32
  if [ "$(lscpu | awk -F: '/NUMA node\(s\)/{print $2+0}')" -gt 1 ]; then
    TALLY_CPU_PLACEMENT=contiguous run lraspp_jpg_fp32_contiguous_$gpus $gpus lraspp jpg fp32
  fi
fi
if has gpudecode; then
  export KEEP_WORKER_LOGS=1 TALLY_PIPELINE_PROFILE=1
  run lraspp_jpg_fp32_gpudec_1w16t 1 lraspp jpg fp32 --decode gpu --worker-threads 16
  run lraspp_jpg_fp32_gpudec_${gpus}w16t $gpus lraspp jpg fp32 --decode gpu --worker-threads 16
  run lraspp_jpg_fp32_gpudec_${gpus}w4t $gpus lraspp jpg fp32 --decode gpu --worker-threads 4
  unset KEEP_WORKER_LOGS TALLY_PIPELINE_PROFILE
fi
if has python; then
  bash bench/gpu/multi_gpu_python.sh $work/mgp 512 > $OUT/python.log 2>&1; tail -4 $OUT/python.log
fi
echo "total: $(( $(date +%s) - t_start )) s"
