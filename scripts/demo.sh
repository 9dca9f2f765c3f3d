#!/usr/bin/env bash
# One command from a fresh Debian bookworm machine to a finished evaluation: installs the
# dependencies, builds Tally, and evaluates the bundled demo model on the bundled sample dataset
# with 2 CPU workers. Reports land in demo-results/ (or the folder given as $1).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/demo-results}
"$src/scripts/install-deps.sh"
"$src/scripts/build.sh" "$src/build"
"$src/build/bin/tally" run --model "$src/examples/demo/model.pt" --manifest "$src/examples/demo/manifest.csv" \
  --out "$out" --workers 2
