"""Helpers for Tally's integration tests: real tallyd / tally-worker / tally processes on loopback,
synthetic datasets, and an independent reference implementation of every metric.

The reference uses only Debian's numpy, scipy, PIL and torch (to run the same TorchScript file):
PIL decodes, torch predicts, numpy counts, scipy.ndimage computes the surface distances. None of it
shares code with Tally.
"""
import csv
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from scipy import ndimage

BIN = os.environ.get("TALLY_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
SRC = os.environ.get("TALLY_SOURCE", os.path.join(os.path.dirname(__file__), "../.."))
FIXTURES = os.path.join(SRC, "tests", "fixtures")


def fixture(name):
    return os.path.join(FIXTURES, name)


def tmpdir(test):
    d = tempfile.mkdtemp(prefix="tally-it-")
    test.addCleanup(shutil.rmtree, d, True)
    return d


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------

def write_text(path, text):
    """Writes `text` to `path` (a model file, a manifest); returns `path`."""
    with open(path, "w") as f:
        f.write(text)
    return path


def write_manifest(root, rows, name="manifest.csv"):
    """The CSV lines `rows` (header first) as `root`/`name`; returns its path."""
    return write_text(os.path.join(root, name), "\n".join(rows) + "\n")


def blob_mask(rng, h, w, classes, ignore=False):
    """Label map with a few discs and boxes of classes 1..classes-1, optional ignore band."""
    m = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    for c in range(1, classes):
        for _ in range(rng.integers(0, 3)):
            cy, cx = rng.uniform(0, h), rng.uniform(0, w)
            r = rng.uniform(1, max(2, min(h, w) / 3))
            m[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = c
    if ignore:
        m[rng.integers(0, h), :] = 255
    return m


def write_dataset(root, rng, n, sizes, classes=3, jpeg_every=0):
    """Images whose red channel is loosely tied to the mask (so red_vs_rest / three_class models
    make partly right predictions) and masks with blobs and some ignore pixels. Returns the
    manifest path."""
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    os.makedirs(os.path.join(root, "msk"), exist_ok=True)
    rows = ["id,image,mask"]
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        mask = blob_mask(rng, h, w, classes, ignore=(i % 4 == 1))
        base = np.where(mask[..., None] == 1, [200, 60, 40], np.where(mask[..., None] == 2, [40, 60, 200], [90, 90, 90]))
        img = np.clip(base + rng.normal(0, 60, (h, w, 3)), 0, 255).astype(np.uint8)
        name = f"s{i:04d}"
        if jpeg_every and i % jpeg_every == 0:
            Image.fromarray(img).save(os.path.join(root, "img", name + ".jpg"), quality=90)
            img_rel = f"img/{name}.jpg"
        else:
            Image.fromarray(img).save(os.path.join(root, "img", name + ".png"))
            img_rel = f"img/{name}.png"
        Image.fromarray(mask).save(os.path.join(root, "msk", name + ".png"))
        rows.append(f"{name},{img_rel},msk/{name}.png")
    return write_manifest(root, rows)


def marked_dataset(root, n, marked, size=8):
    """n images whose left half is red (class 1 for the red_vs_rest family) and masks with class 1
    on the top half; the rows in `marked` carry the fixtures' mark (green 255 at pixel (0, 0))."""
    os.makedirs(root, exist_ok=True)
    mask = np.zeros((size, size), np.uint8)
    mask[: size // 2] = 1
    Image.fromarray(mask).save(os.path.join(root, "mask.png"))
    rows = ["id,image,mask"]
    for i in range(n):
        img = np.zeros((size, size, 3), np.uint8)
        img[:, : size // 2, 0] = 220
        img[:, :, 1] = 40
        if i in marked:
            img[0, 0, 1] = 255
        Image.fromarray(img).save(os.path.join(root, f"i{i:03d}.png"))
        rows.append(f"r{i:03d},i{i:03d}.png,mask.png")
    return write_manifest(root, rows)


def write_pairs(root, pairs):
    """Writes (pred, ref) label-map pairs for the echo4.pt model: the image's red channel holds the
    predicted label. Returns the manifest path."""
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    os.makedirs(os.path.join(root, "msk"), exist_ok=True)
    rows = ["image,mask"]
    for i, (pred, ref) in enumerate(pairs):
        img = np.zeros(pred.shape + (3,), np.uint8)
        img[..., 0] = pred
        img[..., 1] = 17  # Other channels are ignored by the model.
        Image.fromarray(img).save(os.path.join(root, "img", f"p{i:04d}.png"))
        Image.fromarray(ref.astype(np.uint8)).save(os.path.join(root, "msk", f"p{i:04d}.png"))
        rows.append(f"img/p{i:04d}.png,msk/p{i:04d}.png")
    return write_manifest(root, rows)


# ---------------------------------------------------------------------------------------------
# Running Tally
# ---------------------------------------------------------------------------------------------

def free_port():
    """A loopback port free now (for daemons that must be told their port in advance)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tally(*args, check=True, timeout=600):
    """Runs the tally CLI; returns the CompletedProcess (stdout/stderr as text)."""
    p = subprocess.run([os.path.join(BIN, "tally")] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"tally {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def run_binary(name, *args, check=True, timeout=120):
    """Runs one of the built binaries (tallyd, tally-worker, the bench tools); returns the CompletedProcess."""
    p = subprocess.run([os.path.join(BIN, name)] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{name} {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def tally_run(model, manifest, out, *extra, check=True):
    """`tally run`; rows may fail without a non-zero exit (exit code 3) unless the test sets
    --max-failed-fraction itself."""
    if not any(str(a).startswith("--max-failed-fraction") or str(a).startswith("--max_failed_fraction") for a in extra):
        extra = extra + ("--max-failed-fraction", "1")
    return tally("run", "--model", model, "--manifest", manifest, "--out", out, *extra, check=check)


class Cluster:
    """A tallyd on a free loopback port plus workers started by hand (so tests can kill them)."""

    def __init__(self, test, root, lease_seconds=2.0, state=None, tallyd_args=(), client_args=()):
        self.root = root
        self.client_args = list(client_args)  # Added to every `tally` call (tokens, TLS).
        os.makedirs(root, exist_ok=True)
        self.workers = []
        self.state = state or os.path.join(root, "state")
        self.lease_seconds = lease_seconds
        self.tallyd_args = list(tallyd_args)
        self.tallyd_log = open(os.path.join(root, "tallyd.log"), "w")
        self.logs = [self.tallyd_log]
        self.address = None
        test.addCleanup(self.stop)
        self.start_tallyd()

    def start_tallyd(self):
        """Starts tallyd (again, on the same port and state after the first time)."""
        port_file = os.path.join(self.root, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        listen = self.address or "127.0.0.1:0"
        self.tallyd = subprocess.Popen(
            [os.path.join(BIN, "tallyd"), "--listen", listen, "--port-file", port_file, "--state-dir",
             self.state, "--lease-seconds", str(self.lease_seconds), "--heartbeat-seconds", "0.5"] + self.tallyd_args,
            stdout=self.tallyd_log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if time.time() > deadline or self.tallyd.poll() is not None:
                raise AssertionError("tallyd did not start: " + self.log("tallyd.log"))
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()

    def start_worker(self, *extra, name=None, device="cpu", env=None):
        """`env`: variables added to the worker's environment."""
        i = len(self.workers)
        log = open(os.path.join(self.root, f"worker-{i}.log"), "w")
        self.logs.append(log)
        p = subprocess.Popen([os.path.join(BIN, "tally-worker"), "--coordinator", self.address, "--device", device,
                              "--threads", "1", "--name", name or f"w{i}"] + list(extra),
                             stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.workers.append(p)
        return p

    def wait_registered(self, n, timeout=60):
        deadline = time.time() + timeout
        while self.log("tallyd.log").count(" registered: ") < n:
            if time.time() > deadline:
                raise AssertionError("workers did not register:\n" + self.log("tallyd.log"))
            time.sleep(0.05)

    def cli(self, *args, check=True):
        return tally(*args, "--server", self.address, *self.client_args, check=check)

    def submit(self, model, manifest, *extra):
        return self.cli("submit", "--model", model, "--manifest", manifest, *extra).stdout.strip()

    def job(self, job_id):
        """Job fields parsed from `tally status` (done/total, state, failed)."""
        deadline = time.time() + 30
        while True:  # Rides out a coordinator restart.
            p = self.cli("status", job_id, check=False)
            if p.returncode == 0 or time.time() > deadline or "cannot reach" not in p.stderr:
                break
            time.sleep(0.2)
        if p.returncode != 0:
            raise AssertionError(p.stderr)
        lines = p.stdout.splitlines()
        line = lines[0].split()
        done, total = line[2].split("/")
        stalled = [l.strip() for l in lines[1:] if l.strip().startswith("stalled:")]
        return {"state": line[1], "done": int(done), "total": int(total), "failed": int(line[3]),
                "stalled": stalled[0] if stalled else ""}

    def wait_for_progress(self, job_id, fraction, timeout=120):
        """Waits until `fraction` of the job's rows are done; returns the job's fields."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job(job_id)
            if j["done"] >= fraction * j["total"]:
                return j
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} made no progress")

    def wait(self, job_id, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job(job_id)
            if j["state"] in ("succeeded", "failed", "cancelled"):
                # The report is built right after; tally report retries until it is there.
                return j
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not finish in {timeout} s")

    def fetch(self, job_id, out, timeout=60):
        deadline = time.time() + timeout
        while True:
            p = self.cli("report", job_id, "--out", out, check=False)
            if p.returncode == 0:
                return
            if time.time() > deadline:
                raise AssertionError(p.stderr)
            time.sleep(0.2)

    def log(self, name):
        with open(os.path.join(self.root, name), errors="replace") as f:
            return f.read()

    def stop(self):
        for p in self.workers + [self.tallyd]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers + [self.tallyd]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


# ---------------------------------------------------------------------------------------------
# Reading reports
# ---------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def _mix64(z):
    """SplitMix64's finaliser (the state advanced by the golden gamma first)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_key(identity):
    """A row's key as docs/metrics.md "Intervals" defines it: FNV-1a 64 of the id's bytes, then SplitMix64."""
    h = 0xcbf29ce484222325
    for b in identity.encode():
        h = ((h ^ b) * 0x100000001b3) & _MASK64
    return _mix64(h)


def row_position(rows, seed, index):
    """Where manifest row `index` comes in a --order random:SEED job of `rows` rows (docs/metrics.md "Answers
    before the end": a 4-round Feistel network over the smallest even-bit power of two holding the
    rows, cycle-walked into [0, rows)), decrypting as the documented permutation does."""
    if rows <= 1:
        return index
    bits = 2
    while bits < 62 and (1 << bits) < rows:
        bits += 1
    bits += bits % 2
    half = bits // 2
    mask = (1 << half) - 1

    def round_(r, x):
        return _mix64(seed ^ _mix64((x * 0xD1B54A32D192ED03 + r) & _MASK64)) & mask

    def decrypt(x):
        left, right = x >> half, x & mask
        for r in range(3, -1, -1):
            left, right = right ^ round_(r, left), left
        return (left << half) | right

    x = decrypt(index)
    while x >= rows:
        x = decrypt(x)
    return x


def betting_ci(values, population=0):
    """docs/metrics.md "Intervals", written again here: the 95% betting interval (Waudby-Smith & Ramdas 2023) of
    the mean of `values` in [0, 1], taken in the order given; a uniform random sample without
    replacement of `population` values when it is > 0. (nan, nan) below 10 values."""
    import math
    x = [float(v) for v in values]
    n = len(x)
    if n < 10:
        return (float("nan"), float("nan"))
    if 0 < population < n:
        population = 0
    alpha, theta, c = 0.05, 0.5, 0.75
    lam, total, squares = [], 0.0, 0.25
    for t, v in enumerate(x):
        lam.append(math.sqrt(2 * math.log(2 / alpha) / (n * squares / (t + 1))))
        total += v
        mu = (0.5 + total) / (t + 2)
        squares += (v - mu) ** 2

    def rejected(m, upper):
        threshold = math.log(1 / (alpha * ((1 - theta) if upper else theta)))
        capital, drawn = 0.0, 0.0
        for t, v in enumerate(x):
            mt = (population * m - drawn) / (population - t) if population > 0 else m
            drawn += v
            if not upper:
                if mt <= 0:
                    if mt < 0 or v > 0:
                        return True
                    continue
                capital += math.log1p(min(lam[t], c / mt) * (v - mt))
            else:
                if mt >= 1:
                    if mt > 1 or v < 1:
                        return True
                    continue
                capital += math.log1p(-min(lam[t], c / (1 - mt)) * (v - mt))
            if capital >= threshold:
                return True
        return False

    lo, hi = 0.0, 1.0
    if rejected(0.0, False):
        a, b = 0.0, 1.0
        while b - a > 1e-10:
            mid = (a + b) / 2
            a, b = (mid, b) if rejected(mid, False) else (a, mid)
        lo = a
    if rejected(1.0, True):
        a, b = 0.0, 1.0
        while b - a > 1e-10:
            mid = (a + b) / 2
            a, b = (a, mid) if rejected(mid, True) else (mid, b)
        hi = b
    return (lo, max(lo, hi))


def sha256_file(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_per_image(out):
    with open(os.path.join(out, "per_image.csv")) as f:
        return list(csv.DictReader(f))


def read_report(out):
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def same_files(a, b, name="per_image.csv"):
    with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
        return fa.read() == fb.read()


DIGEST_COLUMNS = ("image_xxh128", "mask_xxh128", "prediction_xxh128")


def same_scores(a, b):
    """per_image.csv of two reports equal but for the digests of the files read (two jobs that score
    the same labels from different files: a model's output and its saved predictions)."""
    def rows(d):
        with open(os.path.join(d, "per_image.csv"), newline="") as f:
            return [{k: v for k, v in r.items() if k not in DIGEST_COLUMNS} for r in csv.DictReader(f)]
    return rows(a) == rows(b)


def proc_status(pid, field):
    """A field of /proc/PID/status in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def num(s):
    return float(s)  # float() reads nan, inf and -inf as written by Tally.


def same(a, b, rel=1e-9):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


# ---------------------------------------------------------------------------------------------
# Independent reference
# ---------------------------------------------------------------------------------------------

_models = {}


def predict(model_path, image_path):
    """Predicted label map: PIL decode, torch forward, bilinear resize, argmax (or logit > 0)."""
    if model_path not in _models:
        _models[model_path] = torch.jit.load(model_path).eval()
    img = np.asarray(Image.open(image_path).convert("RGB"))
    with torch.no_grad():
        x = torch.from_numpy(img.copy()).permute(2, 0, 1)[None].float() / 255.0
        out = _models[model_path](x)
        if isinstance(out, dict):
            out = out["out"]
        h, w = img.shape[:2]
        if tuple(out.shape[-2:]) != (h, w):
            out = F.interpolate(out.float(), size=(h, w), mode="bilinear", align_corners=False)
        if out.shape[1] == 1:
            return (out[0, 0] > 0).numpy().astype(np.int64), 2
        return out[0].argmax(0).numpy().astype(np.int64), out.shape[1]


def write_prediction_manifest(model_path, manifest, root):
    """The model's predictions of every row (predict() above) saved as PNGs under root/pred, and a
    prediction manifest for them (root/pm.csv, same ids, images and masks). Returns (path, classes)."""
    os.makedirs(os.path.join(root, "pred"))
    with open(manifest) as f:
        rows = list(csv.DictReader(f))
    lines, k = ["id,image,mask,prediction"], 0
    for r in rows:
        pred, k = predict(model_path, os.path.join(root, r["image"]))
        Image.fromarray(pred.astype(np.uint8)).save(os.path.join(root, "pred", r["id"] + ".png"))
        lines.append(f"{r['id']},{r['image']},{r['mask']},pred/{r['id']}.png")
    path = os.path.join(root, "pm.csv")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, k


def counts(pred, ref, k):
    valid = ref != 255
    out = []
    for c in range(k):
        p, r = (pred == c) & valid, (ref == c) & valid
        tp = int(np.sum(p & r))
        fp = int(np.sum(p & ~r))
        fn = int(np.sum(~p & r))
        tn = int(np.sum(valid)) - tp - fp - fn
        out.append((tp, fp, fn, tn))
    return out


def ratio(a, b):
    return float("nan") if b == 0 else a / b


def count_metrics(tp, fp, fn, tn):
    return {
        "dice": ratio(2 * tp, 2 * tp + fp + fn),
        "iou": ratio(tp, tp + fp + fn),
        "precision": ratio(tp, tp + fp),
        "recall": ratio(tp, tp + fn),
        "specificity": ratio(tn, tn + fp),
        "accuracy": ratio(tp + tn, tp + tn + fp + fn),
    }


def surface_metrics(pred_c, ref_c, spacing=(1.0, 1.0), tolerance=1.0):
    """MONAI's definitions: edges by erosion with the cross (4-connected in 2D, 6-connected in 3D;
    the border counts as background), directed distances from scipy's exact EDT (spacing per
    axis), hd95 = max of the two 95th percentiles, assd pooled, nsd with <=."""
    nan, inf = float("nan"), float("inf")
    if not pred_c.any() and not ref_c.any():
        return {"hd": nan, "hd95": nan, "assd": nan, "nsd": nan}
    if not pred_c.any() or not ref_c.any():
        return {"hd": inf, "hd95": inf, "assd": inf, "nsd": 0.0}
    cross = ndimage.generate_binary_structure(pred_c.ndim, 1)
    ep = pred_c ^ ndimage.binary_erosion(pred_c, structure=cross, border_value=0)
    er = ref_c ^ ndimage.binary_erosion(ref_c, structure=cross, border_value=0)
    d_pg = ndimage.distance_transform_edt(~er, sampling=spacing)[ep]
    d_gp = ndimage.distance_transform_edt(~ep, sampling=spacing)[er]
    both = np.concatenate([d_pg, d_gp])
    return {
        "hd": float(max(d_pg.max(), d_gp.max())),
        "hd95": float(max(np.percentile(d_pg, 95), np.percentile(d_gp, 95))),
        "assd": float(both.mean()),
        "nsd": float((np.sum(d_pg <= tolerance) + np.sum(d_gp <= tolerance)) / both.size),
    }


def reference_rows(pred, ref, k, spacing=(1.0, 1.0), tolerance=1.0, surface=True):
    """Per-class reference values for one image: list of dicts with counts and every metric."""
    rows = []
    valid = ref != 255
    for c, (tp, fp, fn, tn) in enumerate(counts(pred, ref, k)):
        row = {"tp": tp, "fp": fp, "fn": fn, "tn": tn}
        row.update(count_metrics(tp, fp, fn, tn))
        if surface:
            # Ignore pixels are background in both masks for surface distances.
            row.update(surface_metrics((pred == c) & valid, (ref == c) & valid, spacing, tolerance))
        rows.append(row)
    return rows
