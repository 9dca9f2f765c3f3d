#!/usr/bin/python3
"""Reports of four fixed jobs, normalised so that two builds can be compared byte for byte.

    /usr/bin/python3 tests/tools/report_snapshot.py BIN_DIR OUT_DIR
    diff -r OUT_A/normalised OUT_B/normalised     # empty: the reports are identical
    /usr/bin/python3 tests/tools/report_snapshot.py --compare REPORT_DIR_A REPORT_DIR_B

The jobs: the demo (2 workers), the demo's 3 classes with --metrics all and every report option
(3 workers), a 3D prediction manifest (NIfTI, --metrics all, nnU-Net summary) and the Python backend
(examples/python-model/colour_segmenter.py). Normalised away: job ids, times and rates, the git
revision, and which worker evaluated how many rows (timing decides that); every metric, count,
row and file name stays. Used to show that a restructuring changed no report.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(SRC, "examples", "demo")


def write_volumes(root):
    import nibabel as nib
    rng = np.random.default_rng(29)
    os.makedirs(root, exist_ok=True)
    rows = ["id,mask,prediction"]
    for i in range(10):
        shape = tuple(int(s) for s in rng.integers(8, 24, 3))
        ref = np.zeros(shape, np.uint8)
        for label in (1, 2, 3):
            c = [int(rng.integers(2, s - 2)) for s in shape]
            r = int(rng.integers(2, 5))
            zz, yy, xx = np.ogrid[:shape[0], :shape[1], :shape[2]]
            ref[(zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= r * r] = label
        pred = ref.copy()
        flip = rng.random(shape) < 0.05
        pred[flip] = rng.integers(0, 4, int(flip.sum()))
        if i % 3 == 1:
            ref[:, int(rng.integers(0, shape[1])), :] = 255  # An ignored slab (the default ignore index).
        zooms = (1.0, 0.8, 2.5) if i % 2 else (1.0, 1.0, 1.0)
        for name, vol in (("r", ref), ("p", pred)):
            img = nib.Nifti1Image(np.transpose(vol, (2, 1, 0)), np.diag(list(zooms[::-1]) + [1.0]))
            img.header.set_zooms(zooms[::-1])
            nib.save(img, os.path.join(root, f"{name}{i:02d}.nii.gz"))
        rows.append(f"case{i:02d},r{i:02d}.nii.gz,p{i:02d}.nii.gz")  # Relative: the same manifest bytes anywhere.
    path = os.path.join(root, "manifest.csv")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    return path


def jobs(work):
    demo_manifest = os.path.join(DEMO, "manifest.csv")
    model = os.path.join(DEMO, "model.pt")
    return {
        "demo": ["--model", model, "--manifest", demo_manifest, "--workers", "2"],
        "all": ["--model", model, "--manifest", demo_manifest, "--workers", "3", "--metrics", "all",
                "--iou-thresholds", "0.5,0.9", "--nnunet-summary", "--thumbnails", "3", "--shard-size", "8"],
        "volumes": ["--manifest", write_volumes(os.path.join(work, "volumes")), "--metrics", "all",
                    "--num-classes", "4", "--workers", "2", "--nnunet-summary"],
        "python": ["--model", os.path.join(SRC, "examples", "python-model", "colour_segmenter.py"),
                   "--manifest", demo_manifest, "--workers", "2", "--python", "/usr/bin/python3"],
    }


VOLATILE_JSON = {"job_id", "created_unix", "finished_unix", "wall_seconds", "images_per_second", "throughput",
                 "workers", "git_revision"}


def scrub_json(value):
    if isinstance(value, dict):
        return {k: ("*" if k in VOLATILE_JSON else scrub_json(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_json(v) for v in value]
    return value


def scrub_text(text, job_id):
    text = text.replace(job_id, "JOB")
    text = re.sub(r"Wall time: [^\n]*", "Wall time: *", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d( UTC)?", "TIME", text)
    return text


def normalise(report_dir, out_dir, data_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(report_dir, "report.json")) as f:
        report = json.load(f)
    job_id = report["job_id"]
    revision = report.get("provenance", {}).get("git_revision", "")
    for name in sorted(os.listdir(report_dir)):
        path = os.path.join(report_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        if name == "report.json":
            text = json.dumps(scrub_json(report), indent=1, sort_keys=False)
            text = text.replace(data_dir, "DATA")
        else:
            text = scrub_text(text, job_id).replace(data_dir, "DATA")
            if revision:
                text = text.replace(revision, "REVISION")
            # Worker tables: which worker took which rows, and how fast, depends on timing.
            text = re.sub(r"(?m)(^\| worker \| device[^\n]*\n\|[-| ]*\n)(\|[^\n]*\n)*", r"\1", text)
            text = re.sub(r"(<h2>Workers</h2>\n<table>).*?(</table>)", r"\1\2", text, flags=re.S)
            text = re.sub(r"\d+(\.\d+)? images/s", "RATE images/s", text)
        with open(os.path.join(out_dir, name), "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)


def compare(a, b):
    """Two report folders of one job's settings (two builds, say), normalised and compared."""
    import filecmp
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        na, nb = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        normalise(a, na, "\0")
        normalise(b, nb, "\0")
        differ = [f for f in sorted(os.listdir(na)) if not filecmp.cmp(os.path.join(na, f), os.path.join(nb, f), False)]
    print("  reports identical (ids and times aside)" if not differ else f"  reports DIFFER: {', '.join(differ)}")
    return 1 if differ else 0


def main():
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    bin_dir, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    data_dir = os.path.join(out, "data")
    for name, args in jobs(data_dir).items():
        report_dir = os.path.join(out, "reports", name)
        p = subprocess.run([os.path.join(bin_dir, "tally"), "run", "--out", report_dir] + args,
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{name}: tally run exited {p.returncode}\n{p.stderr[-2000:]}")
        normalise(report_dir, os.path.join(out, "normalised", name), data_dir)
    print(os.path.join(out, "normalised"))


if __name__ == "__main__":
    main()
