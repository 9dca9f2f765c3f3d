#!/usr/bin/env bash
# One command from a fresh Debian bookworm machine to the whole test suite: installs the
# dependencies (the build's and the tests'), builds Tally with its tests, and runs them through ctest.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
"$src/scripts/install-deps.sh" test
TALLY_CMAKE_ARGS="-DTALLY_BUILD_TESTS=ON ${TALLY_CMAKE_ARGS:-}" "$src/scripts/build.sh" "$build"
cd "$build"
ctest --output-on-failure --timeout 900 -j 2
