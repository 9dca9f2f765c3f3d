"""One `tally run`'s start-up as a time line (issue 45 item 2): for each worker, when it reached
main, had CUDA ready, registered, began and finished loading the model, and delivered its first
batch, in seconds from the job's submission (tallyd's log), beside the command's wall.

    python3 bench/gpu/startup_timeline.py OUT_DIR COMMAND_WALL_SECONDS
"""
import datetime
import glob
import json
import os
import re
import sys


def stamp(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def main():
    out, wall = sys.argv[1], float(sys.argv[2])
    state = os.path.join(out, ".tally")
    submitted = None
    with open(os.path.join(state, "tallyd.log")) as f:
        for line in f:
            if " submitted: " in line:
                submitted = stamp(line)
    report = json.load(open(os.path.join(out, "report.json")))
    print(f"{os.path.basename(out)}: command {wall:.2f} s, job wall {report['wall_seconds']:.2f} s, "
          f"{report['images_evaluated']} images")
    marks = [("main", r"starting: main reached ([0-9.]+) s"), ("cuda", r"ready \(CUDA initialised\)"),
             ("registered", r"registered with"), ("loading", r"loading model"), ("loaded", r"model loaded in")]
    for path in sorted(glob.glob(os.path.join(state, "worker-*.log"))):
        times, exec_to_main = {}, None
        with open(path, errors="replace") as f:
            for line in f:
                for name, pattern in marks:
                    m = re.search(pattern, line)
                    if m and name not in times:
                        times[name] = stamp(line) - submitted
                        if name == "main":
                            exec_to_main = float(m.group(1))
        cells = [f"{n} {times[n]:+.2f}" for n, _ in marks if n in times]
        print(f"  {os.path.basename(path)}: exec->main {exec_to_main}s; " + ", ".join(cells))
    for w in report["workers"]:
        print(f"  {w['name']}: first batch {w['first_batch_seconds']:.2f} s after submission, model load "
              f"{w['model_load_seconds']:.2f} s, {w['images_per_second']:.0f} img/s")


if __name__ == "__main__":
    main()
