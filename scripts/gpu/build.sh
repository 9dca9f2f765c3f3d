#!/usr/bin/env bash
# Builds Tally on a GPU box whose LibTorch is the one inside a pip `torch` wheel (CUDA), with
# Debian's gRPC/Protobuf/Abseil/codec packages unpacked into a private prefix (no root, no apt).
#   On a Debian/Ubuntu machine with apt:   scripts/gpu/fetch-debs.sh .gpu/debs
#   On the GPU box (python3 has torch):    scripts/gpu/build.sh [BUILD_DIR]
# Afterwards BUILD_DIR/bin holds tally, tallyd and tally-worker (RPATH points into the prefix).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
deb_dir=${DEB_DIR:-$src/.gpu/debs}
# shellcheck source=unpack-and-configure.sh
source "$src/scripts/gpu/unpack-and-configure.sh" "$deb_dir" "$src" "$build" -DCMAKE_BUILD_TYPE=Release \
  -DTALLY_PYTHON="$(command -v python3)"
cmake --build "$build" -j "$(nproc)"
