#!/usr/bin/env bash
# One command from a fresh Debian bookworm machine to a finished evaluation: installs what building
# and running Tally need (not the test suite's packages), builds the three programs (no tests, no
# fuzzers) and evaluates the bundled demo model on the bundled sample dataset with 2 CPU workers.
# Reports land in demo-results/ (or the folder given as $1).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/demo-results}
"$src/scripts/install-deps.sh" build
TALLY_CMAKE_ARGS="-DTALLY_BUILD_TESTS=OFF ${TALLY_CMAKE_ARGS:-}" \
  "$src/scripts/build.sh" "$src/build" tally tallyd tally-worker
"$src/build/bin/tally" run --model "$src/examples/demo/model.pt" --manifest "$src/examples/demo/manifest.csv" \
  --out "$out" --workers 2
