#!/usr/bin/env bash
# Configures and builds Tally (CPU, Debian's LibTorch) into BUILD_DIR (default: build/), optimised
# without debug information (TALLY_BUILD_TYPE=RelWithDebInfo for it: a third more compile time).
#   build.sh [BUILD_DIR] [TARGET...]   with targets, builds only those (demo.sh: the three programs)
# TALLY_CMAKE_ARGS adds CMake options (demo.sh: -DTALLY_BUILD_TESTS=OFF; test.sh: ON).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
shift || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${TALLY_BUILD_TYPE:-Release}" ${TALLY_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
