#!/usr/bin/env python3
"""Emulates the Python backend's stub loop for LRASPP, batch 32, 512x512, on one GPU: upload from
page-locked (cudaHostRegister) memory, eager forward, argmax, label copy back into page-locked
memory, answers waited for on a second thread. Variants isolate what costs: a permuted
(channels-last) vs contiguous input, no label copy, no upload, 16 busy processes beside it.

  python3 bench/gpu/stub_probe.py      # prints img/s and host time per batch for each variant
"""
import multiprocessing as mp, threading, time, queue, sys
import numpy as np, torch
from torchvision.models.segmentation import lraspp_mobilenet_v3_large

def burn(stop):
    x = 0
    while not stop.is_set():
        x += 1

def main():
    dev = 'cuda'; n = 32
    torch.manual_seed(0)
    m = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=2).eval().to(dev)
    bufs = [np.zeros((n, 512, 512, 3), np.uint8) for _ in range(3)]
    outs = [np.zeros((n, 512, 512), np.int16) for _ in range(3)]
    cudart = torch.cuda.cudart()
    for a in bufs + outs:
        assert int(cudart.cudaHostRegister(a.ctypes.data, a.nbytes, 0)) == 0
    xg = torch.zeros((n, 3, 512, 512), device=dev)
    def step(k, upload, labels, per_image, contiguous=False):
        if upload:
            x = torch.from_numpy(bufs[k % 3]).to(dev, non_blocking=True).permute(0, 3, 1, 2).float().div_(255)
            if contiguous:
                x = x.contiguous()
        else:
            x = xg
        y = m(x)['out']
        lab = y.argmax(1).to(torch.int16)
        if labels:
            if per_image:
                for i in range(n):
                    torch.from_numpy(outs[k % 3][i]).copy_(lab[i], non_blocking=True)
            else:
                torch.from_numpy(outs[k % 3]).copy_(lab, non_blocking=True)
        e = torch.cuda.Event(); e.record(); return e
    def run(name, upload=True, labels=True, per_image=True, iters=60, contiguous=False):
        q = queue.Queue(maxsize=2)
        def answer():
            while True:
                e = q.get()
                if e is None: return
                e.synchronize()
        t = threading.Thread(target=answer); t.start()
        with torch.no_grad():
            for k in range(5): step(k, upload, labels, per_image, contiguous).synchronize()
            t0 = time.perf_counter(); spent = 0
            for k in range(iters):
                s = time.perf_counter(); e = step(k, upload, labels, per_image, contiguous); spent += time.perf_counter() - s
                q.put(e)
            q.put(None); t.join(); torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        print(f"{name}: {n*iters/dt:.0f} img/s, step() {1000*spent/iters:.1f} ms/batch", flush=True)
    run("stub-like")
    run("stub-like, contiguous input", contiguous=True)
    run("no labels, contiguous input", labels=False, contiguous=True)
    print("permuted float strides:", torch.from_numpy(bufs[0]).to(dev).permute(0, 3, 1, 2).float().stride())
    run("no label copy", labels=False)
    run("labels one copy", per_image=False)
    run("no upload", upload=False)
    run("no upload no labels", upload=False, labels=False)
    xg_cl = xg.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        m(xg_cl); torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(40): m(xg_cl)
        torch.cuda.synchronize(); print(f"channels-last input, model only: {32*40/(time.perf_counter()-t0):.0f} img/s", flush=True)
    stop = mp.Event(); ps = [mp.Process(target=burn, args=(stop,)) for _ in range(16)]
    for p in ps: p.start()
    time.sleep(1)
    run("stub-like contiguous, 16 busy processes", contiguous=True)
    stop.set()
    for p in ps: p.join()

if __name__ == '__main__':
    main()
