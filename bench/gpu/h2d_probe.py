#!/usr/bin/env python3
"""Does a non-blocking upload from a memfd buffer page-locked with cudaHostRegister return at once
while the GPU is busy (as from torch's own pinned memory), unlike pageable memory? python3 bench/gpu/h2d_probe.py"""
import mmap, os, time, numpy as np, torch
n = 32*512*512*3
fd = os.memfd_create("x"); os.ftruncate(fd, n); mm = mmap.mmap(fd, n)
a = np.frombuffer(mm, np.uint8)
torch.zeros(1, device="cuda")
err = torch.cuda.cudart().cudaHostRegister(a.__array_interface__["data"][0], n, 0)
print("register:", err, int(err))
t = torch.from_numpy(a)
print("is_pinned:", t.is_pinned())
pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
for name, src in (("registered", t), ("torch pinned", pinned), ("pageable", torch.from_numpy(np.zeros(n, np.uint8)))):
    for _ in range(2):
        torch.cuda._sleep(200_000_000)  # ~100+ ms of GPU busy
        t0 = time.perf_counter(); d = src.to("cuda", non_blocking=True); t1 = time.perf_counter()
        torch.cuda.synchronize()
    print(name, "to(non_blocking) returned after %.2f ms" % (1000*(t1-t0)))
