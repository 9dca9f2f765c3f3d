#!/usr/bin/env bash
# Suite `shards`: tar shards at the speed of loose files. LRASPP fp32, batch 32, `--metrics dice`, on
# COUNT photograph-like 512x512 images (PNG and JPEG q90) with their masks, read from loose files (a
# manifest), from 8 tar shards and from 64 of the same samples (bench/make_shards.py: KEY.png or
# KEY.jpg + KEY.seg.png), all in the page cache; `tally run` on one GPU (KS: more), the three sources
# alternated REPS times. Each run's steady rate (the workers' own, after their first batch), wall rate
# and first batch; every shards run's per_image.csv against the loose run's (the image column aside:
# members and files are named differently): they must be identical.
#   bench/gpu/run.sh shards [STAGES]    (build,setup,runs; default all)
# Settings: COUNT (3200), SHARDS ("8 64"), FORMATS ("png jpeg"), KS (GPU counts, "1"), REPS (2).
set -uo pipefail
stages=${1:-build,setup,runs}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/shards}; mkdir -p "$work/out"
n=${COUNT:-3200}
build_stage
tests_stage
echo "gpus: $gpus; cores: $(nproc); $(lscpu | grep -E 'Model name' | sed 's/  */ /g')"
if has setup; then
  export_models "$work/models"
  for f in ${FORMATS:-png jpeg}; do
    make_images "$work/$f" "$n" $f
    for s in ${SHARDS:-8 64}; do
      rm -rf "$work/${f}_tar$s"
      $py bench/make_shards.py "$work/$f/manifest.csv" "$work/${f}_tar$s" --samples $(( (n + s - 1) / s )) > /dev/null
      cat "$work/${f}_tar$s"/*.tar > /dev/null  # In the page cache, as the loose files are.
    done
  done
  du -sh "$work"/*/ | sed 's/^/  /'
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
run() {  # NAME K FORMAT SOURCE(loose|tarN)
  local name=$1 k=$2 f=$3 source=$4
  local input=(--manifest "$work/$f/manifest.csv")
  [ "$source" != loose ] && input=(--shards "$work/${f}_$source/shard-*.tar")
  rm -rf "$work/out/$name"
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((k - 1))) "$bin/tally" run --model "$work/models/lraspp.pt" "${input[@]}" \
    --out "$work/out/$name" --gpus all --precision fp32 --metrics dice --batch-size 32 > "$work/out/$name.log" 2>&1 \
    || { tail -5 "$work/out/$name.log"; return 1; }
  local same=""
  [ "$source" != loose ] && same=", per_image.csv vs loose: $(same_rows "$work/out/${f}_loose_${k}_$rep/per_image.csv" "$work/out/$name/per_image.csv")"
  echo "$(summary "$work/out/$name" "$name")$same"
}
if has runs; then
  for k in ${KS:-1}; do
    for rep in $(seq ${REPS:-2}); do
      for f in ${FORMATS:-png jpeg}; do
        run ${f}_loose_${k}_$rep $k $f loose
        for s in ${SHARDS:-8 64}; do run ${f}_tar${s}_${k}_$rep $k $f tar$s; done
      done
    done
  done
fi
echo "total: $(( $(date +%s) - t_start )) s"
