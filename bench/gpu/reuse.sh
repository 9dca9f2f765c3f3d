#!/usr/bin/env bash
# Model reuse on a long-running worker (BENCHMARKS.md "Start-up, model reuse, long runs"): five jobs with the
# same model, each one's first batch after submission. $OUT: where logs go.
set -uo pipefail
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; exit 1; }
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
$bin/tally-make-dataset --out $work/png --count 1600 --size 512 --format png >/dev/null 2>&1
python3 bench/gpu/train_lraspp.py $work/png $work/lraspp_trained.pt > $OUT/train.log 2>&1
$bin/tallyd --listen 127.0.0.1:50990 --state-dir $work/state > $OUT/tallyd.log 2>&1 &
sleep 0.5; $bin/tally-worker --coordinator 127.0.0.1:50990 --device cuda:0 > $OUT/worker.log 2>&1 &
sleep 2
for k in 1 2 3 4 5; do
  job=$($bin/tally submit --server 127.0.0.1:50990 --model $work/lraspp_trained.pt --manifest $work/png/manifest.csv --metrics dice --batch-size 32 --name job$k | tail -1)
  $bin/tally wait --server 127.0.0.1:50990 $job > /dev/null 2>&1 || $bin/tally watch --server 127.0.0.1:50990 $job > /dev/null 2>&1
  $bin/tally report --server 127.0.0.1:50990 $job --out $work/out/job$k > /dev/null 2>&1
  python3 -c "import json; r=json.load(open('$work/out/job$k/report.json')); w=r['workers'][0]; print('job$k first_batch_seconds after submit', round(w['first_batch_seconds'],3), 'steady', round(w['images_per_second']))" 2>&1 | tail -1
done
grep -c "reusing it" $OUT/worker.log
