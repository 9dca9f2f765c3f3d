#!/usr/bin/env bash
# Suite `compile`: Python models eager and with Tally's --compile, against the model-only rates
# (eager and torch.compile'd, inputs already on the GPU: tools/eager_ceiling.py --compile) and the
# TorchScript path, on one GPU: DeepLabV3-ResNet50 bf16 and LRASPP fp32 (tools/torchvision_model.py),
# COUNT photograph-like 512x512 PNGs, batch 32. The compiled job runs twice: the second finds
# inductor's cache warm (the worker's --cache-dir), and its model load says what that saves.
#   bench/gpu/run.sh compile [STAGES]    (build,anchor,tally,check; default all)
# Stage check: the compiled job again with two workers on GPU 0 (--gpus 0,0), and
# tools/compile_check.py: 1 and 2 workers identical, compiled within the stated tolerance of eager.
# Settings: COUNT (images, default 1600), ARCHS (default "deeplabv3:bf16 lraspp:fp32"), MODES (the Python
# model's runs, default "eager compiled compiled_again"), ANCHOR_COMPILE (0: the anchor without torch.compile).
set -uo pipefail
stages=${1:-build,anchor,tally,check}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/compile}; mkdir -p "$work/out"
n=${COUNT:-1600}
archs=${ARCHS:-"deeplabv3:bf16 lraspp:fp32"}
modes=${MODES:-"eager compiled compiled_again"}
anchor_flags=(--compile); [ "${ANCHOR_COMPILE:-1}" = 0 ] && anchor_flags=()
build_stage
results=$work/compile.jsonl
: > "$results"
if has anchor; then
  for ap in $archs; do
    $py "$src/bench/gpu/tools/eager_ceiling.py" --arch "${ap%%:*}" --precision "${ap##*:}" "${anchor_flags[@]}" >> "$results"
    tail -1 "$results" >&2
  done
fi
if has tally; then
  export_models "$work/models"
  make_images "$work/png" "$n" png
  for ap in $archs; do
    arch=${ap%%:*}; prec=${ap##*:}
    "$bin/tally" run --model "$work/models/$arch.pt" --manifest "$work/png/manifest.csv" --out "$work/out/ts_$arch" \
      --gpus all --metrics dice --batch-size 32 --precision "$prec" > "$work/out/ts_$arch.log" 2>&1 || tail -20 "$work/out/ts_$arch.log"
    summary "$work/out/ts_$arch" "torchscript_${arch}_$prec"
    for mode in $modes; do
      extra=(); [ "$mode" != eager ] && extra=(--compile)
      "$bin/tally" run --model "$src/bench/gpu/tools/torchvision_model.py" --model-option "arch=$arch" \
        --model-option "precision=$prec" --python "$py" --manifest "$work/png/manifest.csv" --out "$work/out/py_${arch}_$mode" \
        --gpus all --metrics dice --batch-size 32 "${extra[@]}" > "$work/out/py_${arch}_$mode.log" 2>&1 \
        || tail -20 "$work/out/py_${arch}_$mode.log"
      summary "$work/out/py_${arch}_$mode" "python_${arch}_${prec}_$mode"
    done
  done
fi
if has check; then
  for ap in $archs; do
    arch=${ap%%:*}; prec=${ap##*:}
    "$bin/tally" run --model "$src/bench/gpu/tools/torchvision_model.py" --model-option "arch=$arch" \
      --model-option "precision=$prec" --python "$py" --manifest "$work/png/manifest.csv" --out "$work/out/py_${arch}_compiled_2w" \
      --gpus 0,0 --metrics dice --batch-size 32 --compile > "$work/out/py_${arch}_compiled_2w.log" 2>&1 \
      || tail -20 "$work/out/py_${arch}_compiled_2w.log"
    summary "$work/out/py_${arch}_compiled_2w" "python_${arch}_${prec}_compiled_two_workers"
    $py "$src/bench/gpu/tools/compile_check.py" "$work/out/py_${arch}_eager" "$work/out/py_${arch}_compiled" \
      "$work/out/py_${arch}_compiled_2w" | tee -a "$results"
  done
fi
cp "$results" "$OUT/" 2>/dev/null || true
