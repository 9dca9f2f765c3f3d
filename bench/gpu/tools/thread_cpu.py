#!/usr/bin/env python3
"""CPU seconds of each thread of the processes whose command line holds one of the given strings,
sampled from /proc every 20 ms until none of them runs (the last sample before each exits), then
printed per process: its total and its busiest threads by name. Shows whether a stage is held by
one thread (a serial path) or spread over many.

  python3 bench/gpu/tools/thread_cpu.py /bin/tallyd /bin/tally-worker &   (before the command starts)
"""
import os
import sys
import time

from proc_threads import matching, thread_times

patterns = sys.argv[1:]
seen = {}  # pid -> (name, {tid: (comm, seconds)}, first, last)


def sample():
    alive = 0
    for pid, cmd in matching(patterns):
        alive += 1
        name, threads, first, _ = seen.get(pid, (os.path.basename(cmd), {}, time.time(), 0))
        seen[pid] = (name, thread_times(pid, threads), first, time.time())
    return alive


started = time.time()
while time.time() - started < 2 and sample() == 0:
    time.sleep(0.01)
while sample() > 0:
    time.sleep(0.02)
for pid, (name, threads, first, last) in sorted(seen.items(), key=lambda kv: kv[1][2]):
    by_name = {}
    for comm, secs in threads.values():
        total, count = by_name.get(comm, (0.0, 0))
        by_name[comm] = (total + secs, count + 1)
    busiest = sorted(threads.values(), key=lambda t: -t[1])[:4]
    print(f"  {name} (pid {pid}, seen {last - first:.2f} s): cpu {sum(s for _, s in threads.values()):.2f} s in "
          f"{len(threads)} threads; by name: " +
          ", ".join(f"{c} x{n} {t:.2f}" for c, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:5]) +
          "; busiest: " + ", ".join(f"{c} {s:.2f}" for c, s in busiest))
