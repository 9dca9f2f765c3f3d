#!/usr/bin/env bash
# Issue 14, session 6 on a GPU box (BENCHMARKS.md "Start-up without TorchScript's optimiser, staging
# copies first"): builds, runs the GPU tests touched, trains the benchmark LRASPP on PNG and on JPEG,
# then times start-up (default vs --jit_optimize), 4 decode threads, --metrics dice vs all, and 32 000
# rows; compares results with and without the optimiser. $OUT: where logs go.
set -uo pipefail
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -30 $OUT/build.log; exit 1; }
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
export XDG_CACHE_HOME=$work/cache; rm -rf $XDG_CACHE_HOME  # Kept layout trials: none at first.
export TALLY_BIN=$bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
(cd tests/integration && timeout 300 python3 -m unittest -v test_gpu.GpuTest.test_estimate_peak_memory_against_torch \
   test_gpu.GpuTest.test_jpeg_decoding_on_the_gpu test_gpu.GpuTest.test_decode_auto_decodes_every_row_with_the_jobs_choice \
   > $OUT/gputest.log 2>&1; grep -E "ok$|FAIL|Error|Ran|OK|batch " $OUT/gputest.log | tail -20) &
tp=$!
$bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png >/dev/null 2>&1
$bin/tally-make-dataset --out $work/jpg --count 3200 --size 512 --format jpeg >/dev/null 2>&1
python3 bench/gpu/train_lraspp.py $work/png $work/lr_png.pt > $OUT/train.log 2>&1; tail -1 $OUT/train.log
python3 bench/gpu/train_lraspp.py $work/jpg $work/lr_jpg.pt > $OUT/train2.log 2>&1; tail -1 $OUT/train2.log
wait $tp
summ() { python3 - "$@" <<'PY'
import json, sys
out, label, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = json.load(open(out + '/report.json')); w = r['workers'][0]
first = r['created_unix'] + w['first_batch_seconds'] - t0 if w['first_batch_seconds'] else -1
print(f"{label}: steady {w['images_per_second']:.0f} wall {r['images_per_second']:.0f} first_batch_after_start {first:.2f}s (after submit {w['first_batch_seconds']:.2f}) layout {r.get('channels_last')} decode {r.get('decode')} evaluated {r['images_evaluated']}")
PY
}
run() { label=$1; shift; out=$work/out/$label; t0=$(date +%s.%N); TALLY_PIPELINE_PROFILE=1 $bin/tally run --out $out --gpus 0 --batch-size 32 "$@" > $out.log 2>&1 || tail -3 $out.log; summ $out $label $t0; grep -h -E "profile|warm-up|model loaded" $out/.tally/worker-0.log | cut -c 25- | sed 's/^/   /'; }
J="--model $work/lr_jpg.pt --manifest $work/jpg/manifest.csv"
P="--model $work/lr_png.pt --manifest $work/png/manifest.csv"
python3 bench/gpu/eager_ceiling.py --arch lraspp --precision fp32 2>&1 | tail -1
echo "== start-up and results: --jit_optimize off (default) vs on"
for k in 1 2; do
  run png-off-$k $P --metrics dice --channels-last off
  run png-off-jit-$k $P --metrics dice --channels-last off --worker-flags=--jit_optimize
done
run png-auto $P --metrics dice
python3 - $work/out <<'PY'
import csv, sys
def rows(p): return {(r['index'], r['class']): r for r in csv.DictReader(open(p + '/per_image.csv'))}
a, b = rows(sys.argv[1] + '/png-off-1'), rows(sys.argv[1] + '/png-off-jit-1')
d = [abs(float(a[k]['dice']) - float(b[k]['dice'])) for k in a if a[k]['dice'] not in ('', 'nan') and b[k]['dice'] not in ('', 'nan')]
same = sum(1 for k in a if a[k]['tp'] == b[k]['tp'] and a[k]['fp'] == b[k]['fp'] and a[k]['fn'] == b[k]['fn'])
print(f"jit off vs on, trained LRASPP on PNG: rows x classes {len(a)}, identical counts {same}, |dice diff| mean {sum(d)/len(d):.2e} max {max(d):.2e}")
PY
cmp -s $work/out/png-off-1/per_image.csv $work/out/png-off-2/per_image.csv && echo "jit off: two runs identical"
cmp -s $work/out/png-off-jit-1/per_image.csv $work/out/png-off-jit-2/per_image.csv && echo "jit on: two runs identical"
for f in "" --worker-flags=--jit_optimize; do
  $bin/tally estimate --model $work/lr_png.pt --manifest $work/png/manifest.csv --gpus 0 --max-batch 32 --json $f > $work/est.json 2>/dev/null
  python3 -c "import json; r=json.load(open('$work/est.json')); print('estimate $f', [(t['batch_size'], round(t['peak_memory_bytes']/2**20), round(t['images_per_second'])) for t in r['trials']])"
done
echo "== 4 decode threads, JPEG"
for d in gpu cpu auto; do run t4-$d $J --metrics dice --worker-threads 4 --decode $d; done
run t4-gpu-off $J --metrics dice --worker-threads 4 --decode gpu --channels-last off
echo "== metrics dice vs all"
for k in 1 2; do for m in dice all; do run png-$m-$k $P --metrics $m; done; done
for m in dice all; do run jpg-$m $J --metrics $m; done
echo "== 32000 rows"
export XDG_CACHE_HOME=$work/cache32k  # A fresh cache: png-auto above kept this model's trial.
python3 -c "
rows=open('$work/png/manifest.csv').read().splitlines(); print(rows[0]); [print(r) for _ in range(10) for r in rows[1:]]" > $work/png/m32000.csv
run lr-32000 --model $work/lr_png.pt --manifest $work/png/m32000.csv --metrics dice
run lr-32000-off --model $work/lr_png.pt --manifest $work/png/m32000.csv --metrics dice --channels-last off
run lr-32000-kept --model $work/lr_png.pt --manifest $work/png/m32000.csv --metrics dice  # The trial kept by lr-32000.
echo "== Python backend (LRASPP, random weights) vs TorchScript"
python3 bench/gpu/export_models.py $work/models lraspp > /dev/null 2>&1
TALLY_STUB_PROFILE=1 run py --model bench/gpu/torchvision_model.py --model-option arch=lraspp --manifest $work/png/manifest.csv \
  --metrics dice --worker-flags=--warmup-batches=2
grep -h "stub profile" $work/out/py/.tally/worker-0.log | tail -1 | cut -c 25-
run ts --model $work/models/lraspp.pt --manifest $work/png/manifest.csv --metrics dice
