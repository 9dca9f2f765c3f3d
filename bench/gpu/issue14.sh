#!/usr/bin/env bash
# Issue 14 on a GPU box (BENCHMARKS.md "Past the CPU wall"): builds, runs the GPU tests it added, trains the
# benchmark LRASPP and times dice vs all, the layouts, 32 000 rows and model reuse. $OUT: where logs go.
set -uo pipefail
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -30 $OUT/build.log; exit 1; }
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
timeout 180 $bin/surface_kernel_test > $OUT/sk.log 2>&1; grep -E "OK|FAILED|PASSED|surface kernels" $OUT/sk.log | head -20
export TALLY_BIN=$bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
(cd tests/integration && timeout 400 python3 -m unittest -v test_gpu.GpuTest.test_surface_metrics_on_the_gpu_equal_the_cpus test_gpu.GpuTest.test_channels_last_auto_resolves_and_a_loaded_model_serves_the_next_job test_gpu.GpuTest.test_precision_channels_last_and_auto_batch_run test_gpu.GpuTest.test_cuda_counts_equal_cpu_counts > $OUT/gputest.log 2>&1; grep -E "ok$|FAIL|Error|Ran" $OUT/gputest.log)
$bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png >/dev/null 2>&1
$bin/tally-make-dataset --out $work/jpg --count 3200 --size 512 --format jpeg >/dev/null 2>&1
python3 bench/gpu/train_lraspp.py $work/png $work/lraspp_trained.pt > $OUT/train.log 2>&1; tail -2 $OUT/train.log
python3 bench/gpu/export_models.py $work/models deeplabv3 > /dev/null 2>&1
summ() { python3 - "$@" <<'PY'
import json, sys
out, label, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = json.load(open(out + '/report.json')); w = r['workers'][0]
first = r['created_unix'] + w['first_batch_seconds'] - t0 if w['first_batch_seconds'] else -1
print(f"{label}: steady {w['images_per_second']:.0f} wall {r['images_per_second']:.0f} first_batch_after_start {first:.2f}s (after submit {w['first_batch_seconds']:.2f}) layout {r.get('channels_last')} [{r.get('channels_last_trial','')}] evaluated {r['images_evaluated']}")
PY
}
run() { label=$1; shift; out=$work/out/$label; t0=$(date +%s.%N); $bin/tally run --out $out --gpus 0 "$@" > $out.log 2>&1 || tail -3 $out.log; summ $out $label $t0; }
for fmt in png jpg; do
  run $fmt-dice --model $work/lraspp_trained.pt --manifest $work/$fmt/manifest.csv --metrics dice --batch-size 32
  run $fmt-all --model $work/lraspp_trained.pt --manifest $work/$fmt/manifest.csv --metrics all --batch-size 32
  TALLY_CPU_SURFACE=1 run $fmt-all-cpusurf --model $work/lraspp_trained.pt --manifest $work/$fmt/manifest.csv --metrics all --batch-size 32
  cmp $work/out/$fmt-all/per_image.csv $work/out/$fmt-all-cpusurf/per_image.csv && echo "$fmt all: per_image.csv identical GPU vs CPU surface"
done
python3 -c "
import csv; rows=[r for r in csv.DictReader(open('$work/out/png-all/per_image.csv')) if r['class']=='1']
f=[float(r['hd95']) for r in rows if r['hd95'] not in ('nan','inf')]; d=[float(r['dice']) for r in rows if r['dice']!='nan']
print('trained LRASPP png: class-1 dice mean', sum(d)/len(d), 'finite hd95', len(f), 'of', len(rows), 'median', sorted(f)[len(f)//2] if f else None)"
echo "== layouts"
for p in fp32 bf16; do
  for cl in auto on off; do run lr-$p-$cl --model $work/lraspp_trained.pt --manifest $work/png/manifest.csv --metrics dice --batch-size 32 --precision $p --channels-last $cl; done
done
head -1601 $work/png/manifest.csv > $work/png/m1600.csv
for cl in auto on off; do run dl-bf16-$cl --model $work/models/deeplabv3.pt --manifest $work/png/m1600.csv --metrics dice --batch-size 32 --precision bf16 --channels-last $cl; done
python3 bench/gpu/eager_ceiling.py --arch deeplabv3 --precision bf16 --layouts 2>&1 | tail -1
python3 bench/gpu/eager_ceiling.py --arch lraspp --precision fp32 --layouts 2>&1 | tail -1
echo "== 32000 rows"
python3 -c "
rows=open('$work/png/manifest.csv').read().splitlines(); print(rows[0]); [print(r) for _ in range(10) for r in rows[1:]]" > $work/png/m32000.csv
run lr-32000 --model $work/lraspp_trained.pt --manifest $work/png/m32000.csv --metrics dice --batch-size 32
echo "== model cache: two jobs on one long-running worker"
$bin/tallyd --listen 127.0.0.1:50990 --state-dir $work/state > $OUT/tallyd.log 2>&1 &
sleep 0.5; $bin/tally-worker --coordinator 127.0.0.1:50990 --device cuda:0 > $OUT/worker.log 2>&1 &
sleep 2
for k in 1 2 3; do
  job=$($bin/tally submit --server 127.0.0.1:50990 --model $work/lraspp_trained.pt --manifest $work/png/m1600.csv --metrics dice --batch-size 32 --name job$k | tail -1)
  $bin/tally wait --server 127.0.0.1:50990 $job > /dev/null 2>&1 || $bin/tally watch --server 127.0.0.1:50990 $job > /dev/null 2>&1
  $bin/tally report --server 127.0.0.1:50990 $job --out $work/out/job$k > /dev/null 2>&1
  python3 -c "import json; r=json.load(open('$work/out/job$k/report.json')); w=r['workers'][0]; print('job$k first_batch_seconds after submit', round(w['first_batch_seconds'],3), 'steady', round(w['images_per_second']), 'wall', round(r['images_per_second']))" 2>&1 | tail -1
done
grep -E "loading model|reusing|channels-last" $OUT/worker.log | head
kill %1 %2 2>/dev/null
