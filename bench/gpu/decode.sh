#!/usr/bin/env bash
# Suite `decode`: where images are decoded. Stage `gpu`: JPEG decoding on the GPU (--decode gpu, nvJPEG)
# against the CPU (libjpeg-turbo) and --decode auto's choice, with 4 decode threads (a 4-GPU lab box's
# share of the cores) and 16, on a trained LRASPP fp32 (tools/train_lraspp.py: predictions shaped like
# a real model's) over 3200 photograph-like JPEG q90, against the eager model-only ceiling; the
# per-image counts of CPU- and GPU-decoded pixels compared. Stage `cpu`: the box's decode rate of
# photograph-like image + mask pairs (tally-bench-cpu --mode decode) on one thread and on every core,
# PNG and JPEG. (The rate per core of every format on the development machine: bench/decode_formats.py.)
#   bench/gpu/run.sh decode [STAGES]    (build,tests,gpu,cpu; default build,gpu,cpu)
set -uo pipefail
stages=${1:-build,gpu,cpu}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/decode}; mkdir -p "$work/out"
build_stage
has build && grep -E "Tally: " "$OUT/build.log"
tests_stage
make_images "$work/jpg" 3200 jpeg
if has cpu; then
  make_images "$work/png" 3200 png
  for data in png jpg; do
    for t in 1 $(nproc); do
      echo "$data $t threads: $("$bin/tally-bench-cpu" --mode decode --manifest "$work/$data/manifest.csv" --threads $t --seconds 5)"
    done
  done
fi
has gpu || { echo "total: $(( $(date +%s) - t_start )) s"; exit 0; }
[ -f $work/lraspp_trained.pt ] || { $py bench/gpu/tools/train_lraspp.py $work/jpg $work/lraspp_trained.pt > $OUT/train.log 2>&1; tail -1 $OUT/train.log; }
summ() { python3 - "$@" <<'PY'
import json, sys
out, label = sys.argv[1], sys.argv[2]
r = json.load(open(out + '/report.json')); w = r['workers'][0]
print(f"{label}: steady {w['images_per_second']:.0f} img/s, wall {r['images_per_second']:.0f}, decode {r.get('decode')} [{r.get('decode_trial','')}] evaluated {r['images_evaluated']} failed {r['images_failed']}")
PY
}
run() { label=$1; shift; out=$work/out/$label; t0=$(date +%s.%N); $bin/tally run --out $out --gpus 0 --model $work/lraspp_trained.pt --manifest $work/jpg/manifest.csv --batch-size 32 "$@" > $out.log 2>&1 || tail -3 $out.log; echo -n "[$(python3 -c "import time;print(round(time.time()-$t0,1))") s] "; summ $out $label; cp $out.log $OUT/ 2>/dev/null; }
$py bench/gpu/tools/eager_ceiling.py --arch lraspp --precision fp32 2>&1 | tail -1
for t in 4 16; do
  for d in cpu gpu auto; do run t$t-$d-dice --metrics dice --worker-threads $t --decode $d; done
done
run t4-gpu-all --metrics all --worker-threads 4 --decode gpu
run t4-cpu-all --metrics all --worker-threads 4 --decode cpu
python3 - $work/out <<'PY'
import csv, sys
def rows(p): return {(r['index'], r['class']): r for r in csv.DictReader(open(p + '/per_image.csv'))}
a, b = rows(sys.argv[1] + '/t4-cpu-dice'), rows(sys.argv[1] + '/t4-gpu-dice')
d = [abs(float(a[k]['dice']) - float(b[k]['dice'])) for k in a if a[k]['dice'] not in ('', 'nan') and b[k]['dice'] not in ('', 'nan')]
same = sum(1 for k in a if a[k]['tp'] == b[k]['tp'] and a[k]['fp'] == b[k]['fp'])
print(f"cpu vs gpu decode, trained LRASPP: rows x classes {len(a)}, identical counts {same}, |dice diff| mean {sum(d)/len(d):.2e} max {max(d):.2e}")
PY
grep -h -E "loading model|channels-last|JPEG decoding|first batch|listening|registered" $work/out/t4-auto-dice/.tally/*.log 2>/dev/null | head -12
cmp $work/out/t4-gpu-dice/per_image.csv $work/out/t16-gpu-dice/per_image.csv && echo "gpu decode: per_image.csv identical with 4 and 16 threads"
echo "total: $(( $(date +%s) - t_start )) s"
