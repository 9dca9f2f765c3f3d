#!/usr/bin/env python3
"""The baseline of `bench/coco_bench.py`: COCOeval (iouType 'segm') as pycocotools runs it, for
machines without pycocotools (it is not in the package registries here). A line-by-line port of
cocoeval.py's _prepare, evaluate (computeIoU + evaluateImg, its Python loops) and accumulate; the
one substitution is the mask IoU, which pycocotools computes in C on RLEs (maskApi.c rleIou) and
this port computes with numpy (masks decoded once per image and category, intersections by a matrix
product in BLAS): C either way, so the timing is of the algorithm pycocotools runs. Written from the
published algorithm; Tally's numbers must equal its numbers to the bit.

    cocoeval_port.py GT.json RESULTS.json   -> prints the 12 numbers and the times (JSON on the last line)
"""
import json
import sys
import time
from collections import defaultdict

import numpy as np


def rle_decode_string(s):
    """COCO's compressed RLE string -> counts (maskApi.c rleFrString)."""
    counts, p, m = [], 0, 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            c = ord(s[p]) - 48
            x |= (c & 0x1f) << (5 * k)
            more = c & 0x20
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if m > 2:
            x += counts[m - 2]
        counts.append(x)
        m += 1
    return counts


def decode(seg, h, w):
    counts = seg["counts"]
    if isinstance(counts, str):
        counts = rle_decode_string(counts)
    flat = np.zeros(h * w, bool)
    ends = np.cumsum(counts)
    starts = ends - np.asarray(counts)
    for a, b in zip(starts[1::2], ends[1::2]):
        flat[a:b] = True
    return flat.reshape(w, h).T.reshape(-1)  # Row-major, for the IoU only (any fixed order does).


def mask_iou(dts, gts, h, w):
    if not dts or not gts:
        return []
    d = np.stack([decode(x["segmentation"], h, w) for x in dts]).astype(np.float32)
    g = np.stack([decode(x["segmentation"], h, w) for x in gts]).astype(np.float32)
    inter = (d @ g.T).astype(np.float64)  # Exact: pixel counts are far below 2^24.
    da, ga = d.sum(1, dtype=np.float64)[:, None], g.sum(1, dtype=np.float64)[None, :]
    crowd = np.array([x["iscrowd"] for x in gts], bool)[None, :]
    union = np.where(crowd, da, da + ga - inter)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
    return iou.astype(np.float64)


class Params:
    def __init__(self, gt):
        self.imgIds = sorted(im["id"] for im in gt["images"])
        self.catIds = sorted(c["id"] for c in gt["categories"])
        self.iouThrs = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
        self.recThrs = np.linspace(.0, 1.00, int(np.round((1.00 - .0) / .01)) + 1, endpoint=True)
        self.maxDets = [1, 10, 100]
        self.areaRng = [[0 ** 2, 1e5 ** 2], [0 ** 2, 32 ** 2], [32 ** 2, 96 ** 2], [96 ** 2, 1e5 ** 2]]


