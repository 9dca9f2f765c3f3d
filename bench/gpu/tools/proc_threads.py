"""What thread_cpu.py and thread_delta.py read from /proc: the processes whose command line holds
one of some strings, and each one's threads' names and CPU seconds (user + system)."""
import os

TICK = os.sysconf("SC_CLK_TCK")


def matching(patterns):
    """(pid, command) of each running process whose first command-line word holds a pattern."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if any(p in cmd for p in patterns):
            yield pid, cmd


def thread_times(pid, into):
    """Adds {tid: (name, cpu seconds)} of pid's threads to `into`; a process that ends meanwhile
    leaves what was read."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
            comm = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            into[tid] = (comm, (int(fields[11]) + int(fields[12])) / TICK)
    except (OSError, ValueError):
        pass
    return into
