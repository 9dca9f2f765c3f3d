#!/usr/bin/env python3
"""LRASPP eager, batch 32, inputs in a page-locked memfd buffer as the stub sees them, one GPU sync per
batch (as a serial stub): host milliseconds per step. Run from the repository root on a GPU box."""
import mmap, os, time, numpy as np, torch, sys
sys.path.insert(0, "python")
import tally
from torchvision.models.segmentation import lraspp_mobilenet_v3_large
torch.manual_seed(0)
m = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=2).eval().cuda()
n = 32*512*512*3
fd = os.memfd_create("x"); os.ftruncate(fd, n); mm = mmap.mmap(fd, n)
a = np.frombuffer(mm, np.uint8)
torch.cuda.cudart().cudaHostRegister(a.__array_interface__["data"][0], n, 0)
images = [np.ndarray((512,512,3), np.uint8, buffer=mm, offset=i*512*512*3) for i in range(32)]
T = {}
def t(name, t0):
    T[name] = T.get(name, 0) + time.perf_counter() - t0
    return time.perf_counter()
with torch.no_grad():
    for it in range(60):
        if it == 20: T.clear()
        t0 = time.perf_counter()
        s = tally.stack_images(images); t0 = t("stack", t0)
        x = torch.from_numpy(s).to("cuda", non_blocking=True); t0 = t("upload", t0)
        x = x.permute(0,3,1,2).float().div_(255.0); t0 = t("prep", t0)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):
            o = m(x)["out"]
        t0 = t("forward", t0)
        nf = (~torch.isfinite(o)).sum(dim=(1,2,3)); lab = o.argmax(1).to(torch.int16); t0 = t("argmax", t0)
        ev = torch.cuda.Event(); ev.record(); t0 = t("record", t0)
        ev.synchronize(); t0 = t("sync", t0)
print({k: round(1000*v/40, 2) for k, v in T.items()})
