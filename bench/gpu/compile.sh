#!/usr/bin/env bash
# Suite `compile`: Python models eager and with Tally's --compile, against the model-only rates
# (eager and torch.compile'd, inputs already on the GPU: tools/eager_ceiling.py --compile) and the
# TorchScript path, on one GPU: DeepLabV3-ResNet50 bf16 and LRASPP fp32 (tools/torchvision_model.py),
# COUNT photograph-like 512x512 PNGs, batch 32. The compiled job runs twice: the second finds
# inductor's cache warm (the worker's --cache-dir), and its model load says what that saves.
#   bench/gpu/run.sh compile [STAGES]    (build,anchor,tally,check,service,package; default all but service and package)
# Stage check: the compiled job again with two workers on GPU 0 (--gpus 0,0), and
# tools/compile_check.py: 1 and 2 workers identical, compiled within the stated tolerance of eager.
# Stage package: `tally export` of each TorchScript network to an AOTInductor package (.pt2, its
# export's seconds and its check against eager), then `tally run --model net.pt2` against the
# TorchScript file, alternated twice, and the package with two workers on GPU 0 (per_image.csv identical).
# Settings: COUNT (images, default 1600), ARCHS (default "deeplabv3:bf16 lraspp:fp32"), MODES (the Python
# model's runs, default "eager compiled compiled_again"; a name starting with "eager" runs without
# --compile, any other with it; a name containing "nobytecode" runs with TALLY_BYTECODE=0, the stub
# compiling every module's source as torch's environment leaves it), ANCHOR_COMPILE (0: the anchor without torch.compile). TALLY_STUB_PROFILE=1
# logs the stub's start-up steps in each job's worker log (out/.tally/worker-0.log).
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
      extra=(); [[ "$mode" != eager* ]] && extra=(--compile)
      bytecode=1; [[ "$mode" == *nobytecode* ]] && bytecode=0
      TALLY_BYTECODE=$bytecode "$bin/tally" run --model "$src/bench/gpu/tools/torchvision_model.py" --model-option "arch=$arch" \
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
if has service; then
  # A long-lived worker, as a lab's service runs (tallyd and tally-worker on GPU 0): DeepLabV3 bf16
  # jobs of new checkpoints (a model option per job: none reuses the last job's loaded model), eager
  # and --compile alternated (ROUNDS of each), with the spare model process (the worker's default)
  # and with --spare_interpreter=false; first batches and per_image.csv against the first eager job's.
  make_images "$work/png" "$n" png
  for spare in true false; do
    svc=$work/service_$spare; rm -rf "$svc"; mkdir -p "$svc"
    "$bin/tallyd" --listen 127.0.0.1:0 --port-file "$svc/port" --state-dir "$svc/state" > "$svc/tallyd.log" 2>&1 &
    tallyd_pid=$!
    for _ in $(seq 100); do [ -s "$svc/port" ] && break; sleep 0.1; done
    server=127.0.0.1:$(cat "$svc/port")
    TALLY_STUB_PROFILE=1 "$bin/tally-worker" --coordinator "$server" --device cuda:0 --cache-dir "$work/cache" \
      --spare_interpreter=$spare > "$svc/worker.log" 2>&1 &
    worker_pid=$!
    for round in $(seq "${ROUNDS:-3}"); do
      for mode in eager compiled; do
        extra=(); [ "$mode" = compiled ] && extra=(--compile)
        id=$("$bin/tally" submit --server "$server" --model "$src/bench/gpu/tools/torchvision_model.py" \
          --model-option arch=deeplabv3 --model-option precision=bf16 --model-option "checkpoint=$round$mode" \
          --python "$py" --manifest "$work/png/manifest.csv" --metrics dice --batch-size 32 "${extra[@]}")
        "$bin/tally" wait --server "$server" "$id" > /dev/null
        "$bin/tally" report --server "$server" "$id" --out "$svc/${mode}_$round" > /dev/null
        summary "$svc/${mode}_$round" "service_spare_${spare}_${mode}_$round" | tee -a "$results"
        echo "  per_image against the first ${mode} job: $(same_rows "$svc/${mode}_1/per_image.csv" "$svc/${mode}_$round/per_image.csv")"
      done
    done
    grep -E "takes this job|stale|prepared for the next job|ended" "$svc/worker.log" | cut -c1-200 > "$OUT/service_${spare}_worker.txt"
    kill "$worker_pid" "$tallyd_pid"; wait "$worker_pid" "$tallyd_pid" 2>/dev/null
  done
fi
if has package; then
  export_models "$work/models"
  make_images "$work/png" "$n" png
  for ap in $archs; do
    arch=${ap%%:*}; prec=${ap##*:}
    pkg="$work/models/${arch}_$prec.pt2"
    [ -f "$pkg" ] || "$bin/tally" export --model "$work/models/$arch.pt" --input-size 512x512 --batch-size 32 \
      --precision "$prec" --out "$pkg" --python "$py" > "$work/out/export_$arch.log" 2>&1 || tail -15 "$work/out/export_$arch.log"
    tail -1 "$work/out/export_$arch.log" | tee -a "$results"
    if [ ! -f "$pkg" ]; then  # The same network from its Python model file.
      pkg="$work/models/${arch}_${prec}_py.pt2"
      "$bin/tally" export --model "$src/bench/gpu/tools/torchvision_model.py" --model-option "arch=$arch" \
        --input-size 512x512 --batch-size 32 --precision "$prec" --out "$pkg" --python "$py" > "$work/out/export_${arch}_py.log" 2>&1 \
        || tail -15 "$work/out/export_${arch}_py.log"
      tail -1 "$work/out/export_${arch}_py.log" | tee -a "$results"
    fi
    [ -f "$pkg" ] || continue
    for round in 1 2; do
      for m in ts pt2; do
        model="$work/models/$arch.pt"; [ "$m" = pt2 ] && model=$pkg
        o="$work/out/${m}_${arch}_$round"
        "$bin/tally" run --model "$model" --manifest "$work/png/manifest.csv" --out "$o" --gpus all --metrics dice \
          --batch-size 32 --precision "$prec" > "$o.log" 2>&1 || tail -20 "$o.log"
        summary "$o" "${m}_${arch}_${prec}_$round" | tee -a "$results"
      done
    done
    o="$work/out/pt2_${arch}_2w"
    "$bin/tally" run --model "$pkg" --manifest "$work/png/manifest.csv" --out "$o" --gpus 0,0 --metrics dice \
      --batch-size 32 --precision "$prec" > "$o.log" 2>&1 || tail -20 "$o.log"
    summary "$o" "pt2_${arch}_${prec}_two_workers" | tee -a "$results"
    echo "package, 1 against 2 workers: $(same_rows "$work/out/pt2_${arch}_1/per_image.csv" "$o/per_image.csv")"
    $py - "$work/out/ts_${arch}_1/per_image.csv" "$work/out/pt2_${arch}_1/per_image.csv" <<'PY'
import csv, sys
a, b = ([float(r["dice"]) for r in csv.DictReader(open(p)) if r["dice"] not in ("", "nan")] for p in sys.argv[1:])
d = [abs(x - y) for x, y in zip(a, b)]
print("package against TorchScript: per-row Dice mean |difference| %.2e, largest %.2e, rows differing %d of %d"
      % (sum(d) / max(len(d), 1), max(d or [0]), sum(x > 0 for x in d), len(d)))
PY
  done
fi
cp "$results" "$OUT/" 2>/dev/null || true