class CocoEvalPort:
    def __init__(self, gt, results):
        self.params = p = Params(gt)
        self.size = {im["id"]: (im["height"], im["width"]) for im in gt["images"]}
        self._gts, self._dts = defaultdict(list), defaultdict(list)
        for g in gt["annotations"]:
            g = dict(g)
            g["ignore"] = int(g.get("iscrowd", 0))
            self._gts[g["image_id"], g["category_id"]].append(g)
        for k, d in enumerate(results):
            d = dict(d, id=k + 1, iscrowd=0)
            h, w = self.size[d["image_id"]]
            d["area"] = float(decode(d["segmentation"], h, w).sum())  # loadRes: maskUtils.area
            self._dts[d["image_id"], d["category_id"]].append(d)

    def computeIoU(self, imgId, catId):
        p = self.params
        gt, dt = self._gts[imgId, catId], self._dts[imgId, catId]
        if len(gt) == 0 and len(dt) == 0:
            return []
        inds = np.argsort([-d["score"] for d in dt], kind="mergesort")
        dt = [dt[i] for i in inds]
        if len(dt) > p.maxDets[-1]:
            dt = dt[0:p.maxDets[-1]]
        h, w = self.size[imgId]
        return mask_iou(dt, gt, h, w)

    def evaluateImg(self, imgId, catId, aRng, maxDet):
        p = self.params
        gt, dt = self._gts[imgId, catId], self._dts[imgId, catId]
        if len(gt) == 0 and len(dt) == 0:
            return None
        for g in gt:
            g["_ignore"] = 1 if (g["ignore"] or (g["area"] < aRng[0] or g["area"] > aRng[1])) else 0
        gtind = np.argsort([g["_ignore"] for g in gt], kind="mergesort")
        gt = [gt[i] for i in gtind]
        dtind = np.argsort([-d["score"] for d in dt], kind="mergesort")
        dt = [dt[i] for i in dtind[0:maxDet]]
        iscrowd = [int(o["iscrowd"]) for o in gt]
        ious = self.ious[imgId, catId][:, gtind] if len(self.ious[imgId, catId]) > 0 else self.ious[imgId, catId]
        T, G, D = len(p.iouThrs), len(gt), len(dt)
        gtm, dtm = np.zeros((T, G)), np.zeros((T, D))
        gtIg = np.array([g["_ignore"] for g in gt])
        dtIg = np.zeros((T, D))
        if not len(ious) == 0:
            for tind, t in enumerate(p.iouThrs):
                for dind, d in enumerate(dt):
                    iou = min([t, 1 - 1e-10])
                    m = -1
                    for gind, g in enumerate(gt):
                        if gtm[tind, gind] > 0 and not iscrowd[gind]:
                            continue
                        if m > -1 and gtIg[m] == 0 and gtIg[gind] == 1:
                            break
                        if ious[dind, gind] < iou:
                            continue
                        iou = ious[dind, gind]
                        m = gind
                    if m == -1:
                        continue
                    dtIg[tind, dind] = gtIg[m]
                    dtm[tind, dind] = gt[m]["id"]
                    gtm[tind, m] = d["id"]
        a = np.array([d["area"] < aRng[0] or d["area"] > aRng[1] for d in dt]).reshape((1, len(dt)))
        dtIg = np.logical_or(dtIg, np.logical_and(dtm == 0, np.repeat(a, T, 0)))
        return {"dtMatches": dtm, "gtMatches": gtm, "dtScores": [d["score"] for d in dt], "gtIgnore": gtIg,
                "dtIgnore": dtIg}

    def evaluate(self):
        p = self.params
        self.ious = {(imgId, catId): self.computeIoU(imgId, catId) for imgId in p.imgIds for catId in p.catIds}
        maxDet = p.maxDets[-1]
        self.evalImgs = [self.evaluateImg(imgId, catId, areaRng, maxDet)
                         for catId in p.catIds for areaRng in p.areaRng for imgId in p.imgIds]

    def accumulate(self):
        p = self.params
        T, R, K, A, M = len(p.iouThrs), len(p.recThrs), len(p.catIds), len(p.areaRng), len(p.maxDets)
        precision, recall = -np.ones((T, R, K, A, M)), -np.ones((T, K, A, M))
        I0, A0 = len(p.imgIds), len(p.areaRng)
        for k in range(K):
            Nk = k * A0 * I0
            for a in range(A):
                Na = a * I0
                for m, maxDet in enumerate(p.maxDets):
                    E = [self.evalImgs[Nk + Na + i] for i in range(I0)]
                    E = [e for e in E if e is not None]
                    if len(E) == 0:
                        continue
                    dtScores = np.concatenate([e["dtScores"][0:maxDet] for e in E])
                    inds = np.argsort(-dtScores, kind="mergesort")
                    dtm = np.concatenate([e["dtMatches"][:, 0:maxDet] for e in E], axis=1)[:, inds]
                    dtIg = np.concatenate([e["dtIgnore"][:, 0:maxDet] for e in E], axis=1)[:, inds]
                    gtIg = np.concatenate([e["gtIgnore"] for e in E])
                    npig = np.count_nonzero(gtIg == 0)
                    if npig == 0:
                        continue
                    tps = np.logical_and(dtm, np.logical_not(dtIg))
                    fps = np.logical_and(np.logical_not(dtm), np.logical_not(dtIg))
                    tp_sum = np.cumsum(tps, axis=1).astype(dtype=float)
                    fp_sum = np.cumsum(fps, axis=1).astype(dtype=float)
                    for t, (tp, fp) in enumerate(zip(tp_sum, fp_sum)):
                        tp, fp = np.array(tp), np.array(fp)
                        nd = len(tp)
                        rc = tp / npig
                        pr = tp / (fp + tp + np.spacing(1))
                        q = np.zeros((R,))
                        recall[t, k, a, m] = rc[-1] if nd else 0
                        pr, q = pr.tolist(), q.tolist()
                        for i in range(nd - 1, 0, -1):
                            if pr[i] > pr[i - 1]:
                                pr[i - 1] = pr[i]
                        inds = np.searchsorted(rc, p.recThrs, side="left")
                        try:
                            for ri, pi in enumerate(inds):
                                q[ri] = pr[pi]
                        except IndexError:
                            pass
                        precision[t, :, k, a, m] = np.array(q)
        self.precision, self.recall = precision, recall

    def summarize(self):
        p = self.params

        def s(ap, iouThr=None, areaRng=0, maxDet=2):
            if ap:
                x = self.precision if iouThr is None else self.precision[[int(np.where(iouThr == p.iouThrs)[0][0])]]
                x = x[:, :, :, areaRng, maxDet]
            else:
                x = self.recall[:, :, areaRng, maxDet]
            x = x[x > -1]
            return -1.0 if len(x) == 0 else float(np.mean(x))

        return [s(1), s(1, .5), s(1, .75), s(1, areaRng=1), s(1, areaRng=2), s(1, areaRng=3), s(0, maxDet=0),
                s(0, maxDet=1), s(0), s(0, areaRng=1), s(0, areaRng=2), s(0, areaRng=3)]


def main(gt_path, results_path):
    t0 = time.perf_counter()
    with open(gt_path) as f:
        gt = json.load(f)
    with open(results_path) as f:
        results = json.load(f)
    e = CocoEvalPort(gt, results)
    t1 = time.perf_counter()
    e.evaluate()
    t2 = time.perf_counter()
    e.accumulate()
    t3 = time.perf_counter()
    stats = e.summarize()
    print(json.dumps({"stats": stats, "seconds": {"load": t1 - t0, "evaluate": t2 - t1, "accumulate": t3 - t2}}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
