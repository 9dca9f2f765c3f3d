#!/usr/bin/env python3
"""Checks a --compile job against its eager run and its two-worker run (bench/gpu/compile.sh):

  python3 bench/gpu/tools/compile_check.py EAGER_OUT COMPILED_OUT COMPILED_TWO_WORKERS_OUT

  * per_image.csv of the compiled job with 1 and with 2 workers: identical, byte for byte (every
    worker runs the job's one choice, with kernels from one cache entry);
  * compiled against eager, within the stated tolerance: the trial's argmax agrees on at least 98 %
    of its batch's pixels (bf16 kernels differ in the last bits), and the rows' foreground Dice
    differs from eager's by at most 0.01 on average.

One JSON line; exit status 1 when a check fails.
"""
import csv
import json
import os
import sys


def rows(out):
    with open(os.path.join(out, "per_image.csv"), newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f) if r["class"] == "1"}  # Foreground rows.


def main():
    eager, one, two = sys.argv[1:4]
    with open(os.path.join(one, "per_image.csv"), "rb") as a, open(os.path.join(two, "per_image.csv"), "rb") as b:
        identical = a.read() == b.read()
    with open(os.path.join(one, "report.json")) as f:
        compile_ = json.load(f)["compile"]
    agreement = 1.0 - compile_["argmax_changed_pixels"] / max(1, compile_["pixels"])
    e, c = rows(eager), rows(one)
    diffs = [abs(float(c[k]["dice"]) - float(e[k]["dice"])) for k in e
             if k in c and e[k]["dice"] not in ("", "nan") and c[k]["dice"] not in ("", "nan")]
    mean_diff = sum(diffs) / max(1, len(diffs))
    ok = identical and agreement >= 0.98 and mean_diff <= 0.01
    print(json.dumps({"ran": compile_["ran"], "one_vs_two_workers_identical": identical, "trial_argmax_agreement": agreement,
                      "trial_max_abs_diff": compile_["max_abs_diff"], "rows": len(diffs),
                      "mean_abs_dice_diff_vs_eager": mean_diff, "rows_differing": sum(d > 0 for d in diffs), "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
