#!/usr/bin/env python3
"""Submit of tar shards (docs/data.md "Where your data can be", BENCHMARKS.md): SHARDS tars of SAMPLES
samples each (key.jpg + key.seg.png, MEMBER bytes each; the index reads headers only, so the
members' content does not matter), then the wall time of `tally submit --shards` against a tallyd
with no workers: from the command's start until it prints the job id, i.e. every tar indexed and
every row stored. Also the same samples as a manifest, for comparison.

  bench/shard_submit.py --bin build/bin --dir /tmp/shardbench --shards 1000 --samples 1000
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def header(name, size):
    h = bytearray(512)
    n = name.encode()
    h[0:len(n)] = n
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"14000000000\0"
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def write_shards(root, shards, samples, member):
    data = b"x" * member + b"\0" * ((512 - member % 512) % 512)
    paths = []
    for s in range(shards):
        path = os.path.join(root, f"train-{s:06d}.tar")
        paths.append(path)
        if os.path.exists(path):
            continue
        parts = []
        for i in range(samples):
            key = f"s{s:06d}_{i:06d}"
            parts += [header(key + ".jpg", member), data, header(key + ".seg.png", member), data]
        parts.append(b"\0" * 1024)
        with open(path + ".tmp", "wb") as f:
            f.write(b"".join(parts))
        os.rename(path + ".tmp", path)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "tally-shard-bench"))
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--member", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    t = time.time()
    paths = write_shards(a.dir, a.shards, a.samples, a.member)
    print(f"shards ready: {len(paths)} x {a.samples} samples ({time.time() - t:.1f} s)", file=sys.stderr)
    manifest = os.path.join(a.dir, "manifest.csv")
    if not os.path.exists(manifest):
        with open(manifest, "w") as f:
            f.write("id,image,mask\n")
            for s in range(a.shards):
                for i in range(a.samples):
                    key = f"s{s:06d}_{i:06d}"
                    f.write(f"{key},img/{key}.jpg,msk/{key}.png\n")
    model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "demo", "model.pt")
    state = tempfile.mkdtemp(prefix="tallyd-", dir=a.dir)
    port_file = os.path.join(state, "port")
    tallyd = subprocess.Popen([os.path.join(a.bin, "tallyd"), "--listen", "127.0.0.1:0", "--port-file", port_file,
                               "--state-dir", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        server = "127.0.0.1:" + open(port_file).read().strip()
        pattern = os.path.join(a.dir, "train-{%06d..%06d}.tar" % (0, a.shards - 1))
        for what, args in [("shards", ["--shards", pattern]), ("manifest", ["--manifest", manifest])]:
            times = []
            for _ in range(a.repeat):
                t = time.time()
                subprocess.run([os.path.join(a.bin, "tally"), "submit", "--server", server, "--model", model, *args],
                               check=True, capture_output=True)
                times.append(time.time() - t)
            print(f"submit {what}: {a.shards * a.samples} samples, best {min(times):.2f} s, "
                  f"runs {' '.join(f'{x:.2f}' for x in times)}")
    finally:
        tallyd.terminate()
        tallyd.wait()


if __name__ == "__main__":
    main()
