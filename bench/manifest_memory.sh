#!/usr/bin/env bash
# Submission cost of a large manifest: tallyd's peak memory (VmHWM), the submit time, the database
# size, and the space given back by `tally delete`.
#
#   bench/manifest_memory.sh [ROWS] [BUILD_DIR]      # default 2000000 rows, build/
#
# The manifest's files need not exist: no worker runs. Prints one table row.
set -euo pipefail
rows=${1:-2000000}
build=${2:-$(cd "$(dirname "$0")/.." && pwd)/build}
work=$(mktemp -d)
trap 'kill $tallyd 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$work/manifest.csv" "$rows" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "w") as f:
    f.write("id,image,mask\n")
    for i in range(n):
        f.write(f"case_{i:08d},images/case_{i:08d}.png,masks/case_{i:08d}.png\n")
PY
touch "$work/model.pt"
"$build/bin/tallyd" --listen 127.0.0.1:0 --port-file "$work/port" --state-dir "$work/state" >"$work/tallyd.log" 2>&1 &
tallyd=$!
while [ ! -s "$work/port" ]; do sleep 0.05; done
addr="127.0.0.1:$(cat "$work/port")"
rss_before=$(awk '/VmRSS/ {print $2}' /proc/$tallyd/status)
start=$(date +%s.%N)
job=$("$build/bin/tally" submit --server "$addr" --model "$work/model.pt" --manifest "$work/manifest.csv")
end=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print $2}' /proc/$tallyd/status)
rss=$(awk '/VmRSS/ {print $2}' /proc/$tallyd/status)
db=$(du -sk "$work/state" | cut -f1)
"$build/bin/tally" cancel "$job" --server "$addr" >/dev/null
sleep 1
"$build/bin/tally" delete "$job" --server "$addr" >/dev/null
db_after=$(du -sk "$work/state" | cut -f1)
manifest_mb=$(( $(stat -c %s "$work/manifest.csv") / 1048576 ))
printf '| rows | manifest MiB | submit s | tallyd RSS before MiB | peak RSS MiB | RSS after MiB | state dir MiB | after delete MiB |\n'
printf '|---|---|---|---|---|---|---|---|\n'
printf '| %d | %d | %.1f | %d | %d | %d | %d | %d |\n' "$rows" "$manifest_mb" "$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')" \
  $((rss_before / 1024)) $((hwm / 1024)) $((rss / 1024)) $((db / 1024)) $((db_after / 1024))
