#!/usr/bin/env python3
"""Turns a referring-segmentation set into a Tally manifest over its COCO annotation file: one row
per expression, with the expression as `prompt` and the annotations it refers to as `coco_ann_ids`
(docs/instances.md "Instances"). Then

    tally run --model my_model.py --manifest refcoco_val.csv --coco instances.json --out results/

scores each row's mask against the union of its annotations.

Reads RefCOCO / RefCOCO+ / RefCOCOg `refs(unc).p` / `refs(umd).p` (pickled lists of refs: ref_id,
image_id, ann_id, split, sentences) and gRefCOCO `grefs(unc).json` (ann_id a list; [-1] or
no_target for an expression that refers to nothing, which becomes an empty coco_ann_ids: no target).
The image file of each row is images[].file_name of the annotation file, under --image-dir.

    refer_to_manifest.py --refs 'refs(unc).p' --instances instances.json --split val \\
        --image-dir /data/coco/train2014 --out refcoco_val.csv

Columns: image, prompt, coco_ann_ids, id (<ref_id>_<sent_id>), split, ref_id. A pickle runs code when
loaded: only convert refs files from a source you trust. Needs the Python standard library only.
"""
import argparse
import csv
import json
import os
import pickle
import sys


def load_refs(path):
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    with open(path, "rb") as f:
        return pickle.load(f)


def ann_ids(ref):
    ids = ref.get("ann_id")
    if ids is None:
        ids = []
    elif not isinstance(ids, list):
        ids = [ids]
    if ref.get("no_target"):
        ids = []
    return [int(i) for i in ids if int(i) > 0]


def convert(refs, instances, split, image_dir):
    files = {im["id"]: im["file_name"] for im in instances["images"]}
    known = {a["id"] for a in instances["annotations"]}
    rows, problems = [], []
    for ref in refs:
        if split and ref.get("split") != split:
            continue
        image = files.get(ref["image_id"])
        if image is None:
            problems.append("ref %s: image %s is not in the annotation file" % (ref.get("ref_id"), ref["image_id"]))
            continue
        ids = ann_ids(ref)
        missing = [i for i in ids if i not in known]
        if missing:
            problems.append("ref %s: annotation %s is not in the annotation file" % (ref.get("ref_id"), missing[0]))
        for k, sent in enumerate(ref.get("sentences", [])):
            text = sent.get("sent", sent.get("raw", "")) if isinstance(sent, dict) else str(sent)
            sent_id = sent.get("sent_id", k) if isinstance(sent, dict) else k
            rows.append({"image": os.path.join(image_dir, image) if image_dir else image, "prompt": text,
                         "coco_ann_ids": ";".join(str(i) for i in ids), "id": "%s_%s" % (ref.get("ref_id"), sent_id),
                         "split": ref.get("split", ""), "ref_id": ref.get("ref_id")})
    return rows, problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--refs", required=True, help="refs(unc).p / refs(umd).p (RefCOCO family) or grefs(unc).json")
    p.add_argument("--instances", required=True, help="the COCO annotation file the refs point into")
    p.add_argument("--split", default="", help="keep only this split (val, testA, ...); default all")
    p.add_argument("--image-dir", default="", help="folder of the images (written before each file_name)")
    p.add_argument("--out", required=True, help="manifest CSV to write")
    a = p.parse_args(argv)
    with open(a.instances) as f:
        instances = json.load(f)
    rows, problems = convert(load_refs(a.refs), instances, a.split, a.image_dir)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, ["image", "prompt", "coco_ann_ids", "id", "split", "ref_id"])
        w.writeheader()
        w.writerows(rows)
    for problem in problems[:10]:
        print("refer_to_manifest: " + problem, file=sys.stderr)
    print("refer_to_manifest: %d expressions -> %s (%d problems)" % (len(rows), a.out, len(problems)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
