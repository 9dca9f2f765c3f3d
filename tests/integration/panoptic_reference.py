"""An independent panoptic quality for the tests, written from panopticapi's published pq_compute
(evaluation.py: pq_compute_single_core and PQStat.pq_average), not from Tally's code. Images are
numpy arrays of segment ids; segments are dicts (id, category_id, iscrowd, area for the reference).
Sums run as panopticapi's on one process: images in order, matches by (reference id, predicted id).
"""
import numpy as np

OFFSET = 256 * 256 * 256
VOID = 0


def pq_compute(images, categories):
    """images: [(gt_ids, gt_segments, pred_ids, pred_segments)]; categories: [(id, isthing)] in the
    file's order. Returns {"all"|"things"|"stuff": (pq, sq, rq, n)} and per category (pq, sq, rq, tp, fp, fn)."""
    stat = {c: {"iou": 0.0, "tp": 0, "fp": 0, "fn": 0} for c, _ in categories}
    for gt, gt_segments, pred, pred_segments in images:
        gt_segms = {s["id"]: dict(s) for s in gt_segments}
        pred_segms = {s["id"]: dict(s) for s in pred_segments}
        labels, counts = np.unique(pred, return_counts=True)
        for label, count in zip(labels.tolist(), counts.tolist()):
            if label == VOID:
                continue
            pred_segms[label]["area"] = count
        pan = gt.astype(np.uint64) * OFFSET + pred.astype(np.uint64)
        gt_pred_map = {}
        labels, counts = np.unique(pan, return_counts=True)
        for label, count in zip(labels.tolist(), counts.tolist()):
            gt_pred_map[(label // OFFSET, label % OFFSET)] = count
        gt_matched, pred_matched = set(), set()
        for (gt_label, pred_label), intersection in gt_pred_map.items():
            if gt_label not in gt_segms or pred_label not in pred_segms:
                continue
            if gt_segms[gt_label]["iscrowd"] == 1:
                continue
            if gt_segms[gt_label]["category_id"] != pred_segms[pred_label]["category_id"]:
                continue
            union = (pred_segms[pred_label]["area"] + gt_segms[gt_label]["area"] - intersection
                     - gt_pred_map.get((VOID, pred_label), 0))
            iou = intersection / union
            if iou > 0.5:
                stat[gt_segms[gt_label]["category_id"]]["tp"] += 1
                stat[gt_segms[gt_label]["category_id"]]["iou"] += iou
                gt_matched.add(gt_label)
                pred_matched.add(pred_label)
        crowd = {}
        for gt_label, info in gt_segms.items():
            if gt_label in gt_matched:
                continue
            if info["iscrowd"] == 1:
                crowd[info["category_id"]] = gt_label
                continue
            stat[info["category_id"]]["fn"] += 1
        for pred_label, info in pred_segms.items():
            if pred_label in pred_matched:
                continue
            intersection = gt_pred_map.get((VOID, pred_label), 0)
            if info["category_id"] in crowd:
                intersection += gt_pred_map.get((crowd[info["category_id"]], pred_label), 0)
            if intersection / info["area"] > 0.5:
                continue
            stat[info["category_id"]]["fp"] += 1
    out, per = {}, {}
    for name, isthing in (("all", None), ("things", True), ("stuff", False)):
        pq = sq = rq = 0.0
        n = 0
        for c, thing in categories:
            if isthing is not None and thing != isthing:
                continue
            s = stat[c]
            iou, tp, fp, fn = s["iou"], s["tp"], s["fp"], s["fn"]
            if tp + fp + fn == 0:
                per[c] = (0.0, 0.0, 0.0, 0, 0, 0)
                continue
            n += 1
            pq_c = iou / (tp + 0.5 * fp + 0.5 * fn)
            sq_c = iou / tp if tp != 0 else 0
            rq_c = tp / (tp + 0.5 * fp + 0.5 * fn)
            per[c] = (pq_c, sq_c, rq_c, tp, fp, fn)
            pq += pq_c
            sq += sq_c
            rq += rq_c
        out[name] = (pq / n, sq / n, rq / n, n) if n else (float("nan"),) * 3 + (0,)
    return out, per
