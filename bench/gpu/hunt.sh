#!/usr/bin/env bash
# Runs one GPU test again and again, for a stall that comes and goes: a run past HANG_S seconds
# gets every worker's stacks (kill -QUIT), their logs copied to $OUT/hang-K and the executable's
# frames named with addr2line.
#   OUT=/tmp/logs TEST=test_decode_auto_decodes_every_row_with_the_jobs_choice RUNS=25 BUDGET=380 \
#     HANG_S=45 bash bench/gpu/hunt.sh
set -u
[ -x build-gpu/bin/tally-worker ] || scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export TALLY_BIN=$PWD/build-gpu/bin TALLY_SOURCE=$PWD PYTHONPATH=$PWD/python:$PWD/build-gpu/python
bin=$PWD/build-gpu/bin/tally-worker
cd tests/integration
T0=$(date +%s)
for k in $(seq ${RUNS:-20}); do
  [ $(( $(date +%s) - T0 )) -gt ${BUDGET:-400} ] && break
  export XDG_CACHE_HOME=/tmp/hunt-cache-$k; rm -rf /tmp/tally-gpu-*
  s=$(date +%s)
  python3 -m unittest test_gpu.GpuTest.${TEST} > $OUT/run-$k.log 2>&1 &
  pid=$!
  hung=0
  while kill -0 $pid 2>/dev/null; do
    sleep 1
    if [ $(( $(date +%s) - s )) -gt ${HANG_S:-45} ]; then hung=1; break; fi
  done
  if [ $hung = 1 ]; then
    echo "run $k: HUNG after ${HANG_S:-45} s"
    pkill -QUIT -f "bin/tally-worker"; sleep 3
    mkdir -p $OUT/hang-$k
    for f in $(find /tmp/tally-gpu-* -name "*.log" 2>/dev/null); do cp $f $OUT/hang-$k/$(echo $f | sed 's|/tmp/||; s|/|_|g' | cut -c1-100); done
    for f in $OUT/hang-$k/*worker*.log; do
      grep -o "tally-worker(+0x[0-9a-f]*)" $f | sort -u | sed 's/.*(+\(0x[0-9a-f]*\))/\1/' | while read a; do echo "$a $(addr2line -f -C -e $bin $a | head -1 | cut -c1-120)"; done > $f.sym
    done
    kill -9 $pid; pkill -9 -f "bin/tally"; break
  fi
  wait $pid; echo "run $k: rc $? $(( $(date +%s) - s )) s"
done
