# What the suites share (bench/gpu/run.sh sources it before a suite): `has STAGE`, src (the
# checkout), bin (the GPU build's binaries), OUT (logs, default /tmp/tally-bench/logs), WORK (data,
# default /tmp/tally-bench/SUITE), DEB_DIR (the GPU build's Debian packages, carried in .gpu/),
# t_start, and the helpers below. Run from the repository root.
has() { [[ ",$stages," == *",$1,"* ]]; }
src=$PWD
export DEB_DIR=${DEB_DIR:-$src/.gpu/debs}
OUT=${OUT:-/tmp/tally-bench/logs}
mkdir -p "$OUT"
t_start=$(date +%s)
bin=${BIN:-$src/build-gpu/bin}
py=${PYTHON:-python3}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

# Stage `build`: scripts/gpu/build.sh into build-gpu, its log in $OUT/build.log; a failed build
# prints its errors and the log's tail and ends the suite.
build_stage() {
  has build || return 0
  scripts/gpu/build.sh build-gpu > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t_start )) s"
}

# The benchmark models as TorchScript in DIR (torchvision's LRASPP-MobileNetV3 and DeepLabV3-ResNet50,
# 2 classes, seeded random weights: tools/export_models.py).
export_models() {  # DIR [ARCH...]
  [ -f "$1/lraspp.pt" ] && [ -f "$1/deeplabv3.pt" ] && return 0
  $py bench/gpu/tools/export_models.py "$@" > "$OUT/export.log" 2>&1 || tail -5 "$OUT/export.log"
}

# COUNT photograph-like 512x512 images with masks (tally-make-dataset --noise 4: smooth shading,
# textured shapes, sensor noise of sigma 4) in DIR as FORMAT (png, or jpeg at quality 90).
make_images() {  # DIR COUNT FORMAT
  [ -f "$1/manifest.csv" ] && [ "$(($(wc -l < "$1/manifest.csv") - 1))" -eq "$2" ] && return 0
  local q=(); [ "$3" = jpeg ] && q=(--quality 90)
  "$bin/tally-make-dataset" --out "$1" --count "$2" --size 512 --format "$3" "${q[@]}" --noise 4 > /dev/null
}

# One line of JSON from a finished job's report: rows, wall, the workers' steady rate summed, first batches.
summary() {  # REPORT_DIR LABEL
  [ -f "$1/report.json" ] || { echo "$2: no report in $1"; return 1; }
  $py - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1] + "/report.json")); w = r["workers"]
print(json.dumps({"run": sys.argv[2], "images": r["images_evaluated"], "failed": r["images_failed"],
                  "wall_s": round(r["wall_seconds"], 3), "steady": round(sum(x["images_per_second"] for x in w), 1),
                  "wall_rate": round(r["images_per_second"], 1),
                  "first_batch_s": sorted(round(x["first_batch_seconds"], 3) for x in w),
                  "decode_threads": [x.get("decode_threads") for x in w],
                  "compile": {k: r["compile"][k] for k in
                              ("ran", "compile_seconds", "cache_hits", "eager_ms_per_batch", "compiled_ms_per_batch",
                               "argmax_changed_pixels")} if r.get("compile") else None}))
PY
}

# Whether two per_image.csv files hold the same rows, the image column aside (tar members and loose
# files name their images differently).
same_rows() {  # A B
  $py - "$1" "$2" <<'PY'
import csv, sys
def rows(p):
    with open(p) as f:
        return [{k: v for k, v in x.items() if k != "image"} for x in csv.DictReader(f)]
print("identical" if rows(sys.argv[1]) == rows(sys.argv[2]) else "DIFFERENT")
PY
}

# Stage `tests`: the GPU build's device tests (nvJPEG, the surface kernels, the model runner) and
# tests/integration/test_gpu.py; their logs in $OUT.
tests_stage() {
  has tests || return 0
  (timeout 120 "$bin/gpu_jpeg_test"; timeout 180 "$bin/surface_kernel_test"; timeout 120 "$bin/worker_test" --gtest_filter="ModelRunnerTest.*") > "$OUT/unit.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED" "$OUT/unit.log"
  (export TALLY_BIN=$bin TALLY_SOURCE=$src PYTHONPATH=$src/python:$src/build-gpu/python
   cd tests/integration && timeout 420 python3 -m unittest -v ${GPU_TESTS:-test_gpu} > "$OUT/gputest.log" 2>&1)
  grep -E "ok$|FAIL|ERROR|Error:|Ran|OK|skip" "$OUT/gputest.log" | tail -25
  echo "tests: $(( $(date +%s) - t_start )) s"
}
