#!/usr/bin/env bash
# CPU end-to-end throughput of `tally run` with --metrics dice and --metrics all (issue: the full
# metric suite must cost at most 10% of the throughput), plus the single-core metric stage costs.
#   bench/cpu_throughput.sh [WORK_DIR] [IMAGES]
# Uses Debian's python3-torchvision (0.14) to export LRASPP-MobileNetV3 with random weights.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/tally-cpu-bench}
n=${2:-200}
bin=$src/build/bin
[ -x "$bin/tally" ] || "$src/scripts/build.sh"
mkdir -p "$work"
/usr/bin/python3 -c "import torchvision" 2>/dev/null || {
  echo "needs python3-torchvision: apt-get install python3-torchvision" >&2; exit 1; }
[ -f "$work/models/lraspp.pt" ] || /usr/bin/python3 "$src/bench/gpu/tools/export_models.py" "$work/models" lraspp
[ -f "$work/png/manifest.csv" ] || "$bin/tally-make-dataset" --out "$work/png" --count "$n" --size 512 --format png
"$bin/tally-bench-cpu" --mode metrics --iters 20
"$bin/tally-bench-cpu" --mode decode --manifest "$work/png/manifest.csv" --threads "$(nproc)" --seconds 4
for run in dice all dice2 all2; do
  metrics=${run%2}
  "$bin/tally" run --model "$work/models/lraspp.pt" --manifest "$work/png/manifest.csv" --out "$work/out_$run" \
    --workers 1 --metrics "$metrics" > "$work/out_$run.log" 2>&1
  /usr/bin/python3 -c "import json,sys; r=json.load(open('$work/out_$run/report.json')); w=r['workers'][0]; print(f'--metrics $metrics: {w[\"images_per_second\"]:.2f} img/s steady, {r[\"images_per_second\"]:.2f} img/s wall, {r[\"images_evaluated\"]} images')"
done
