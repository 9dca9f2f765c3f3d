#!/usr/bin/env bash
# Suite `calibration`: what --metrics calibration costs on one GPU (docs/metrics.md "Calibration").
# COUNT photograph-like 512x512 PNGs through LRASPP fp32 (2 classes, tools/export_models.py) and an
# LRASPP of 21 classes (VOC's count, random weights): without calibration, then with it, alternated
# twice; each run's steady rate, whether the scores equal the run without, and the calibration figures.
# Stage `check`: the same small job on the CPU and the GPU (the probabilities differ in their last
# bits between the two; the counts are the same integers: metrics/gpu/calibration_kernel.cu's test).
# Stage `probe`: the kernel alone (tools/calibration_probe.cu: microseconds per image against a
# softmax pass, with and without the fine histogram, K = 2 and 21, spread and crowded probabilities).
#   bench/gpu/run.sh calibration [STAGES]    (build,tests,run,check,probe; default build,run,check)
# Settings: COUNT (images, default 3200), MODELS (default "lraspp lraspp21").
set -uo pipefail
stages=${1:-build,run,check}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/calibration}; mkdir -p "$work/out"
n=${COUNT:-3200}
build_stage
tests_stage
if has run; then
  export_models "$work/models"
  [ -f "$work/models/lraspp21.pt" ] || $py - "$work/models/lraspp21.pt" <<'PY'
import sys, torch
from torchvision.models.segmentation import lraspp_mobilenet_v3_large
torch.manual_seed(0)
torch.jit.script(lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21).eval()).save(sys.argv[1])
PY
  make_images "$work/png" "$n" png
  for model in ${MODELS:-lraspp lraspp21}; do
    for round in 1 2; do
      for mode in plain calibration; do
        metrics=dice; [ "$mode" = calibration ] && metrics=dice,calibration
        out="$work/out/${model}_${mode}_$round"
        "$bin/tally" run --model "$work/models/$model.pt" --manifest "$work/png/manifest.csv" --out "$out" --gpus all \
          --metrics "$metrics" --batch-size 32 --precision fp32 > "$out.log" 2>&1 || tail -20 "$out.log"
        summary "$out" "${model}_fp32_${mode}_$round"
      done
    done
    $py - "$work/out/${model}_plain_1" "$work/out/${model}_calibration_1" <<'PY'
import csv, json, sys
def scores(p):
    with open(p + "/per_image.csv") as f:
        return [(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["tn"], r["dice"]) for r in csv.DictReader(f)]
print("scores with calibration against without:", "identical" if scores(sys.argv[1]) == scores(sys.argv[2]) else "DIFFERENT")
c = json.load(open(sys.argv[2] + "/report.json"))["calibration"]
print(json.dumps({k: c[k] for k in ("rows", "fine_rows", "ece", "classwise_ece", "ace", "classwise_ace")}))
PY
  done
fi
if has check; then
  $py - "$work/small" <<'PY'
import os, sys
sys.path.insert(0, "tests/integration")
import numpy as np, tallytest as tt
if not os.path.exists(sys.argv[1] + "/manifest.csv"):
    tt.write_dataset(sys.argv[1], np.random.default_rng(3), 64, [(96, 128), (64, 64)])
PY
  for dev in cpu gpu; do
    g=(); [ "$dev" = gpu ] && g=(--gpus all)
    "$bin/tally" run --model tests/fixtures/three_class.pt --manifest "$work/small/manifest.csv" --out "$work/out/small_$dev" \
      --metrics calibration "${g[@]}" > "$work/out/small_$dev.log" 2>&1 || tail -5 "$work/out/small_$dev.log"
  done
  $py - "$work/out/small_cpu" "$work/out/small_gpu" <<'PY'
import json, sys
a, b = (json.load(open(p + "/report.json"))["calibration"] for p in sys.argv[1:])
worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-300) for k in ("ece", "classwise_ece", "ace", "classwise_ace"))
print("small job, CPU against GPU: rows", a["rows"], b["rows"], "fine rows", a["fine_rows"], b["fine_rows"],
      "pixels", a["top_label"]["pixels"], b["top_label"]["pixels"], "largest relative difference %.2e" % worst)
PY
fi
if has probe; then
  nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc_bin" -O3 -std=c++17 -arch=sm_90 -I. bench/gpu/tools/calibration_probe.cu metrics/gpu/calibration_kernel.cu \
    -o "$work/calibration_probe" > "$OUT/probe_build.log" 2>&1 && "$work/calibration_probe" || tail -5 "$OUT/probe_build.log"
fi
