#!/usr/bin/env bash
# Issue 14, session 7 on a GPU box (BENCHMARKS.md "Where a fresh worker's first second goes"):
# builds, trains the benchmark LRASPP on PNG, then prints, for each `tally run`, the first batch's
# time after the command started and the timeline of tallyd's and the worker's logs (seconds after
# the command started). TALLY_EARLY_CUDA and TALLY_NVJPEG_PRIORITY switched two experiments of that
# session's build (CUDA initialised by a library constructor; nvJPEG's stream at low priority);
# neither was kept, and without them the pairs of runs below measure the same code. $OUT: logs.
set -uo pipefail
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -30 $OUT/build.log; exit 1; }
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
readelf -d $bin/tally-worker | grep -E "NEEDED|RPATH|RUNPATH" | tail -9
export XDG_CACHE_HOME=$work/cache; rm -rf $XDG_CACHE_HOME
export TALLY_BIN=$bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
$bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png >/dev/null 2>&1
$bin/tally-make-dataset --out $work/jpg --count 3200 --size 512 --format jpeg >/dev/null 2>&1
( time $bin/tally-worker --version ) 2>&1 | grep -E "real|tally" | head -2
LD_DEBUG=statistics $bin/tally-worker --version 2>&1 | grep -E "total startup|relocation processing|load time" | head -4
t=$(date +%s.%N); $bin/tally-worker --device cuda:0 --coordinator 127.0.0.1:1 --max-connect-seconds 0.5 > $work/w.log 2>&1; python3 -c "import time; print('worker alone to exit', round(time.time()-$t,2))"; grep -E "main reached|CUDA driver" $work/w.log | cut -c 25-
python3 bench/gpu/train_lraspp.py $work/png $work/lr.pt > $OUT/train.log 2>&1; tail -1 $OUT/train.log
python3 bench/gpu/eager_ceiling.py --arch lraspp --precision fp32 2>&1 | tail -1
summ() { python3 - "$@" <<'PY'
import json, sys, re, datetime
out, label, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = json.load(open(out + '/report.json')); w = r['workers'][0]
first = r['created_unix'] + w['first_batch_seconds'] - t0 if w['first_batch_seconds'] else -1
print(f"{label}: steady {w['images_per_second']:.0f} wall {r['images_per_second']:.0f} first_batch_after_start {first:.2f}s submitted {r['created_unix']-t0:.2f}s layout {r.get('channels_last')} decode {r.get('decode')} evaluated {r['images_evaluated']}")
def rel(line):
    m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z', line)
    if not m: return None
    return datetime.datetime.strptime(m.group(1), '%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp() - t0
for name in ('tallyd.log', 'worker-0.log'):
    lines = open(out + '/.tally/' + name).read().splitlines()
    keep = [l for l in lines if re.search(r'main reached|CUDA driver|read again|out of service|registered|listening|loading model|model loaded|warm-up|first batch|profile|channels-last|decod', l)]
    for l in (lines[:1] + keep)[:14]:
        t = rel(l)
        if t is not None: print(f"   {name[:6]} {t:6.3f} {l[24:][:150]}")
PY
}
run() { label=$1; shift; out=$work/out/$label; t0=$(date +%s.%N); TALLY_PIPELINE_PROFILE=1 $bin/tally run --out $out --gpus 0 --batch-size 32 "$@" > $out.log 2>&1 || tail -3 $out.log; summ $out $label $t0; }
P="--model $work/lr.pt --manifest $work/png/manifest.csv"
J="--model $work/lr.pt --manifest $work/jpg/manifest.csv"
echo "== start-up, --channels-last off"
for k in 1 2 3; do run off-$k $P --metrics dice --channels-last off; done
for k in 1 2; do TALLY_EARLY_CUDA=0 run off-noearly-$k $P --metrics dice --channels-last off; done
cmp -s $work/out/off-1/per_image.csv $work/out/off-noearly-1/per_image.csv && echo "early CUDA: per_image.csv identical"
echo "== default auto: first run, then with the kept trial"
run auto-1 $P --metrics dice
run auto-2 $P --metrics dice
echo "== 4 decode threads JPEG: nvJPEG stream priority"
for k in 1 2; do
  run t4-gpu-high-$k $J --metrics dice --worker-threads 4 --decode gpu --channels-last off
  TALLY_NVJPEG_PRIORITY=low run t4-gpu-low-$k $J --metrics dice --worker-threads 4 --decode gpu --channels-last off
done
cmp -s $work/out/t4-gpu-high-1/per_image.csv $work/out/t4-gpu-low-1/per_image.csv && echo "priority: per_image.csv identical"
