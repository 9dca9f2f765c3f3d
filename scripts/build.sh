#!/usr/bin/env bash
# Configures and builds Tally (CPU, Debian's LibTorch) into BUILD_DIR (default: build/).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TALLY_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
