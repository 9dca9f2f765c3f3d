"""An independent COCOeval (iouType 'segm', default parameters) in numpy, written from the
published algorithm (Lin et al., "Microsoft COCO", and pycocotools' documented evaluate /
accumulate / summarize steps), for the tests: it shares no code with Tally's C++.

Masks are numpy bool arrays (height x width); IoU is computed from them directly. Also a COCO RLE
encoder (column-major runs, and the compressed string form) to write test files with.
"""
import numpy as np

IOU_THRS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
REC_THRS = np.linspace(.0, 1.00, int(np.round((1.00 - .0) / .01)) + 1, endpoint=True)
AREA_RNG = [[0 ** 2, 1e5 ** 2], [0 ** 2, 32 ** 2], [32 ** 2, 96 ** 2], [96 ** 2, 1e5 ** 2]]
MAX_DETS = [1, 10, 100]


def rle_counts(mask):
    """Runs of 0s and 1s (0s first) of the mask read column by column."""
    flat = np.asarray(mask, dtype=np.uint8).flatten(order="F")
    counts, value, run = [], 0, 0
    for v in flat:
        if v != value:
            counts.append(run)
            run, value = 0, v
        run += 1
    counts.append(run)
    return counts


def rle_string(counts):
    """COCO's compressed counts: from the 4th run on, the difference to the run two before; each in
    5-bit groups, least significant first, 0x20 = more groups follow, 0x10 of the last = sign."""
    out = []
    for i, c in enumerate(counts):
        x = c - counts[i - 2] if i > 2 else c
        while True:
            group = x & 0x1F
            x >>= 5
            more = x != -1 if group & 0x10 else x != 0
            out.append(chr(48 + (group | 0x20 if more else group)))
            if not more:
                break
    return "".join(out)


def mask_iou(d, g, crowd):
    inter = np.logical_and(d, g).sum()
    if inter == 0:
        return 0.0
    union = d.sum() if crowd else np.logical_or(d, g).sum()
    return float(inter) / float(union)


def _evaluate_image(gts, dts, arng, max_det):
    """gts: dicts with id, area, iscrowd, mask; dts: id, score, area, mask (one image, one category)."""
    if not gts and not dts:
        return None
    ig = [1 if (g["iscrowd"] or g["area"] < arng[0] or g["area"] > arng[1]) else 0 for g in gts]
    gorder = np.argsort(ig, kind="mergesort")
    gts = [gts[i] for i in gorder]
    ig = np.array([ig[i] for i in gorder])
    dorder = np.argsort([-d["score"] for d in dts], kind="mergesort")
    dts = [dts[i] for i in dorder[:max_det]]
    T, G, D = len(IOU_THRS), len(gts), len(dts)
    ious = np.array([[mask_iou(d["mask"], g["mask"], g["iscrowd"]) for g in gts] for d in dts]).reshape(D, G)
    gt_taken = np.zeros((T, G), bool)
    dt_match = np.zeros((T, D), bool)
    dt_ignore = np.zeros((T, D), bool)
    for t, thr in enumerate(IOU_THRS):
        for di in range(D):
            best, m = min(thr, 1 - 1e-10), -1
            for gi in range(G):
                if gt_taken[t, gi] and not gts[gi]["iscrowd"]:
                    continue
                if m > -1 and ig[m] == 0 and ig[gi] == 1:
                    break
                if ious[di, gi] < best:
                    continue
                best, m = ious[di, gi], gi
            if m == -1:
                continue
            dt_ignore[t, di] = ig[m] == 1
            dt_match[t, di] = True
            gt_taken[t, m] = True
    outside = np.array([d["area"] < arng[0] or d["area"] > arng[1] for d in dts], bool).reshape(1, D)
    dt_ignore = np.logical_or(dt_ignore, np.logical_and(~dt_match, np.repeat(outside, T, 0)))
    return {"scores": np.array([d["score"] for d in dts], float), "match": dt_match, "ignore": dt_ignore,
            "gt_ignore": ig}


def coco_eval(images, categories, gts, dts):
    """images: ids; categories: ids; gts/dts: lists of dicts with image_id, category_id (and the
    fields above). Returns (stats[12], {category_id: AP})."""
    img_ids = sorted(set(images))
    cat_ids = sorted(set(categories))
    by = {}
    for g in gts:
        by.setdefault((g["image_id"], g["category_id"]), ([], []))[0].append(g)
    for d in dts:
        if d["category_id"] in cat_ids:
            by.setdefault((d["image_id"], d["category_id"]), ([], []))[1].append(d)
    T, R, K, A, M = len(IOU_THRS), len(REC_THRS), len(cat_ids), len(AREA_RNG), len(MAX_DETS)
    precision = -np.ones((T, R, K, A, M))
    recall = -np.ones((T, K, A, M))
    for k, cat in enumerate(cat_ids):
        for a, arng in enumerate(AREA_RNG):
            evals = [_evaluate_image(*by.get((i, cat), ([], [])), arng, MAX_DETS[-1]) for i in img_ids]
            evals = [e for e in evals if e is not None]
            if not evals:
                continue
            for m, max_det in enumerate(MAX_DETS):
                scores = np.concatenate([e["scores"][:max_det] for e in evals])
                order = np.argsort(-scores, kind="mergesort")
                match = np.concatenate([e["match"][:, :max_det] for e in evals], axis=1)[:, order]
                ignore = np.concatenate([e["ignore"][:, :max_det] for e in evals], axis=1)[:, order]
                npig = np.count_nonzero(np.concatenate([e["gt_ignore"] for e in evals]) == 0)
                if npig == 0:
                    continue
                tps = np.cumsum(np.logical_and(match, ~ignore), axis=1).astype(np.float64)
                fps = np.cumsum(np.logical_and(~match, ~ignore), axis=1).astype(np.float64)
                for t in range(T):
                    tp, fp = tps[t], fps[t]
                    nd = len(tp)
                    rc = tp / npig
                    pr = tp / (fp + tp + np.spacing(1))
                    recall[t, k, a, m] = rc[-1] if nd else 0
                    pr = pr.tolist()
                    for i in range(nd - 1, 0, -1):
                        if pr[i] > pr[i - 1]:
                            pr[i - 1] = pr[i]
                    q = np.zeros(R)
                    for ri, pi in enumerate(np.searchsorted(rc, REC_THRS, side="left")):
                        if pi >= nd:
                            break
                        q[ri] = pr[pi]
                    precision[t, :, k, a, m] = q

    def mean_defined(s):
        s = s[s > -1]
        return float(np.mean(s)) if len(s) else -1.0

    def ap(t=None, a=0):
        s = precision if t is None else precision[[t]]
        return mean_defined(s[:, :, :, a, M - 1])

    def ar(a=0, m=M - 1):
        return mean_defined(recall[:, :, a, m])

    t50, t75 = int(np.where(IOU_THRS == .5)[0][0]), int(np.where(IOU_THRS == .75)[0][0])
    stats = [ap(), ap(t50), ap(t75), ap(a=1), ap(a=2), ap(a=3), ar(m=0), ar(m=1), ar(), ar(1), ar(2), ar(3)]
    per_cat = {cat: mean_defined(precision[:, :, k, 0, M - 1]) for k, cat in enumerate(cat_ids)}
    return stats, per_cat
