"""One process for several GPUs (issue 45 item 2's other way out): how long one process takes to
make N GPUs ready (cuInit once, then each device's primary context and a first allocation, from N
threads at once), against N processes with a GPU each (cuda_init_probe.py). Driver API only.

    python3 bench/gpu/cuda_init_threads_probe.py [N...]      (default: 1 2 4, three times each,
                                                            each in a fresh process)
"""
import ctypes
import subprocess
import sys
import threading
import time


def child(n):
    cuda = ctypes.CDLL("libcuda.so.1")
    t0 = time.time()
    assert cuda.cuInit(0) == 0
    t1 = time.time()
    ready = [0.0] * n

    def one(i):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        assert cuda.cuDeviceGet(ctypes.byref(dev), i) == 0
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cuda.cuCtxSetCurrent(ctx) == 0
        ptr = ctypes.c_uint64()
        assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
        ready[i] = time.time() - t1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{n} GPUs, one process: cuInit {t1 - t0:.3f} s; contexts + first allocation ready after "
          + " ".join(f"{r:.3f}" for r in ready) + f" s; all ready {time.time() - t0:.3f} s")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        for n in [int(a) for a in sys.argv[1:]] or [1, 2, 4]:
            for _ in range(3):
                subprocess.run([sys.executable, __file__, "--child", str(n)], check=True)
