#!/usr/bin/env bash
# Suite `surfaces3d`: 3D surface distances on the GPU for every kind of prediction models make
# (bench/volume_bench.py --prediction kinds: smooth, speckled, fragmented, empty-class, filling) of one
# reference of SHAPE (x,y,z; default 512,512,300) with LABELS labels (default 5; spacing 0.8 x 0.8 x
# 2.5): Tally's device path (tally-bench-cpu --mode surface3d --device 0, best of 5, volumes in host
# memory: the upload is counted) against cupyx's EDT path (MONAI's monai_hd95_nsd with
# cupyx.scipy.ndimage, volumes already on the GPU, best of 3) and one cupyx distance transform of the
# whole volume (the bound for the far transform of a direction), each kind's profile
# (TALLY_SURFACE3D_PROFILE=1), and the device path's bit-for-bit tests (surface_kernel_test).
#   bench/gpu/run.sh surfaces3d [STAGES]    (build,test,data,tally,cupyx; default all)
# Settings: LABELS, SHAPE, KINDS ("speckled filling"), AB ("VAR=value ...": each kind again with each
# setting), FAR_CELLS_AB=N (each kind again with the far transform's batches limited to N cells).
set -uo pipefail
stages=${1:-build,test,data,tally,cupyx}
source "$(dirname "$0")/lib.sh"
shape=${SHAPE:-512,512,300}
work=${WORK:-/tmp/tally-bench/surfaces3d}/${LABELS:-5}_${shape//,/x}; mkdir -p "$work"
build_stage
tests_stage
kinds=${KINDS:-smooth speckled fragmented empty-class filling}
echo "cores: $(nproc); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if has test; then
  $bin/surface_kernel_test --gtest_filter='Surface3D*' 2>&1 | grep -E "OK|FAILED|PASSED|Failure" | tail -6
  TALLY_SURFACE_MAX_BOX=1 $bin/surface_kernel_test --gtest_filter='Surface3D*' 2>&1 | tail -2
  TALLY_SURFACE_MAX_BOX=1 TALLY_SURFACE3D_FAR_CELLS=1 $bin/surface_kernel_test --gtest_filter='Surface3D*' 2>&1 | tail -2
fi
if has data; then
  python3 - "$work" ${LABELS:-5} $shape $kinds <<'PY'
import sys, time
import numpy as np
sys.path.insert(0, "bench")
from volume_bench import organs, predicted, write_nifti
work, labels, shape, kinds = sys.argv[1], int(sys.argv[2]), tuple(map(int, sys.argv[3].split(","))), sys.argv[4:]
t0 = time.time()
ref = organs(np.random.default_rng(3), shape, labels)
write_nifti(f"{work}/ref.nii.gz", ref, (0.8, 0.8, 2.5))
for kind in kinds:
    pred = predicted(np.random.default_rng(4), ref, kind)
    write_nifti(f"{work}/pred_{kind}.nii.gz", pred, (0.8, 0.8, 2.5))
print(f"data: {time.time() - t0:.1f} s")
PY
fi
if has tally; then
  for kind in $kinds; do
    $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 5 --device 0 | sed "s/^/$kind: /"
    TALLY_SURFACE3D_PROFILE=1 $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 2 --device 0 2>&1 | grep "profile:" | tail -6 | sed "s/^/$kind: /"
    [ -n "${FAR_CELLS_AB:-}" ] && TALLY_SURFACE3D_FAR_CELLS=$FAR_CELLS_AB TALLY_SURFACE3D_PROFILE=1 $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 5 --device 0 2>&1 | grep -v "profile: box searches" | sed "s/^/$kind (far cells $FAR_CELLS_AB): /"
    [ -n "${FAR_CELLS_AB:-}" ] && TALLY_SURFACE3D_FAR_CELLS=$FAR_CELLS_AB TALLY_SURFACE3D_PROFILE=1 $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 2 --device 0 2>&1 | grep "profile: box" | tail -1 | sed "s/^/$kind (far cells $FAR_CELLS_AB): /"
    for ab in ${AB:-}; do
      env $ab $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 5 --device 0 | sed "s/^/$kind ($ab): /"
      env $ab TALLY_SURFACE3D_PROFILE=1 $bin/tally-bench-cpu --mode surface3d --pred $work/pred_$kind.nii.gz --ref $work/ref.nii.gz --threads $(nproc) --iters 2 --device 0 2>&1 | grep "profile: box" | tail -1 | sed "s/^/$kind ($ab): /"
    done
  done
fi
if has cupyx; then
  python3 - "$work" ${LABELS:-5} $kinds <<'PY'
import gzip, struct, sys, time
import numpy as np
sys.path.insert(0, "bench")
from volume_bench import monai_hd95_nsd
import cupy as cp
from cupyx.scipy import ndimage as cnd
def read(path):
    raw = gzip.open(path).read(); dims = struct.unpack_from("<8h", raw, 40)
    return np.frombuffer(raw, np.uint8, count=dims[1] * dims[2] * dims[3], offset=352).reshape(dims[1:4], order="F")
work, labels, kinds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
gr = cp.asarray(read(f"{work}/ref.nii.gz"))
for kind in kinds:
    gp = cp.asarray(read(f"{work}/pred_{kind}.nii.gz"))
    run = lambda: monai_hd95_nsd(gp, gr, labels, (0.8, 0.8, 2.5), 1.0, xp=cp, edt=cnd.distance_transform_edt, erode=cnd.binary_erosion)
    run(); cp.cuda.Device().synchronize(); best = 1e9
    for _ in range(3):
        t0 = time.perf_counter(); run(); cp.cuda.Device().synchronize(); best = min(best, time.perf_counter() - t0)
    print(f"{kind}: cupyx (MONAI's GPU path) {best:.4f} s (best of 3, volumes already on the GPU)")
# The issue's bound for the worst case: one exact distance transform of a box (here the whole volume).
mask = gr != 0
cnd.distance_transform_edt(mask, sampling=(0.8, 0.8, 2.5)); cp.cuda.Device().synchronize(); best = 1e9
for _ in range(3):
    t0 = time.perf_counter(); cnd.distance_transform_edt(mask, sampling=(0.8, 0.8, 2.5)); cp.cuda.Device().synchronize()
    best = min(best, time.perf_counter() - t0)
print(f"one cupyx distance_transform_edt of the whole {'x'.join(map(str, mask.shape))} volume: {best:.4f} s (best of 3)")
PY
fi
echo "total: $(( $(date +%s) - t_start )) s"
