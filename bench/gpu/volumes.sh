#!/usr/bin/env bash
# Suite `volumes`: 3D volumes end to end on one GPU. Stages:
#   model    bench/volume_model_bench.py: 8 BraTS-sized volumes (240x240x155, 4 channels) through a
#            scripted 3D CNN with 128^3 sliding windows (overlap 0.5), z-score, Dice + hd95 + nsd:
#            `tally run` against the plain PyTorch loop a researcher writes (MONAI's sliding window
#            on the GPU, scipy's surface metrics)
#   surface  one volume's surface distances on the CPU (tally-bench-cpu --mode surface3d): a
#            160x192x160 and a 512x512x300 pair (5 labels), 1 thread and every core
#   data     only the volumes of surface (for gpusurface alone)
#   gpusurface  the GPU path on both sizes with 5 and 2 labels: surface_kernel_test (bit for bit
#            against the CPU), tally-bench-cpu --device 0, cupyx's and MONAI's CPU path
#            (bench/volume_bench.py's), and a prediction job on a GPU worker against a CPU one
# (Every kind of prediction, speckled and fragmented ones included, against cupyx: suite surfaces3d.)
#   bench/gpu/run.sh volumes [STAGES]    (build,model,surface,data,gpusurface; default build,model,surface,gpusurface)
# Settings: VOLUMES (model stage, default 8).
set -uo pipefail
stages=${1:-build,model,surface,gpusurface}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/volumes}; mkdir -p "$work"
build_stage
tests_stage
cores=$(nproc)
echo "cores: $cores; $(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if has model; then
  python3 bench/volume_model_bench.py --bin $bin --work $work/vmb --volumes ${VOLUMES:-8} > $OUT/model.log 2>&1
  tail -6 $OUT/model.log
  cp $work/vmb/results.json $OUT/model_results.json 2>/dev/null
  cp -r $work/vmb/tally/.tally $OUT/model_tally_logs 2>/dev/null
  echo "model: $(( $(date +%s) - t_start )) s"
fi
if has surface || has data; then
  python3 - $work/sv <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, "bench")
from volume_bench import organs, predicted, write_nifti
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(3)
for labels in (5, 2):
  for shape in ((160, 192, 160), (512, 512, 300)):
    ref = organs(rng, shape, labels); pred = predicted(rng, ref)
    name = "x".join(map(str, shape)) + ("" if labels == 5 else f"_{labels}")
    write_nifti(f"{d}/ref_{name}.nii.gz", ref, (0.8, 0.8, 2.5)); write_nifti(f"{d}/pred_{name}.nii.gz", pred, (0.8, 0.8, 2.5))
PY
fi
if has surface; then
  for name in 160x192x160 512x512x300; do
    for t in 1 4 $cores; do
      $bin/tally-bench-cpu --mode surface3d --pred $work/sv/pred_$name.nii.gz --ref $work/sv/ref_$name.nii.gz --threads $t --iters 3
    done
  done
  echo "surface: $(( $(date +%s) - t_start )) s"
fi
if has gpusurface; then
  $src/build-gpu/bin/surface_kernel_test --gtest_filter='Surface3D*' 2>&1 | tail -4
  TALLY_SURFACE_MAX_BOX=1 $src/build-gpu/bin/surface_kernel_test --gtest_filter='Surface3D*' 2>&1 | tail -4
  for name in 160x192x160 512x512x300 160x192x160_2 512x512x300_2; do
    for t in 1 $cores; do
      $bin/tally-bench-cpu --mode surface3d --pred $work/sv/pred_$name.nii.gz --ref $work/sv/ref_$name.nii.gz --threads $t --iters 5 --device 0
    done
    # Where a warm call's time goes (the last of three calls).
    TALLY_SURFACE3D_PROFILE=1 $bin/tally-bench-cpu --mode surface3d --pred $work/sv/pred_$name.nii.gz --ref $work/sv/ref_$name.nii.gz --threads $cores --iters 3 --device 0 2>&1 | grep profile | tail -6
  done
  python3 - $work/sv <<'PY'
