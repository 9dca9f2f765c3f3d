#!/usr/bin/env bash
# Suite `store`: the prediction store on one GPU (docs/prediction-store.md). COUNT photograph-like
# 512x512 PNGs through the TorchScript models (tools/export_models.py): LRASPP fp32 without the
# store, with an empty store (every row written) and with a full one (every row read, no model);
# DeepLabV3 bf16 the same; then with half the rows in the store (a 50 % sample's), so that batches
# are partly found and partly run. Each run's steady rate, rows from the store, and whether
# per_image.csv equals the run without the store; the store's bytes a row.
#   bench/gpu/run.sh store [STAGES]    (build,run; default all)
# Settings: COUNT (images, default 3200), ARCHS (default "lraspp:fp32 deeplabv3:bf16").
set -uo pipefail
stages=${1:-build,run}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/store}; mkdir -p "$work/out"
n=${COUNT:-3200}
archs=${ARCHS:-"lraspp:fp32 deeplabv3:bf16"}
build_stage
if has run; then
  export_models "$work/models"
  make_images "$work/png" "$n" png
  for ap in $archs; do
    arch=${ap%%:*}; prec=${ap##*:}
    rm -rf "$work/store_$arch"
    for mode in none empty full half; do
      extra=(); [ "$mode" != none ] && extra=(--prediction-store "$work/store_$arch")
      if [ "$mode" = half ]; then  # Half the rows in the store: batches partly found, partly run.
        rm -rf "$work/store_$arch"
        "$bin/tally" run --model "$work/models/$arch.pt" --manifest "$work/png/manifest.csv" --out "$work/out/${arch}_sample" \
          --gpus all --metrics dice --batch-size 32 --precision "$prec" --sample 50% "${extra[@]}" > /dev/null 2>&1
      fi
      out="$work/out/${arch}_$mode"
      "$bin/tally" run --model "$work/models/$arch.pt" --manifest "$work/png/manifest.csv" --out "$out" --gpus all \
        --metrics dice --batch-size 32 --precision "$prec" "${extra[@]}" > "$out.log" 2>&1 || tail -20 "$out.log"
      summary "$out" "${arch}_${prec}_store_$mode"
      $py -c "import json,sys; r=json.load(open('$out/report.json')); print(json.dumps({'rows_from_store': r['rows_from_store']}))"
      [ "$mode" != none ] && echo "per_image.csv against no store: $(same_rows "$work/out/${arch}_none/per_image.csv" "$out/per_image.csv")"
    done
    echo "store bytes a row ($arch, after the half run): $(( $(du -sb "$work/store_$arch" | cut -f1) / n ))"
  done
fi
