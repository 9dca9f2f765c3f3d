#!/usr/bin/env bash
# `tally rescore` on this machine's CPU (docs/prediction-store.md "Rescoring"): COUNT photograph-like
# 512x512 PNGs (tally-make-dataset --noise 4) are predicted once by tests/fixtures/three_class.pt
# (per-pixel logits of the noisy colours: speckled three-class maps, the hardest for DEFLATE) into a
# prediction store, then rescored from the store alone with other metrics; the model's own run with
# those metrics is the reference (per_image.csv must be the same bytes). Each run's rows/s (wall, from
# its first row leased) and the store's bytes a row.
#   bench/store_rescore.sh [WORK_DIR] [COUNT] [WORKERS]      (DATA=DIR: an existing dataset of COUNT rows)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/tally-store-bench}
n=${2:-32000}
workers=${3:-2}
bin=$src/build/bin
data=${DATA:-$work/png}
[ -x "$bin/tally" ] || "$src/scripts/build.sh"
mkdir -p "$work"
[ -f "$data/manifest.csv" ] || "$bin/tally-make-dataset" --out "$data" --count "$n" --size 512 --format png --noise 4 > /dev/null
model=$src/tests/fixtures/three_class.pt
rm -rf "$work/store" "$work/out_"*
step() {  # LABEL tally-args...
  local label=$1; shift
  local t0; t0=$(date +%s.%N)
  "$bin/tally" "$@" --out "$work/out_$label" --max-failed-fraction 1 > "$work/$label.log" 2>&1 || tail -5 "$work/$label.log"
  local t1; t1=$(date +%s.%N)
  /usr/bin/python3 - "$work/out_$label/report.json" "$label" "$t0" "$t1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
total = float(sys.argv[4]) - float(sys.argv[3])
print(json.dumps({"run": sys.argv[2], "rows": r["images_evaluated"], "failed": r["images_failed"],
                  "from_store": r["rows_from_store"], "rows_per_s": round(r["images_per_second"], 1),
                  "command_s": round(total, 1), "rows_per_s_command": round(r["images_evaluated"] / total, 1)}))
PY
}
step store run --model "$model" --manifest "$data/manifest.csv" --workers "$workers" --metrics dice \
  --prediction-store "$work/store"
step rescore rescore --from-store "$work/store" --model "$model" --manifest "$data/manifest.csv" --workers "$workers" \
  --metrics dice,iou,precision,recall --ignore-index none
step model run --model "$model" --manifest "$data/manifest.csv" --workers "$workers" \
  --metrics dice,iou,precision,recall --ignore-index none
if cmp -s "$work/out_rescore/per_image.csv" "$work/out_model/per_image.csv"; then same=yes; else same=NO; fi
echo "rescore per_image.csv equals the model's run: $same"
echo "store bytes a row: $(( $(du -sb "$work/store" | cut -f1) / n )) (entries and folders, du -sb)"
