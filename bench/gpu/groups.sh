#!/usr/bin/env bash
# Suite `groups`: what --group-by and --find-slices cost on one GPU (docs/reports.md "Groups"). COUNT
# photograph-like 512x512 PNGs with a `site` column through LRASPP fp32 (tools/export_models.py):
# without groups, then with `--group-by site,derived:components,derived:mean_intensity,derived:fg_fraction
# --find-slices` (the worker counts each reference's components per label and the image's mean while
# decoding it), alternated twice; each run's steady rate, and whether the scores equal the run without.
#   bench/gpu/run.sh groups [STAGES]    (build,run; default all)
# Settings: COUNT (images, default 3200).
set -uo pipefail
stages=${1:-build,run}
source "$(dirname "$0")/lib.sh"
work=${WORK:-/tmp/tally-bench/groups}; mkdir -p "$work/out"
n=${COUNT:-3200}
build_stage
if has run; then
  export_models "$work/models"
  make_images "$work/png" "$n" png
  $py - "$work/png/manifest.csv" "$work/png/sites.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
rows[0].append("site")
for i, r in enumerate(rows[1:]):
    r.append("ABCD"[i % 4])
csv.writer(open(sys.argv[2], "w", newline="")).writerows(rows)
PY
  for round in 1 2; do
    for mode in plain groups; do
      extra=(); [ "$mode" = groups ] && extra=(--group-by site,derived:components,derived:mean_intensity,derived:fg_fraction --find-slices)
      out="$work/out/${mode}_$round"
      "$bin/tally" run --model "$work/models/lraspp.pt" --manifest "$work/png/sites.csv" --out "$out" --gpus all \
        --metrics dice --batch-size 32 --precision fp32 "${extra[@]}" > "$out.log" 2>&1 || tail -20 "$out.log"
      summary "$out" "lraspp_fp32_${mode}_$round"
    done
  done
  $py - "$work/out/plain_1/per_image.csv" "$work/out/groups_1/per_image.csv" "$work/out/groups_1/groups.csv" <<'PY'
import csv, sys
def scores(p):
    with open(p) as f:
        return [(r["index"], r["class"], r["tp"], r["fp"], r["fn"], r["tn"], r["dice"]) for r in csv.DictReader(f)]
print("scores with groups against without:", "identical" if scores(sys.argv[1]) == scores(sys.argv[2]) else "DIFFERENT")
with open(sys.argv[2]) as f:
    rows = [r for r in csv.DictReader(f) if r["class"] == "1"]
comps = sorted(int(float(r["components"])) for r in rows)
print("class 1 components per image: median", comps[len(comps) // 2], "max", comps[-1],
      "; mean intensity of the first row", rows[0]["mean_intensity"])
print(open(sys.argv[3]).read()[:600])
PY
fi
