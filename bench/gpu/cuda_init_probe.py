"""How long a process's first CUDA steps take when N processes (one GPU each, as `tally run
--gpus all` starts its workers) take them at once: cuInit, the primary context, a first
allocation, through the driver API alone (no LibTorch). Issue 45 item 2.

    python3 bench/gpu/cuda_init_probe.py [N...]      (default: 1 2 4, three times each)
"""
import ctypes
import os
import subprocess
import sys
import time


def child(start_at):
    cuda = ctypes.CDLL("libcuda.so.1")
    while time.time() < start_at:
        pass
    t0 = time.time()
    assert cuda.cuInit(0) == 0
    t1 = time.time()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    t2 = time.time()
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
    t3 = time.time()
    print(f"{os.environ['CUDA_VISIBLE_DEVICES']} {t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {t3 - start_at:.3f}")


def parent(counts):
    for n in counts:
        for rep in range(3):
            start_at = time.time() + 1.0
            procs = [subprocess.Popen([sys.executable, __file__, "--child", repr(start_at)],
                                      env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}, stdout=subprocess.PIPE,
                                      text=True) for i in range(n)]
            rows = [p.communicate()[0].split() for p in procs]
            worst = max(float(r[4]) for r in rows)
            print(f"N={n} rep {rep}: cuInit " + " ".join(r[1] for r in rows) + " | context " +
                  " ".join(r[2] for r in rows) + f" | alloc " + " ".join(r[3] for r in rows) +
                  f" | slowest ready {worst:.3f} s")
            time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(float(sys.argv[2]))
    else:
        parent([int(a) for a in sys.argv[1:]] or [1, 2, 4])
