#!/usr/bin/env bash
# The real pycocotools (cocodataset/cocoapi, from its source, built with the box's Cython and numpy 2)
# timed on a COCO set: load (COCO + loadRes) + evaluate + accumulate + summarize, segm. Its source
# travels in a git-ignored folder (the box has no package registry); the patches only let it build and
# import there: numpy 2's NPY_ARRAY_OWNDATA (as pycocotools 2.0.8 did), np.float -> float, matplotlib
# imported only by showAnns. Nothing of it is part of Tally.
#   bash bench/gpu/tools/pycocotools_anchor.sh SRC_DIR GT.json RESULTS.json [CPU_LIST]
set -euo pipefail
src=$1 gt=$2 results=$3 cpus=${4:-}
work=/tmp/pycocotools_anchor
rm -rf "$work" && cp -r "$src" "$work"
cd "$work/PythonAPI"
sed -i 's/np\.NPY_OWNDATA/np.NPY_ARRAY_OWNDATA/' pycocotools/_mask.pyx
sed -i 's/dtype=np\.float)/dtype=float)/' pycocotools/cocoeval.py
sed -i 's/^import matplotlib.pyplot as plt$/plt = None/; s/^from matplotlib.collections import PatchCollection$//; s/^from matplotlib.patches import Polygon$//' pycocotools/coco.py
python3 setup.py build_ext --inplace > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
cat > "$work/run.py" <<'PY'
import sys, time, json
t0 = time.time()
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
gt = COCO(sys.argv[1]); dt = gt.loadRes(sys.argv[2]); t1 = time.time()
e = COCOeval(gt, dt, 'segm'); e.evaluate(); t2 = time.time(); e.accumulate(); t3 = time.time(); e.summarize(); t4 = time.time()
print(json.dumps({"load": t1 - t0, "evaluate": t2 - t1, "accumulate": t3 - t2, "summarize": t4 - t3, "total": t4 - t0,
                  "AP": e.stats[0], "AP50": e.stats[1], "AR100": e.stats[8]}))
PY
PYTHONPATH="$work/PythonAPI" ${cpus:+taskset -c $cpus} python3 "$work/run.py" "$gt" "$results" 2>&1 | tail -1
