#!/usr/bin/env bash
# Suite `follow`: following training on one GPU. Six LRASPP fp32 checkpoints where half are clearly
# worse (steps 600, 400, 200: a briefly trained network, tools/train_lraspp.py; steps 500, 300, 100:
# the same network with random weights), all in the folder at the start, evaluated newest first
# (--catch-up all) by `tally run --follow` over COUNT photograph-like 512x512 PNGs: with the race
# (worse checkpoints stopped once decided) against without; then one checkpoint dropped into a
# running follow, for the lag from its landing to its curve point.
#   bench/gpu/run.sh follow [STAGES]    (build,race,lag; default all)
# Settings: COUNT (images, default 3200), SETTLE (seconds, default 5).
set -uo pipefail
stages=${1:-build,race,lag}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/follow}; mkdir -p "$work"
n=${COUNT:-3200}
settle=${SETTLE:-5}
build_stage
make_images "$work/png" "$n" png
export_models "$work/models" lraspp
[ -f "$work/trained.pt" ] || { $py bench/gpu/tools/train_lraspp.py "$work/png" "$work/trained.pt" > "$OUT/train.log" 2>&1; tail -1 "$OUT/train.log"; }
results=$work/follow.jsonl
: > "$results"

checkpoints() {  # DIR: the six checkpoints, good at the newest steps
  rm -rf "$1"; mkdir -p "$1"
  for s in 600 400 200; do cp "$work/trained.pt" "$1/ckpt-$s.pt"; done
  for s in 500 300 100; do cp "$work/models/lraspp.pt" "$1/ckpt-$s.pt"; done
}

summarize() {  # OUT_DIR LABEL START (unix seconds)
  $py - "$1" "$2" "$3" <<'PY' >> "$results"
import csv, json, sys, time
out, label, seconds = sys.argv[1], sys.argv[2], time.time() - float(sys.argv[3])
rows = list(csv.DictReader(open(out + "/curve.csv")))
points = json.load(open(out + "/curve.json"))["points"]
print(json.dumps({"run": label, "wall_s": round(seconds, 1), "rows_evaluated": sum(int(r["rows"]) for r in rows),
                  "decisions": {r["step"]: [r["decision"], int(r["rows"]), int(r["race_rows"])] for r in rows},
                  "lag_s": {p["step"]: round(p["decided_unix"] - p["landed_unix"], 2) for p in points}}))
PY
  tail -1 "$results" >&2
}

if has race; then
  for race in on off; do
    checkpoints "$work/ckpt_$race"
    t0=$EPOCHREALTIME
    "$bin/tally" run --follow "$work/ckpt_$race" --manifest "$work/png/manifest.csv" --out "$work/out_$race" --gpus all \
      --batch-size 32 --metrics dice --settle 0 --catch-up all --until-step 600 --race "$race" > "$OUT/follow_$race.log" 2>&1 \
      || tail -20 "$OUT/follow_$race.log"
    summarize "$work/out_$race" "race_$race" "$t0"
  done
fi
if has lag; then
  # A follow already running (tallyd, worker and model warm after its first checkpoint), then one more lands.
  rm -rf "$work/ckpt_lag"; mkdir -p "$work/ckpt_lag"
  cp "$work/trained.pt" "$work/ckpt_lag/ckpt-100.pt"
  ( sleep 40; cp "$work/trained.pt" "$work/ckpt_lag/.tmp" && mv "$work/ckpt_lag/.tmp" "$work/ckpt_lag/ckpt-200.pt" ) &
  t0=$EPOCHREALTIME
  "$bin/tally" run --follow "$work/ckpt_lag" --manifest "$work/png/manifest.csv" --out "$work/out_lag" --gpus all \
    --batch-size 32 --metrics dice --settle "$settle" --until-step 200 --race off > "$OUT/follow_lag.log" 2>&1 \
    || tail -20 "$OUT/follow_lag.log"
  wait
  summarize "$work/out_lag" "lag_settle_$settle" "$t0"
fi
cp "$results" "$OUT/" 2>/dev/null || true
