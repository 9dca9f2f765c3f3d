#!/usr/bin/env bash
# Issue 31 (3D end to end) on the GPU box. Stages (comma list; default all):
#   build    scripts/gpu/build.sh build-gpu
#   model    bench/volume_model_bench.py: 8 BraTS-sized volumes (240x240x155, 4 channels) through a
#            3D CNN with 128^3 sliding windows, Tally vs the plain PyTorch loop
#   surface  tally-bench-cpu --mode surface3d: one 160x192x160 and one 512x512x300 pair (4 labels),
#            1 thread and every core (a volume's classes and slabs over the threads)
#   OUT=/tmp/logs bash bench/gpu/issue31.sh [STAGES]
set -uo pipefail
stages=${1:-build,model,surface}
has() { [[ ",$stages," == *",$1,"* ]]; }
t_start=$(date +%s)
src=$PWD; work=/tmp/i31; mkdir -p "$work"
export DEB_DIR=$src/.gpu/debs
if has build; then
  scripts/gpu/build.sh build-gpu > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -40; tail -20 $OUT/build.log; exit 1; }
  echo "build: $(( $(date +%s) - t_start )) s"
fi
bin=$src/build-gpu/bin
cores=$(nproc)
echo "cores: $cores; $(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if has model; then
  python3 bench/volume_model_bench.py --bin $bin --work $work/vmb --volumes ${VOLUMES:-8} > $OUT/model.log 2>&1
  tail -6 $OUT/model.log
  cp $work/vmb/results.json $OUT/model_results.json 2>/dev/null
  cp -r $work/vmb/tally/.tally $OUT/model_tally_logs 2>/dev/null
  echo "model: $(( $(date +%s) - t_start )) s"
fi
if has surface; then
  python3 - $work/sv <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, "bench")
from volume_bench import organs, predicted, write_nifti
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(3)
for shape in ((160, 192, 160), (512, 512, 300)):
    ref = organs(rng, shape, 5); pred = predicted(rng, ref)
    name = "x".join(map(str, shape))
    write_nifti(f"{d}/ref_{name}.nii.gz", ref, (0.8, 0.8, 2.5)); write_nifti(f"{d}/pred_{name}.nii.gz", pred, (0.8, 0.8, 2.5))
PY
  for name in 160x192x160 512x512x300; do
    for t in 1 4 $cores; do
      $bin/tally-bench-cpu --mode surface3d --pred $work/sv/pred_$name.nii.gz --ref $work/sv/ref_$name.nii.gz --threads $t --iters 3
    done
  done
  echo "surface: $(( $(date +%s) - t_start )) s"
fi
