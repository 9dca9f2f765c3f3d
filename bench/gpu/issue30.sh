#!/usr/bin/env bash
# Issue 30 (instances) on the GPU box: COCO mask AP of a COCO-val2017-sized synthetic set (5000
# images, ~36 000 instances, 100 detections per image, compressed RLE; bench/make_coco.cc) scored
# from a results file, against the COCOeval algorithm as pycocotools runs it: pycocotools itself
# where it imports, and always the port of cocoeval.py (bench/cocoeval_port.py; numpy mask IoU).
# Every run's 12 numbers must be identical. Stages (comma list; default all):
#   build   scripts/gpu/build.sh build-gpu
#   data    tally-make-coco --images 5000
#   python  the port's (and pycocotools') evaluate + accumulate
#   tally   tally-coco-eval on 1 and all threads; tally run --coco-results with 1 worker of 1 thread,
#           1 worker of all threads, 4 workers of 4 threads (job wall: submission to report)
#   OUT=/tmp/logs bash bench/gpu/issue30.sh [STAGES]
set -uo pipefail
stages=${1:-build,data,python,tally}
source "$(dirname "$0")/lib.sh"
work=/tmp/i30; mkdir -p "$work"
build_stage
bin=$src/build-gpu/bin
cores=$(nproc)
echo "cores: $cores; $(lscpu | grep 'Model name' | sed 's/  */ /g')"
if has data; then
  $bin/tally-make-coco --out $work/set --images 5000 --detections 100
  ls -la $work/set
fi
mkdir -p $work/set/images  # A results job reads no image (thumbnails show the masks alone).
if has python; then
  python3 - $work/set > $OUT/pycocotools.json 2> $OUT/pycocotools.err <<'PY'
import json, sys, time
try:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
except Exception as e:
    print(json.dumps({"absent": str(e)})); sys.exit(0)
d = sys.argv[1]
gt = COCO(d + "/gt.json"); dt = gt.loadRes(d + "/results.json")
e = COCOeval(gt, dt, "segm")
t0 = time.perf_counter(); e.evaluate(); t1 = time.perf_counter(); e.accumulate(); t2 = time.perf_counter()
e.summarize()
print(json.dumps({"stats": [float(x) for x in e.stats], "seconds": {"evaluate": t1 - t0, "accumulate": t2 - t1}}))
PY
  echo "pycocotools: $(tail -1 $OUT/pycocotools.json | cut -c1-400)"
  /usr/bin/time -v python3 bench/cocoeval_port.py $work/set/gt.json $work/set/results.json > $OUT/port.json 2> $OUT/port.err
  echo "port: $(python3 -c "import json; r=json.load(open('$OUT/port.json')); print(r['seconds'])") $(grep 'Maximum resident' $OUT/port.err)"
fi
if has tally; then
  for th in 1 $cores; do
    $bin/tally-coco-eval --gt $work/set/gt.json --results $work/set/results.json --threads $th --out $OUT/coco-eval-$th.json | tail -1
  done
  run() {
    local label=$1; shift
    rm -rf $work/$label
    local t0=$(date +%s.%N)
    $bin/tally run --coco $work/set/gt.json --images $work/set/images --coco-results $work/set/results.json \
      --out $work/$label "$@" > $OUT/$label.log 2>&1 || tail -3 $OUT/$label.log
    local t1=$(date +%s.%N)
    cp $work/$label/report.json $OUT/$label-report.json
    python3 -c "
import json; r=json.load(open('$work/$label/report.json'))
print('$label: command wall %.2f s, job wall %.2f s, %d images evaluated, AP %.6f' % ($t1 - $t0, r['wall_seconds'], r['images_evaluated'], r['instances']['stats']['AP']))"
  }
  run run-1x1 --workers 1 --worker-threads 1
  run run-1xN --workers 1
  run run-4x4 --workers 4 --worker-threads 4
  python3 - $OUT <<'PY'
import json, os, sys
out = sys.argv[1]
names = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"]
runs = {}
for f in sorted(os.listdir(out)):
    p = os.path.join(out, f)
    if f.endswith("-report.json"):
        runs[f] = [json.load(open(p))["instances"]["stats"][k] for k in names]
    elif f.startswith("coco-eval-") or f == "port.json" or f == "pycocotools.json":
        r = json.load(open(p))
        if "stats" in r:
            runs[f] = r["stats"]
base = runs.get("port.json")
for k, v in runs.items():
    print(f"{k}: identical to the port: {v == base}")
print("stats:", base)
PY
fi
echo "total: $(( $(date +%s) - t_start )) s"
