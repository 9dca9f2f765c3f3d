#!/usr/bin/env bash
# Issue 44 item 4 (and issue 45 item 1's decode figures): LRASPP fp32, batch 32, on photograph-like
# 512x512 images (tally-make-dataset --noise 4) as PNG and as JPEG q90, from loose files (a manifest)
# and from tar shards of the same samples (256 a shard), on 1 GPU and on every GPU of the box; steady
# and wall img/s, whether per_image.csv (image column aside) equals the loose run's. Then the box's
# CPU decode rate (tally-bench-cpu) on 1 thread and on every core, images + masks, for both formats.
#   OUT=/tmp/logs bash bench/gpu/issue44.sh [IMAGES] [STAGES]   (stages: build,setup,runs,decode,repeat)
# Stage repeat: every GPU, loose and shards alternated three times for each format (the spread).
set -uo pipefail
n=${1:-6400}
stages=${2:-build,setup,runs,decode}
source "$(dirname "$0")/lib.sh"
work=/tmp/i44; mkdir -p "$work/out"
build_stage
bin=$src/build-gpu/bin
gpus=$(nvidia-smi -L | wc -l)
echo "gpus: $gpus; cores: $(nproc); $(lscpu | grep -E 'Model name' | sed 's/  */ /g')"
if has setup; then
  python3 bench/gpu/export_models.py "$work/models" > $OUT/export.log 2>&1 || tail -5 $OUT/export.log
  "$bin/tally-make-dataset" --out "$work/png" --count "$n" --size 512 --format png --noise 4 > /dev/null
  "$bin/tally-make-dataset" --out "$work/jpg" --count "$n" --size 512 --format jpeg --quality 90 --noise 4 > /dev/null
  python3 bench/make_shards.py "$work/png/manifest.csv" "$work/png_tar"
  python3 bench/make_shards.py "$work/jpg/manifest.csv" "$work/jpg_tar"
  du -sh "$work/png" "$work/jpg" "$work/png_tar" "$work/jpg_tar"
  cat "$work"/png_tar/*.tar "$work"/jpg_tar/*.tar > /dev/null  # Both in the page cache, as the loose files are.
  echo "setup: $(( $(date +%s) - t_start )) s"
fi
results=$OUT/results.jsonl
run() {  # name k data source
  local name=$1 k=$2 data=$3 source=$4
  local visible; visible=$(seq -s, 0 $((k - 1)))
  local input=(--manifest "$work/$data/manifest.csv")
  [ "$source" = tar ] && input=(--shards "$work/${data}_tar/shard-*.tar")
  CUDA_VISIBLE_DEVICES=$visible "$bin/tally" run --model "$work/models/lraspp.pt" "${input[@]}" \
    --out "$work/out/$name" --gpus all --precision fp32 --metrics dice --batch-size 32 > "$work/out/$name.log" 2>&1 \
    || { tail -5 "$work/out/$name.log"; return 1; }
  python3 - "$work/out/$name" "$name" "$k" "$work/out/${data}_loose_$k/per_image.csv" <<'PY' >> $results
import csv, json, os, sys
d, name, k, loose = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
r = json.load(open(d + "/report.json"))
w = r["workers"]
def rows(p):
    with open(p) as f:
        return [{k: v for k, v in x.items() if k != "image"} for x in csv.DictReader(f)]
same = rows(loose) == rows(d + "/per_image.csv") if "_tar_" in name and os.path.exists(loose) else None
print(json.dumps({"name": name, "gpus": k, "images": r["images_evaluated"],
                  "steady": round(sum(x["images_per_second"] for x in w), 1),
                  "wall": round(r["images_per_second"], 1), "wall_seconds": round(r["wall_seconds"], 2),
                  "per_worker": [round(x["images_per_second"], 1) for x in w],
                  "decode_threads": [x["decode_threads"] for x in w],
                  "first_batch_s": [round(x["first_batch_seconds"], 2) for x in w],
                  "per_image_equal_to_loose": same}))
PY
  tail -1 $results
}
if has runs; then
  for k in $(echo "1 $gpus" | tr ' ' '\n' | sort -un); do
    for data in png jpg; do
      run ${data}_loose_$k $k $data loose
      run ${data}_tar_$k $k $data tar
    done
    echo "runs $k: $(( $(date +%s) - t_start )) s"
  done
fi
if has repeat; then
  for i in 1 2 3; do
    for data in jpg png; do
      run ${data}_loose_${gpus}_r$i $gpus $data loose
      cp -r "$work/out/${data}_loose_${gpus}_r$i" "$work/out/${data}_loose_$gpus" 2> /dev/null
      run ${data}_tar_${gpus}_r$i $gpus $data tar
    done
  done
  lscpu > $OUT/lscpu.txt
fi
if has decode; then
  for data in png jpg; do
    for t in 1 $(nproc); do
      echo "$data $t threads: $("$bin/tally-bench-cpu" --mode decode --manifest "$work/$data/manifest.csv" --threads $t --seconds 5)"
    done
  done
fi
echo "total: $(( $(date +%s) - t_start )) s"
