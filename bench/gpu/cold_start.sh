#!/usr/bin/env bash
# Issue 14, session 8 on a GPU box: builds, then the stages named (comma list; default all):
#   tests     the GPU tests (test_gpu.py, gpu_jpeg_test, surface_kernel_test)
#   probes    where the first second goes: library loading (bench/gpu/libload_probe.cc,
#             LD_DEBUG=statistics) and the first passes (bench/gpu/first_pass_probe.py)
#   timeline  `tally run` start-up: first batch after the command starts, with each log line's time;
#             A/B of early CUDA (TALLY_EARLY_CUDA=0), the device warm-up (--warm_up_device=false) and
#             the warm-up passes (--warmup_batches=2, the old default)
#   decode4   4 decode threads on JPEG (goal 2), --decode cpu and gpu, against the model-only ceiling;
#             and with the old lease target (TALLY_LEASE_TARGET_ROWS=128)
#   long      32 000 rows, default flags: a network's first run (fresh trial cache), then a
#             retrained checkpoint of it (the kept trial), then --channels-last off
#   python    the Python backend against the same network as TorchScript (goal 5)
#   dl32k     (session 9) 32 000 rows of DeepLabV3 bf16, a network's first run (its trial picks
#             channels-last: the rows held meanwhile are evaluated again) against a kept trial
#   beside    (session 9) the layout trial beside the evaluation: DeepLabV3 bf16 (channels-last
#             wins: held rows evaluated again) and LRASPP (contiguous wins: held rows delivered) on a
#             network's first run, each against its fixed layout's per_image.csv and a kept trial
#   held      (session 10) `tally run`'s progress lines, timed, on a network's first run: rows held
#             for the trial show before any result is delivered
# Data and the trained LRASPPs are made once per machine under /tmp/x. $OUT: logs.
#   OUT=/tmp/logs bash bench/gpu/cold_start.sh [STAGES]
set -uo pipefail
stages=${1:-tests,probes,timeline,decode4,long,python}
has() { [[ ",$stages," == *",$1,"* ]]; }
t_start=$(date +%s)
scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -30 $OUT/build.log; exit 1; }
echo "build: $(( $(date +%s) - t_start )) s"
bin=$PWD/build-gpu/bin; work=/tmp/x; mkdir -p $work/out
export TALLY_BIN=$bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
export XDG_CACHE_HOME=$work/cache
data() {
  [ -f $work/png/manifest.csv ] || $bin/tally-make-dataset --out $work/png --count 3200 --size 512 --format png >/dev/null 2>&1
  [ -f $work/jpg/manifest.csv ] || $bin/tally-make-dataset --out $work/jpg --count 3200 --size 512 --format jpeg >/dev/null 2>&1
  [ -f $work/lr_png.pt ] || { python3 bench/gpu/train_lraspp.py $work/png $work/lr_png.pt > $OUT/train.log 2>&1; tail -1 $OUT/train.log; }
  [ -f $work/lr_jpg.pt ] || { python3 bench/gpu/train_lraspp.py $work/jpg $work/lr_jpg.pt > $OUT/train2.log 2>&1; tail -1 $OUT/train2.log; }
}
summ() { python3 - "$@" <<'PY'
import json, sys, re, datetime
out, label, t0, lines_wanted = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
r = json.load(open(out + '/report.json')); w = r['workers'][0]
first = r['created_unix'] + w['first_batch_seconds'] - t0 if w['first_batch_seconds'] else -1
print(f"{label}: steady {w['images_per_second']:.0f} wall {r['images_per_second']:.0f} ({r['images_per_second']/w['images_per_second']:.3f}) first_batch_after_start {first:.2f}s submitted {r['created_unix']-t0:.2f}s layout {r.get('channels_last')} decode {r.get('decode')} evaluated {r['images_evaluated']}")
def rel(line):
    m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z', line)
    if not m: return None
    return datetime.datetime.strptime(m.group(1), '%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp() - t0
shown = 0
for name in ('tallyd.log', 'worker-0.log'):
    if shown >= lines_wanted: break
    lines = open(out + '/.tally/' + name).read().splitlines()
    keep = [l for l in lines if re.search(r'main reached|CUDA|read again|out of service|registered|listening|loading model|model loaded|warm-up|first batch|first launch|channels-last|decod|profile', l)]
    for l in (lines[:1] + keep)[:16]:
        t = rel(l)
        if t is not None and shown < lines_wanted:
            print(f"   {name[:6]} {t:6.3f} {l[24:][:150]}"); shown += 1
PY
}
run() { label=$1; shift; out=$work/out/$label; rm -rf $out; t0=$(date +%s.%N); $bin/tally run --out $out --gpus 0 --batch-size 32 "$@" > $out.log 2>&1 || tail -3 $out.log; summ $out $label $t0 ${LINES:-0}; }
ceiling() { python3 bench/gpu/eager_ceiling.py --arch lraspp --precision fp32 2>&1 | tail -1; }

if has tests; then
  echo "== tests"
  (timeout 120 $bin/gpu_jpeg_test; timeout 120 $bin/surface_kernel_test; timeout 120 $bin/worker_test --gtest_filter="ModelRunnerTest.*") > $OUT/unit.log 2>&1; grep -E "PASSED|FAILED|SKIPPED" $OUT/unit.log
  (cd tests/integration && timeout 480 python3 -m unittest -v ${GPU_TESTS:-test_gpu} > $OUT/gputest.log 2>&1); grep -E "ok$|FAIL|ERROR|Error:|Ran|OK|skip|batch [0-9]+: tally" $OUT/gputest.log | tail -30
  echo "tests done at $(( $(date +%s) - t_start )) s"
fi
data
P="--model $work/lr_png.pt --manifest $work/png/manifest.csv"
J="--model $work/lr_jpg.pt --manifest $work/jpg/manifest.csv"
if has probes; then
  echo "== probes"
  tl=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  g++ -O2 -o /tmp/libload_probe bench/gpu/libload_probe.cc -ldl
  for mode in lazy now lazy; do echo "dlopen, $mode:"; /tmp/libload_probe $mode $tl/libc10.so $tl/libc10_cuda.so $tl/libtorch_cpu.so $tl/libtorch_cuda.so $tl/libtorch.so; done
  for k in 1 2 3; do /usr/bin/time -f "tally-worker --version: %e s wall, %U user %S sys, %F major %R minor faults" $bin/tally-worker --version 2>&1 | tail -1; done
  LD_DEBUG=statistics $bin/tally-worker --version 2>&1 | grep -E "total startup|relocation processing|load time|number of relocations|final number" | sed 's/^ *[0-9]*: *//' | head -8
  ldd $bin/tally-worker | wc -l
  python3 bench/gpu/first_pass_probe.py $work/lr_png.pt 2>&1 | grep -v Warning | head -60
fi
if has timeline; then
  echo "== timeline: --channels-last off; the session's start-up changes each turned off once"
  ceiling
  rm -rf $XDG_CACHE_HOME
  for k in 1 2 3; do TALLY_PIPELINE_PROFILE=1 LINES=${TL_LINES:-14} run off-$k $P --metrics dice --channels-last off; done
  for k in $(seq ${AB_RUNS:-2}); do  # AB_RUNS=0: no A/B runs.
    TALLY_EARLY_CUDA=0 LINES=0 run off-no-early-cuda-$k $P --metrics dice --channels-last off
    LINES=0 run off-no-device-warm-up-$k $P --metrics dice --channels-last off --worker-flags=--warm_up_device=false
    TALLY_EARLY_CUDA=0 LINES=0 run off-none-of-them-$k $P --metrics dice --channels-last off --worker-flags=--warm_up_device=false,--warmup_batches=2
  done
  for v in off-none-of-them-1 off-2; do [ -d $work/out/$v ] || continue; cmp -s $work/out/off-1/per_image.csv $work/out/$v/per_image.csv && echo "per_image.csv: off-1 = $v" || echo "per_image.csv: off-1 DIFFERS from $v"; done
  echo "== default auto: a network's first run here, then a retrained checkpoint of it (other weights)"
  LINES=14 run auto-1 $P --metrics dice
  LINES=3 run auto-retrained --model $work/lr_jpg.pt --manifest $work/png/manifest.csv --metrics dice
fi
if has decode4; then
  echo "== 4 decode threads, JPEG (the lease target: new default, then the old 4 batches)"
  ceiling
  for k in 1 2; do for d in cpu gpu; do TALLY_PIPELINE_PROFILE=1 run t4-$d-$k $J --metrics dice --worker-threads 4 --decode $d --channels-last off; grep -h "profile" $work/out/t4-$d-$k/.tally/worker-0.log | cut -c 25- | sed 's/^/   /' | head -4; done; done
  for d in cpu gpu; do TALLY_LEASE_TARGET_ROWS=128 run t4-$d-old-target $J --metrics dice --worker-threads 4 --decode $d --channels-last off; done
  run t4-auto $J --metrics dice --worker-threads 4 --decode auto --channels-last off
  cmp -s $work/out/t4-cpu-1/per_image.csv $work/out/t4-cpu-2/per_image.csv && echo "cpu decode: two runs identical"
  cmp -s $work/out/t4-gpu-1/per_image.csv $work/out/t4-gpu-old-target/per_image.csv && echo "gpu decode: identical with either lease target"
fi
python3 -c "
rows=open('$work/png/manifest.csv').read().splitlines(); print(rows[0]); [print(r) for _ in range(10) for r in rows[1:]]" > $work/png/m32000.csv
if has long; then
  echo "== 32 000 rows, default flags: a network's first run here (fresh cache), then a retrained checkpoint"
  export XDG_CACHE_HOME=$work/cache32k; rm -rf $XDG_CACHE_HOME
  LINES=6 run lr-32000-first --model $work/lr_png.pt --manifest $work/png/m32000.csv --metrics dice
  grep -h "layout trial\|channels-last" $work/out/lr-32000-first/.tally/worker-0.log | cut -c 25- | sed 's/^/   /' | head -4
  run lr-32000-retrained --model $work/lr_jpg.pt --manifest $work/png/m32000.csv --metrics dice
  run lr-32000-off --model $work/lr_png.pt --manifest $work/png/m32000.csv --metrics dice --channels-last off
fi
if has python; then
  echo "== Python backend (LRASPP, random weights) vs the same network as TorchScript, 3200 PNG"
  python3 bench/gpu/export_models.py $work/models lraspp > /dev/null 2>&1
  for k in 1 2; do
    run py-$k --model bench/gpu/torchvision_model.py --model-option arch=lraspp --manifest $work/png/manifest.csv --metrics dice
    run ts-$k --model $work/models/lraspp.pt --manifest $work/png/manifest.csv --metrics dice --channels-last off
  done
fi
if has dl32k; then
  echo "== 32 000 rows, DeepLabV3 bf16, default flags: its first run here (fresh cache), then with the kept trial"
  python3 bench/gpu/export_models.py $work/models deeplabv3 > /dev/null 2>&1
  export XDG_CACHE_HOME=$work/cache-dl32k; rm -rf $XDG_CACHE_HOME
  run dl-32000-first --model $work/models/deeplabv3.pt --precision bf16 --manifest $work/png/m32000.csv --metrics dice
  grep -h "layout trial\|channels-last" $work/out/dl-32000-first/.tally/worker-0.log | cut -c 25- | sed 's/^/   /' | head -4
  run dl-32000-kept --model $work/models/deeplabv3.pt --precision bf16 --manifest $work/png/m32000.csv --metrics dice
  cmp -s $work/out/dl-32000-first/per_image.csv $work/out/dl-32000-kept/per_image.csv && echo "per_image.csv: first = kept" || echo "per_image.csv: first DIFFERS from kept"
fi
if has beside; then
  echo "== the layout trial beside the evaluation, a network's first run (fresh cache) vs the fixed layout"
  python3 bench/gpu/export_models.py $work/models deeplabv3 > /dev/null 2>&1
  for m in "dl $work/models/deeplabv3.pt --precision bf16" "lr $work/lr_png.pt"; do
    set -- $m; name=$1; shift
    export XDG_CACHE_HOME=$work/cache-$name; rm -rf $XDG_CACHE_HOME
    run $name-first --model "$@" --manifest $work/png/manifest.csv --metrics dice
    grep -h "layout trial\|channels-last" $work/out/$name-first/.tally/worker-0.log | cut -c 25- | sed 's/^/   /' | head -4
    run $name-kept --model "$@" --manifest $work/png/manifest.csv --metrics dice
    layout=$(python3 -c "import json; print(json.load(open('$work/out/$name-first/report.json'))['channels_last'])")
    run $name-fixed --model "$@" --manifest $work/png/manifest.csv --metrics dice --channels-last $layout
    for v in kept fixed; do cmp -s $work/out/$name-first/per_image.csv $work/out/$name-$v/per_image.csv && echo "per_image.csv: $name-first = $name-$v" || echo "per_image.csv: $name-first DIFFERS from $name-$v"; done
  done
fi
if has held; then
  echo "== progress of a network's first run (fresh cache; session 10): when held rows show, when results come"
  for k in 1 2; do
    export XDG_CACHE_HOME=$work/cache-held-$k; rm -rf $XDG_CACHE_HOME
    t0=$(date +%s.%N)
    $bin/tally run --out $work/out/held-$k --gpus 0 --batch-size 32 --model $work/lr_png.pt --manifest $work/png/manifest.csv \
      --metrics dice 2>&1 >/dev/null | python3 -c '
import sys, time
t0 = float(sys.argv[1])
for line in sys.stdin: print(f"   {time.time() - t0:6.2f} s  {line.rstrip()}", flush=True)' $t0
  done
fi
echo "all done at $(( $(date +%s) - t_start )) s"