import gzip, struct, sys, time
import numpy as np
sys.path.insert(0, "bench")
from volume_bench import monai_hd95_nsd
from scipy import ndimage
def read(path):
    raw = gzip.open(path).read(); dims = struct.unpack_from("<8h", raw, 40)
    return np.frombuffer(raw, np.uint8, count=dims[1] * dims[2] * dims[3], offset=352).reshape(dims[1:4], order="F")
d = sys.argv[1]
for name in ("160x192x160", "512x512x300", "160x192x160_2", "512x512x300_2"):
    p, r = read(f"{d}/pred_{name}.nii.gz"), read(f"{d}/ref_{name}.nii.gz")
    labels = 2 if name.endswith("_2") else 5
    try:
        import cupy as cp
        from cupyx.scipy import ndimage as cnd
        gp, gr = cp.asarray(p), cp.asarray(r)
        monai_hd95_nsd(gp, gr, labels, (0.8, 0.8, 2.5), 1.0, xp=cp, edt=cnd.distance_transform_edt, erode=cnd.binary_erosion)
        cp.cuda.Device().synchronize(); best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            monai_hd95_nsd(gp, gr, labels, (0.8, 0.8, 2.5), 1.0, xp=cp, edt=cnd.distance_transform_edt, erode=cnd.binary_erosion)
            cp.cuda.Device().synchronize(); best = min(best, time.perf_counter() - t0)
        print(f"cupyx (MONAI's GPU path) {name}: {best:.4f} s (best of 3, volumes already on the GPU)")
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            gp, gr = cp.asarray(p), cp.asarray(r)
            monai_hd95_nsd(gp, gr, labels, (0.8, 0.8, 2.5), 1.0, xp=cp, edt=cnd.distance_transform_edt, erode=cnd.binary_erosion)
            cp.cuda.Device().synchronize(); best = min(best, time.perf_counter() - t0)
        print(f"cupyx (MONAI's GPU path) {name}: {best:.4f} s (best of 3, upload of both volumes included)")
    except Exception as e:
        print(f"cupyx {name}: not run ({type(e).__name__}: {e})")
    if name == "160x192x160":
        t0 = time.perf_counter(); monai_hd95_nsd(p, r, 5, (0.8, 0.8, 2.5), 1.0)
        print(f"MONAI CPU path (scipy) {name}: {time.perf_counter() - t0:.3f} s")
PY
  # A prediction job on a GPU worker (surfaces on the device) against a CPU worker: identical.
  { echo "id,mask,prediction"; for i in 0 1 2 3; do echo "v$i,$work/sv/ref_160x192x160.nii.gz,$work/sv/pred_160x192x160.nii.gz"; done; } > $work/sv/m.csv
  $bin/tally run --manifest $work/sv/m.csv --out $work/sv/gpu --gpus 0 --metrics dice,hd,hd95,assd,nsd > $OUT/pred_gpu.log 2>&1 || tail -5 $OUT/pred_gpu.log
  $bin/tally run --manifest $work/sv/m.csv --out $work/sv/cpu --metrics dice,hd,hd95,assd,nsd > $OUT/pred_cpu.log 2>&1 || tail -5 $OUT/pred_cpu.log
  cmp $work/sv/gpu/per_image.csv $work/sv/cpu/per_image.csv && echo "prediction job: GPU worker per_image.csv identical to the CPU worker's"
  grep -h "surface distances on cuda" $work/sv/gpu/.tally/worker-*.log | head -3
  python3 -c "import json; r=json.load(open('$work/sv/gpu/report.json')); print('gpu worker:', [(w['device'], round(w['images_per_second'],2)) for w in r['workers']])"
  echo "gpusurface: $(( $(date +%s) - t_start )) s"
fi
