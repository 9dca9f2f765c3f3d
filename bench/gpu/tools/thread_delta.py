#!/usr/bin/env python3
"""CPU seconds each thread of long-running processes spent between two moments (a job of a warm
tallyd and its workers), grouped by thread name with trailing digits dropped (decode-0..decode-15 ->
decode-): shows which stage holds the box's CPU.

  python3 bench/gpu/tools/thread_delta.py save /tmp/before /bin/tallyd /bin/tally-worker
  ... the job ...
  python3 bench/gpu/tools/thread_delta.py diff /tmp/before WALL_SECONDS /bin/tallyd /bin/tally-worker
"""
import json
import os
import re
import sys

from proc_threads import matching, thread_times


def snapshot(patterns):
    return {pid: [os.path.basename(cmd), thread_times(pid, {})] for pid, cmd in matching(patterns)}


mode, path = sys.argv[1], sys.argv[2]
if mode == "save":
    json.dump(snapshot(sys.argv[3:]), open(path, "w"))
    sys.exit(0)
wall = float(sys.argv[3])
before = json.load(open(path))
after = snapshot(sys.argv[4:])
grand = 0.0
for pid, (name, threads) in sorted(after.items()):
    old = before.get(pid, [name, {}])[1]
    groups = {}
    for tid, (comm, secs) in threads.items():
        d = secs - old.get(tid, [comm, 0.0])[1]
        key = re.sub(r"\d+$", "", comm)
        total, n = groups.get(key, (0.0, 0))
        groups[key] = (total + d, n + 1)
    total = sum(t for t, _ in groups.values())
    grand += total
    if total < 0.05:
        continue
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:6]
    print(f"  {name} {pid}: {total:.2f} cpu s ({total / wall:.1f} cores); " +
          ", ".join(f"{k} x{n} {t:.2f}" for k, (t, n) in top))
print(f"  all: {grand:.2f} cpu s over {wall:.2f} s = {grand / wall:.1f} cores")
