#!/usr/bin/env bash
# --decode cpu|gpu|auto on a GPU box (BENCHMARKS.md "JPEG decoding on the GPU"): builds, runs the
# nvJPEG tests, trains the benchmark LRASPP and times JPEG jobs with 4 decode threads (a 4-GPU lab
# box's share of the cores) and with the default threads, against the model-only ceiling. $OUT: logs.
set -uo pipefail
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -30 $OUT/build.log; exit 1; }
grep -E "Tally: " $OUT/build.log
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
timeout 120 $bin/gpu_jpeg_test > $OUT/gpu_jpeg_test.log 2>&1; grep -E "nvJPEG|OK \]|FAILED|PASSED|SKIPPED|Failure|Expected|Which|actual" $OUT/gpu_jpeg_test.log | head -30
export TALLY_BIN=$bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
(cd tests/integration && timeout 400 python3 -m unittest -v test_gpu.GpuTest.test_jpeg_decoding_on_the_gpu test_gpu.GpuTest.test_decode_auto_decodes_every_row_with_the_jobs_choice ${TESTS:-} > $OUT/gputest.log 2>&1; grep -E "ok$|FAIL|Error|Ran|skip" $OUT/gputest.log)
$bin/tally-make-dataset --out $work/jpg --count 3200 --size 512 --format jpeg >/dev/null 2>&1
python3 bench/gpu/train_lraspp.py $work/jpg $work/lraspp_trained.pt > $OUT/train.log 2>&1; tail -1 $OUT/train.log
summ() { python3 - "$@" <<'PY'
import json, sys
out, label = sys.argv[1], sys.argv[2]
r = json.load(open(out + '/report.json')); w = r['workers'][0]
print(f"{label}: steady {w['images_per_second']:.0f} img/s, wall {r['images_per_second']:.0f}, decode {r.get('decode')} [{r.get('decode_trial','')}] evaluated {r['images_evaluated']} failed {r['images_failed']}")
PY
}
run() { label=$1; shift; out=$work/out/$label; t0=$(date +%s.%N); $bin/tally run --out $out --gpus 0 --model $work/lraspp_trained.pt --manifest $work/jpg/manifest.csv --batch-size 32 "$@" > $out.log 2>&1 || tail -3 $out.log; echo -n "[$(python3 -c "import time;print(round(time.time()-$t0,1))") s] "; summ $out $label; cp $out.log $OUT/ 2>/dev/null; }
python3 bench/gpu/eager_ceiling.py --arch lraspp --precision fp32 2>&1 | tail -1
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
