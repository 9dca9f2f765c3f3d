#!/usr/bin/env bash
# Issue 45 items 1-2, a first probe: where four GPUs lose time on photograph-like PNGs. LRASPP fp32,
# batch 32, 512x512 PNGs of tally-make-dataset --noise 4. (a) 4 GPUs with 8..24 decode threads per
# worker (--worker-threads): if more threads than cores per GPU still help, the CPU is not the
# limit; (b) first batch and wall for 1, 2 and 4 GPUs on 12 800 rows (start-up against workers).
#   OUT=/tmp/logs bash bench/gpu/issue45_probe.sh [STAGES]   (build,setup,threads,startup)
set -uo pipefail
stages=${1:-build,setup,threads,startup}
source "$(dirname "$0")/lib.sh"
work=/tmp/i45; mkdir -p "$work/out"
build_stage
bin=$src/build-gpu/bin
gpus=$(nvidia-smi -L | wc -l)
echo "gpus: $gpus; cores: $(nproc)"
if has setup; then
  python3 bench/gpu/export_models.py "$work/models" > $OUT/export.log 2>&1 || tail -5 $OUT/export.log
  "$bin/tally-make-dataset" --out "$work/png" --count 12800 --size 512 --format png --noise 4 > /dev/null
  head -6401 "$work/png/manifest.csv" > "$work/png/half.csv"
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
results=$OUT/results45.jsonl
run() {  # name k manifest [extra...]
  local name=$1 k=$2 manifest=$3; shift 3
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((k - 1))) "$bin/tally" run --model "$work/models/lraspp.pt" --manifest "$manifest" \
    --out "$work/out/$name" --gpus all --precision fp32 --metrics dice --batch-size 32 "$@" > "$work/out/$name.log" 2>&1 \
    || { tail -5 "$work/out/$name.log"; return 1; }
  python3 - "$work/out/$name" "$name" "$k" <<'PY' >> $results
import json, sys
d, name, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(d + "/report.json"))
w = r["workers"]
print(json.dumps({"name": name, "gpus": k, "images": r["images_evaluated"],
                  "steady": round(sum(x["images_per_second"] for x in w), 1), "wall_seconds": round(r["wall_seconds"], 2),
                  "decode_threads": [x["decode_threads"] for x in w],
                  "first_batch_s": [round(x["first_batch_seconds"], 2) for x in w]}))
PY
  tail -1 $results
}
if has threads; then
  for t in 8 12 16 20 24; do run png4_t$t $gpus "$work/png/half.csv" --worker-threads $t; done
  run png1_t16 1 "$work/png/half.csv" --worker-threads 16
  run png1_t64 1 "$work/png/half.csv"
fi
if has startup; then
  for k in 1 2 $gpus; do run startup_$k $k "$work/png/manifest.csv"; done
fi
echo "total: $(( $(date +%s) - t_start )) s"
