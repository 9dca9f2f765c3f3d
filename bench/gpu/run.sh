#!/usr/bin/env bash
# Tally's GPU benchmarks: one runner, a named suite each (BENCHMARKS.md has their figures, each with
# the command that reproduces it). From the repository root of a GPU box, after scripts/gpu/fetch-debs.sh
# left the build's Debian packages in .gpu/debs:
#
#   bench/gpu/run.sh SUITE [STAGES]          e.g.  OUT=/tmp/logs bench/gpu/run.sh throughput
#
# Suites (each file says its stages and settings; STAGES is a comma list, default the suite's own):
#   throughput   one GPU: Tally's steady rate against the model-only ceiling and a PyTorch DataLoader
#   scaling      1, 2 and every GPU, warm (tallyd and workers up) and cold (`tally run`)
#   first_run    a network's first run: start to first results, the layout trial
#   decode       JPEG on the GPU (nvJPEG) against the CPU; the box's decode rate per format
#   shards       tar shards (few and many) against the same files loose
#   surfaces3d   3D surface distances on the GPU against cupyx (MONAI's GPU path)
#   volumes      3D volumes into a model with sliding windows, against a plain PyTorch loop
#   coco         the whole COCO command against the real pycocotools
#   python       the Python model backend against TorchScript; a model over two GPUs
#   compile      Python models compiled (--compile) and eager, against the model-only rates
#   store        the prediction store: a job with an empty store, with a full one, without
#   follow       following training: checkpoints raced against the best or not, the lag to a curve point
#   groups       --group-by and --find-slices (the worker's row properties) against a run without
#   calibration  --metrics calibration (probability histograms on the GPU) against a run without
# Every suite builds first (stage `build`, scripts/gpu/build.sh into build-gpu) unless its STAGES leave
# `build` out, and runs the GPU tests with stage `tests` (lib.sh tests_stage);
# logs go to $OUT (default /tmp/tally-bench/logs), data to $WORK (default /tmp/tally-bench/SUITE).
set -uo pipefail
suite=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$suite" ] || [ ! -f "$here/$suite.sh" ] || [ "$suite" = lib ] || [ "$suite" = run ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
export WORK=${WORK:-/tmp/tally-bench/$suite}
mkdir -p "$WORK"
exec bash "$here/$suite.sh" "${@:2}"
