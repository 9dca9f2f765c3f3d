#!/usr/bin/python3
"""tallyd under millions of rows, fed by fake workers (bench/load_worker.cc) over the real
WorkerControl API. No images, no model: each row's result is made up from its index (64 x 64
pixels, CLASSES classes), and this script computes the same numbers on its own (numpy) to check
the report's means.

For each size it starts a fresh tallyd, writes a prediction manifest (the files it names do not
exist: the fake workers never open them), times `tally submit`, starts WORKERS fake workers and
measures, from tallyd's /proc entries and `tally status --json` polled every 50 ms:
  rows/s admitted         rows / (first progress -> every row committed)
  tallyd CPU per row      tallyd's user + system CPU from the workers' start to `succeeded`, / rows
  last result->succeeded  every row committed -> state succeeded
  peak RSS                tallyd's VmHWM (submission included)
  database                the state directory's SQLite files at the end
and checks that report.json's per-class dice_mean and iou_mean equal the generator's.

  /usr/bin/python3 bench/load_bench.py --bin build/bin --work /tmp/load --rows 100000,1000000 \
      [--workers 2] [--rate 0] [--metrics dice,iou,precision,recall,hd95] [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def expected_means(rows, classes):
    """Per class, the mean Dice and IoU over rows where they are defined (bench/load_worker.cc's made-up counts)."""
    out = []
    idx = np.arange(rows, dtype=np.uint64)
    for c in range(classes):
        with np.errstate(over="ignore"):
            h = splitmix64(idx * np.uint64(16) + np.uint64(c))
        tp = (h % np.uint64(1000)).astype(np.float64)
        fp = ((h >> np.uint64(10)) % np.uint64(300)).astype(np.float64)
        fn = ((h >> np.uint64(20)) % np.uint64(300)).astype(np.float64)
        den = 2 * tp + fp + fn
        ok = den > 0
        dice = 2 * tp[ok] / den[ok]
        iou = tp[ok] / (tp[ok] + fp[ok] + fn[ok])
        out.append((float(np.sum(np.sort(dice)) / dice.size), float(np.sum(np.sort(iou)) / iou.size)))
    return out


def write_manifest(path, rows):
    if os.path.exists(path):
        return
    with open(path + ".tmp", "w") as f:
        f.write("id,prediction,mask\n")
        step = 100000
        for start in range(0, rows, step):
            f.write("".join(f"r{i},p/{i}.png,m/{i}.png\n" for i in range(start, min(rows, start + step))))
    os.rename(path + ".tmp", path)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0


def dir_mb(path):
    total = 0
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isfile(p) and ".db" in name:
            total += os.path.getsize(p)
    return total / 1e6


def run_size(args, rows):
    work = os.path.join(args.work, f"n{rows}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    manifest = os.path.join(args.work, f"manifest-{rows}.csv")
    write_manifest(manifest, rows)
    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "tallyd.log"), "w")
    tallyd = subprocess.Popen([os.path.join(args.bin, "tallyd"), "--listen", "127.0.0.1:0", "--port-file", port_file,
                               "--state-dir", os.path.join(work, "state")] + args.tallyd_arg,
                              stdout=log, stderr=subprocess.STDOUT)
    workers = []
    try:
        while not os.path.exists(port_file):
            time.sleep(0.02)
        time.sleep(0.05)
        server = "127.0.0.1:" + open(port_file).read().strip()
        tally = [os.path.join(args.bin, "tally")]
        t0 = time.time()
        job = subprocess.run(tally + ["submit", "--server", server, "--manifest", manifest, "--num-classes",
                                      str(args.classes), "--metrics", args.metrics] + args.submit_arg,
                             check=True, capture_output=True, text=True).stdout.strip()
        submit_s = time.time() - t0
        cpu0 = cpu_seconds(tallyd.pid)
        t_start = time.time()
        for w in range(args.workers):
            workers.append(subprocess.Popen([os.path.join(args.bin, "tally-load-worker"), "--coordinator", server,
                                             "--rate", str(args.rate), "--classes", str(args.classes),
                                             "--name", f"load{w}"],
                                            stdout=log, stderr=subprocess.STDOUT))
        t_first = t_all = None
        while True:
            st = json.loads(subprocess.run(tally + ["status", job, "--server", server, "--json"], check=True,
                                           capture_output=True, text=True).stdout)
            now = time.time()
            done = int(st.get("images_evaluated", 0)) + int(st.get("images_failed", 0))
            if t_first is None and done > 0:
                t_first = now
            if t_all is None and done >= rows:
                t_all = now
            if st["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
                t_end = now
                if t_all is None:
                    t_all = now
                break
            time.sleep(0.05)
        cpu = cpu_seconds(tallyd.pid) - cpu0
        rss = peak_rss_mb(tallyd.pid)
        db = dir_mb(os.path.join(work, "state"))
        out = os.path.join(work, "report")
        subprocess.run(tally + ["report", job, "--server", server, "--out", out], check=True, capture_output=True)
        report = json.load(open(os.path.join(out, "report.json")))
        expected = expected_means(rows, args.classes)
        worst = 0.0
        for c, (dice, iou) in enumerate(expected):
            got = report["classes"][c]
            for name, want in (("dice_mean", dice), ("iou_mean", iou)):
                worst = max(worst, abs(got[name] - want) / want)
        csv_mb = os.path.getsize(os.path.join(out, "per_image.csv")) / 1e6
        admitted = rows / max(1e-9, t_all - t_first)
        print(f"| {rows:,} | {st['state'].split('_')[-1].lower()} {st.get('images_evaluated')} | {submit_s:.2f} s | "
              f"{admitted:,.0f} | {cpu / rows * 1e6:.1f} us | {t_all - t_first:.1f} s | {t_end - t_all:.2f} s | "
              f"{(t_end - t_all) / max(1e-9, t_all - t_first):.2f} | {rss:.0f} MB | {db:.0f} MB | {csv_mb:.0f} MB | "
              f"{worst:.1e} |", flush=True)
        return worst
    finally:
        for p in workers + [tallyd]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in workers + [tallyd]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--work", default="/tmp/tally-load")
    ap.add_argument("--rows", default="100000,1000000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0, help="rows/s per fake worker (0: no limit)")
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--metrics", default="dice,iou,precision,recall,hd95")
    ap.add_argument("--tallyd-arg", action="append", default=[])
    ap.add_argument("--submit-arg", action="append", default=[])
    ap.add_argument("--keep", action="store_true", help="keep each size's state and report")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    print(f"{args.workers} fake workers, rate {args.rate or 'unlimited'}, {args.classes} classes, "
          f"--metrics {args.metrics}")
    print("| rows | state, evaluated | submit | rows/s admitted | tallyd CPU per row | rows arriving | "
          "last result -> succeeded | ratio | tallyd peak RSS | database | per_image.csv | means vs generator |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = max(run_size(args, int(n)) for n in args.rows.split(","))
    if worst > 1e-12:
        print(f"MEANS DIFFER from the generator's (relative {worst:.1e})")
        sys.exit(1)


if __name__ == "__main__":
    main()
