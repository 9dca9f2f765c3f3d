"""The failing-slice search's time on many rows (tally slices, on this machine's CPUs): a report folder
of ROWS rows written here (per_image.csv with two classes, report.json naming the manifest) and a
manifest with five columns (site: 12 values, scanner: 4, sex: 2, slice thickness: 6, age: numeric,
binned in 4), the derived properties from the rows' counts beside them (foreground fraction and
predicted / reference ratio binned in 4; 512² pixels everywhere), then `tally slices` timed, twice.

    TALLY_BIN=build/bin /usr/bin/python3 bench/slices_bench.py [ROWS]     (default 1000000)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    tally = os.path.join(os.environ.get("TALLY_BIN", "build/bin"), "tally")
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as d:
        site = rng.integers(0, 12, rows)
        scanner = rng.integers(0, 4, rows)
        sex = rng.integers(0, 2, rows)
        thick = rng.choice([0.5, 1.0, 1.25, 2.5, 3.0, 5.0], rows)
        age = rng.uniform(18, 90, rows)
        dice = np.clip(rng.normal(0.8, 0.1, rows) - 0.15 * ((site == 3) & (thick == 5.0)), 0, 1)
        with open(os.path.join(d, "manifest.csv"), "w") as f:
            f.write("image,mask,id,site,scanner,sex,thickness,age\n")
            for i in range(rows):
                f.write(f"i{i}.png,m{i}.png,r{i},s{site[i]},sc{scanner[i]},{'FM'[sex[i]]},{thick[i]},{age[i]:.2f}\n")
        fg = rng.integers(100, 50000, rows)
        with open(os.path.join(d, "per_image.csv"), "w") as f:
            f.write("index,id,image,class,tp,fp,fn,tn,dice,iou\n")
            for i in range(rows):
                tp = int(dice[i] * fg[i])
                fp, fn = fg[i] // 10, fg[i] - tp
                tn = 262144 - tp - fp - fn
                f.write(f"{i},r{i},i{i}.png,0,{tn},{fn},{fp},{tp},1,1\n"
                        f"{i},r{i},i{i}.png,1,{tp},{fp},{fn},{tn},{dice[i]:.6f},{dice[i] / (2 - dice[i]):.6f}\n")
        with open(os.path.join(d, "report.json"), "w") as f:
            json.dump({"source": {"kind": "manifest", "manifest": os.path.join(d, "manifest.csv")},
                       "include_background": False}, f)
        for run in range(2):
            t0 = time.perf_counter()
            p = subprocess.run([tally, "slices", d, "--json"], capture_output=True, text=True, check=True)
            seconds = time.perf_counter() - t0
            out = json.loads(p.stdout)
            print(json.dumps({"rows": rows, "run": run, "seconds": round(seconds, 2), "tested": out["tested"],
                              "significant": out["significant"], "top": out["slices"][0]["slice"] if out["slices"] else None}))


if __name__ == "__main__":
    main()
