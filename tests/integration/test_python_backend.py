"""The Python model backend (--model PATH.py), end to end with real processes: tally run, tallyd,
workers and their stub processes running Debian's python3.

Expected values come from numpy here (the same formulas as tallytest's reference), never from Tally.
"""
import math
import os
import shutil
import sys
import textwrap
import unittest

import numpy as np
from PIL import Image

import tallytest as tt

PY = "/usr/bin/python3"  # Debian's, with numpy and torch (the python3 first on PATH may lack them).


def write_model(root, name, source):
    path = os.path.join(root, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(source))
    return path


def run(model, manifest, out, *extra, check=True):
    return tt.tally_run(model, manifest, out, "--python", PY, *extra, check=check)


# A model computing in numpy float32 what the reference below computes: foreground score
# 8 * (r - b) / 255 - 1.5 for the prompt "red", 8 * (b - r) / 255 - 1.5 for "blue".
PROMPT_MODEL = """
import os, signal, time
import numpy as np

class Model:
    def __init__(self, devices, options):
        assert devices == ["cpu"], devices
        self.kind = options.get("kind", "score")

    def predict(self, images, rows):
        outs = []
        for image, row in zip(images, rows):
            for key in ("index", "id", "image", "mask", "prompt", "note"):
                assert key in row, (key, row)
            prompt = row["prompt"]
            if prompt == "boom":
                raise ValueError("boom on " + row["id"])
            if prompt == "slowboom":
                time.sleep(1.0)
                raise ValueError("slow boom on " + row["id"])
            if prompt == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if prompt == "hang":
                time.sleep(1000)
            rgb = image.astype(np.float32)
            r, b = rgb[..., 0], rgb[..., 2]
            diff = (r - b) if prompt == "red" else (b - r)
            score = np.float32(8.0) * diff / np.float32(255.0) - np.float32(1.5)
            if prompt == "wrongshape":
                score = score[:-1]
            if self.kind == "labels":
                labels = (score > 0).astype(np.int32)
                if prompt == "label5":
                    labels[2, 3] = 5  # Past the class count.
                outs.append(labels)
            else:
                outs.append(score)
        return outs
"""


def reference_score(image, prompt):
    rgb = image.astype(np.float32)
    r, b = rgb[..., 0], rgb[..., 2]
    diff = (r - b) if prompt == "red" else (b - r)
    return np.float32(8.0) * diff / np.float32(255.0) - np.float32(1.5)


def write_referring_set(root, rng, n_images=6, h=20, w=28):
    """Referring-segmentation style: each image has two rows (one per expression, "red" and "blue"),
    each with its own binary mask; some masks are empty. Returns (manifest, rows) with rows =
    [(image array, mask array, prompt, id)]."""
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    os.makedirs(os.path.join(root, "msk"), exist_ok=True)
    lines = ["id,image,mask,prompt,note"]
    rows = []
    for i in range(n_images):
        img = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(root, "img", f"im{i}.png"))
        for prompt in ("red", "blue"):
            if i % 3 == 2 and prompt == "blue":
                mask = np.zeros((h, w), np.uint8)  # an empty reference
            else:
                mask = (rng.random((h, w)) < 0.4).astype(np.uint8)
            mask[0, : (i % 4)] = 255  # a few ignored pixels
            name = f"im{i}_{prompt}"
            Image.fromarray(mask).save(os.path.join(root, "msk", name + ".png"))
            lines.append(f'{name},img/im{i}.png,msk/{name}.png,{prompt},"a, quoted ""note"""')
            rows.append((img, mask, prompt, name))
    path = os.path.join(root, "refs.csv")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, rows


def set_prompts(manifest, prompts):
    """Rewrites the prompt of the manifest rows given ({row: prompt}, rows counted from 0)."""
    with open(manifest) as f:
        lines = f.read().splitlines()
    for row, prompt in prompts.items():
        parts = lines[row + 1].split(",", 4)
        parts[3] = prompt
        lines[row + 1] = ",".join(parts)
    with open(manifest, "w") as f:
        f.write("\n".join(lines) + "\n")


def binary_counts(fg, mask):
    valid = mask != 255
    ref = (mask == 1) & valid
    pred = fg & valid
    tp = int(np.sum(pred & ref))
    fp = int(np.sum(pred & ~ref))
    fn = int(np.sum(~pred & ref))
    tn = int(np.sum(valid)) - tp - fp - fn
    return tp, fp, fn, tn


def dice_iou(tp, fp, fn, empty_one):
    if tp + fp + fn == 0:
        return (1.0, 1.0) if empty_one else (math.nan, math.nan)
    return 2 * tp / (2 * tp + fp + fn), tp / (tp + fp + fn)


def nanmean(values):
    v = [x for x in values if not math.isnan(x)]
    return sum(v) / len(v) if v else math.nan


class PythonBackendTest(unittest.TestCase):
    def test_same_results_as_torchscript_for_the_same_model(self):
        # A Python class running the very TorchScript file: per_image.csv must equal the TorchScript
        # backend's, byte for byte, with one worker and with three.
        root = tt.tmpdir(self)
        rng = np.random.default_rng(7)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 20, [(24, 32), (17, 29)], classes=3)
        model = write_model(root, "wrap.py", """
            import numpy as np, torch
            class Model:
                def __init__(self, devices, options):
                    self.net = torch.jit.load(options["pt"]).eval()
                def predict(self, images, rows):
                    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
                    return list(self.net(x))
        """)
        pt = tt.fixture("three_class.pt")
        tt.tally_run(pt, manifest, os.path.join(root, "ts"), "--batch-size", "4", "--workers", "1")
        run(model, manifest, os.path.join(root, "py1"), "--model-option", f"pt={pt}", "--batch-size", "4",
            "--workers", "1")
        run(model, manifest, os.path.join(root, "py3"), "--model-option", f"pt={pt}", "--batch-size", "4",
            "--workers", "3", "--shard-size", "4")
        self.assertTrue(tt.same_files(os.path.join(root, "ts"), os.path.join(root, "py1")))
        self.assertTrue(tt.same_files(os.path.join(root, "py1"), os.path.join(root, "py3")))
        report = tt.read_report(os.path.join(root, "py1"))
        self.assertEqual(report["images_evaluated"], 20)
        self.assertEqual(report["num_classes"], 3)

    def test_compile_is_refused_where_torch_has_no_compile_and_for_torchscript(self):
        # Debian's torch 1.13 has no torch.compile: the job fails naming compile and the version, never
        # runs uncompiled. A TorchScript model with --compile is a usage error; a .pt2 package on a CPU
        # build (LibTorch 1.13) fails naming what it needs.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(3), 4, [(8, 8)], classes=2)
        model = write_model(root, "net.py", """
            import numpy as np, torch
            class Model:
                num_classes = 2
                def __init__(self, devices, options):
                    self.net = torch.nn.Conv2d(3, 2, 1)
                def predict(self, images, rows):
                    return [(i[..., 0] > i[..., 2]).astype(np.int64) for i in images]
        """)
        import torch
        p = run(model, manifest, os.path.join(root, "c"), "--compile", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--compile needs torch.compile", p.stderr)
        self.assertIn("has torch " + torch.__version__, p.stderr)
        self.assertEqual(tt.read_report(os.path.join(root, "c"))["images_evaluated"], 0)
        p = tt.tally_run(tt.fixture("three_class.pt"), manifest, os.path.join(root, "t"), "--compile", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--compile applies to Python models", p.stderr)
        package = os.path.join(root, "model.pt2")
        shutil.copy(tt.fixture("three_class.pt"), package)
        p = tt.tally_run(package, manifest, os.path.join(root, "p"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is an AOTInductor package (.pt2), which needs LibTorch 2.6 or newer", p.stderr)
        # tally export (python/tally/export.py) needs torch 2.6 in the interpreter it is given: it says
        # so naming the version, and writes nothing.
        p = tt.tally("export", "--model", tt.fixture("three_class.pt"), "--input-size", "8x8",
                     "--out", os.path.join(root, "e.pt2"), "--python", sys.executable, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("needs torch 2.6 or newer", p.stderr)
        self.assertIn("has torch " + torch.__version__, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(root, "e.pt2")))
        p = tt.tally("export", "--model", tt.fixture("three_class.pt"), "--out", os.path.join(root, "e.pt2"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--input-size", p.stderr)

    def test_compile_trial_keeps_or_declines_once_for_the_job(self):
        # Debian's torch 1.13 has no torch.compile, so the model installs a stand-in: its "compiled"
        # twin shifts the class-1 logit by +0.25 (a difference the trial must report) and sleeps
        # `twin_delay` instead of the eager net's `delay`. A faster twin is kept and every row is
        # scored from it; a slower one is declined and every row is eager's; 1 and 2 workers agree.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 12, [(8, 10)], classes=2)
        model = write_model(root, "standin.py", """
            import time
            import numpy as np, torch

            class Net(torch.nn.Module):
                def __init__(self, delay, shift=0.0):
                    super().__init__()
                    self.delay, self.shift = delay, shift
                def forward(self, x):
                    time.sleep(self.delay)
                    c1 = x[:, 0] - 0.5 + self.shift
                    return torch.stack([torch.zeros_like(c1), c1], 1)

            class Model:
                num_classes = 2
                def __init__(self, devices, options):
                    twin = Net(float(options["twin_delay"]), 0.25)
                    torch.compile = lambda module, dynamic=False: twin  # The stand-in.
                    self.net = Net(float(options["delay"]))
                def predict(self, images, rows):
                    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
                    return self.net(x)
        """)
        with open(manifest) as f:
            rows = [line.split(",") for line in f.read().split()[1:]]

        def expected_dice(shift):
            want = []
            for _, img, msk in rows:
                red = np.asarray(Image.open(os.path.join(root, "data", img)))[..., 0]
                c1 = red.astype(np.float32) / np.float32(255) - np.float32(0.5) + np.float32(shift)
                pred = (c1 > 0).astype(np.uint8)  # The first maximum on ties: class 0.
                ref = np.asarray(Image.open(os.path.join(root, "data", msk)))
                want.append(tt.count_metrics(*tt.counts(pred, ref, 2)[1])["dice"])
            return want

        for name, delay, twin_delay, ran, shift in (("kept", 0.2, 0.0, "compiled", 0.25),
                                                    ("declined", 0.0, 0.2, "eager (declined)", 0.0)):
            outs = []
            for workers in (1, 2):
                out = os.path.join(root, f"{name}{workers}")
                run(model, manifest, out, "--compile", "--batch-size", "4", "--workers", str(workers),
                    "--model-option", f"delay={delay}", "--model-option", f"twin_delay={twin_delay}")
                outs.append(out)
                c = tt.read_report(out)["compile"]
                self.assertEqual(c["ran"], ran, c)
                self.assertEqual(c["batch"], 4)
                self.assertEqual(c["pixels"], 4 * 8 * 10)
                self.assertAlmostEqual(c["max_abs_diff"], 0.25, delta=1e-6)
                self.assertGreater(c["argmax_changed_pixels"], 0)
                self.assertLessEqual(c["argmax_changed_pixels"], c["pixels"])
                faster, slower = sorted((c["eager_ms_per_batch"], c["compiled_ms_per_batch"]))
                self.assertLess(faster, 100)
                self.assertGreater(slower, 190)
                with open(os.path.join(out, "summary.md")) as f:
                    self.assertIn("compiled" if ran == "compiled" else "declined, ran eager", f.read())
            self.assertTrue(tt.same_files(*outs))
            got = {r["id"]: float(r["dice"]) for r in tt.read_per_image(outs[0]) if r["class"] == "1"}
            for (rid, _, _), want in zip(rows, expected_dice(shift)):
                self.assertTrue(tt.same(got[rid], want, 1e-12) or (math.isnan(want) and math.isnan(got[rid])), rid)

    def test_colour_segmenter_example_equals_the_torchscript_demo(self):
        root = tt.tmpdir(self)
        demo = os.path.join(tt.SRC, "examples", "demo")
        tt.tally_run(os.path.join(demo, "model.pt"), os.path.join(demo, "manifest.csv"), os.path.join(root, "ts"))
        run(os.path.join(tt.SRC, "examples", "python-model", "colour_segmenter.py"), os.path.join(demo, "manifest.csv"),
            os.path.join(root, "py"), "--workers", "2")
        self.assertTrue(tt.same_files(os.path.join(root, "ts"), os.path.join(root, "py")))

    def test_prompts_several_rows_per_image_and_every_convention_against_numpy(self):
        root = tt.tmpdir(self)
        manifest, rows = write_referring_set(os.path.join(root, "data"), np.random.default_rng(3))
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        thresholds = [0.2, 0.5, 0.8]
        iou_ts = [0.3, 0.5]
        out = os.path.join(root, "out")
        run(model, manifest, out, "--workers", "2", "--batch-size", "2", "--thresholds", "0.8,0.2,0.5",
            "--empty-score", "one", "--iou-thresholds", "0.3,0.5")
        report = tt.read_report(out)
        per_image = tt.read_per_image(out)
        self.assertEqual(report["images_evaluated"], len(rows))
        self.assertEqual(report["empty_score"], "one")
        # Primary threshold: logit > 0. Per image and class, dice/iou with empty -> 1.
        by_id = {}
        for r in per_image:
            by_id.setdefault(r["id"], {})[r["class"]] = r
        dice_fg, iou_fg = [], []
        for img, mask, prompt, name in rows:
            score = reference_score(img, prompt)
            fg = score > 0
            for c, pred in ((0, ~fg), (1, fg)):
                m = mask.copy()
                if c == 0:
                    m = np.where(mask == 255, 255, 1 - mask).astype(np.uint8)
                tp, fp, fn, tn = binary_counts(pred, m)
                got = by_id[name][str(c)]
                self.assertEqual((int(got["tp"]), int(got["fp"]), int(got["fn"]), int(got["tn"])), (tp, fp, fn, tn),
                                 f"{name} class {c}")
                d, i = dice_iou(tp, fp, fn, True)
                self.assertTrue(tt.same(tt.num(got["dice"]), d), (name, c, got["dice"], d))
                self.assertTrue(tt.same(tt.num(got["iou"]), i), (name, c, got["iou"], i))
                if c == 1:
                    dice_fg.append(d)
                    iou_fg.append(i)
        cls1 = report["classes"][1]
        self.assertTrue(tt.same(cls1["dice_mean"], nanmean(dice_fg)))
        self.assertTrue(tt.same(cls1["iou_mean"], nanmean(iou_fg)))
        for t in iou_ts:
            share = sum(1 for v in iou_fg if v >= t) / len(iou_fg)
            self.assertTrue(tt.same(cls1[f"iou_ge_{t}"], share), (t, cls1.get(f"iou_ge_{t}"), share))
        # The sweep: foreground where sigmoid(score) > t.
        sweep = report["thresholds"]
        self.assertEqual([s["threshold"] for s in sweep], sorted(thresholds))
        best, best_dice = None, -1
        for s in sweep:
            t = s["threshold"]
            dices, ious, total = [], [], np.zeros(4, np.int64)
            for img, mask, prompt, name in rows:
                prob = 1.0 / (1.0 + np.exp(-reference_score(img, prompt).astype(np.float64)))
                tp, fp, fn, tn = binary_counts(prob > t, mask)
                total += (tp, fp, fn, tn)
                d, i = dice_iou(tp, fp, fn, True)
                dices.append(d)
                ious.append(i)
            self.assertTrue(tt.same(s["dice_mean"], nanmean(dices)), (t, s, nanmean(dices)))
            self.assertTrue(tt.same(s["iou_mean"], nanmean(ious)))
            tp, fp, fn, _ = total
            self.assertTrue(tt.same(s["dice_global"], 2 * tp / (2 * tp + fp + fn)))
            self.assertTrue(tt.same(s["iou_global"], tp / (tp + fp + fn)))
            if nanmean(dices) > best_dice:
                best, best_dice = t, nanmean(dices)
        self.assertEqual(report["best_threshold"], best)
        with open(os.path.join(out, "report.html")) as f:
            self.assertIn("Threshold sweep", f.read())

    def test_empty_score_nan_leaves_empty_pairs_out(self):
        root = tt.tmpdir(self)
        manifest, rows = write_referring_set(os.path.join(root, "data"), np.random.default_rng(5), n_images=3)
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        out = os.path.join(root, "out")
        run(model, manifest, out, "--model-option", "kind=labels", "--num-classes", "2")
        per_image = tt.read_per_image(out)
        for img, mask, prompt, name in rows:
            fg = reference_score(img, prompt) > 0
            tp, fp, fn, _ = binary_counts(fg, mask)
            got = next(r for r in per_image if r["id"] == name and r["class"] == "1")
            d, _ = dice_iou(tp, fp, fn, False)
            self.assertTrue(tt.same(tt.num(got["dice"]), d), (name, got["dice"], d))
        self.assertEqual(tt.read_report(out)["empty_score"], "nan")

    def test_label_maps_count_like_numpy_and_a_label_past_the_classes_fails_its_row(self):
        # Label maps are counted on the worker's CPUs (four interleaved tables); a label >= the class
        # count fails that row alone, naming the first such pixel.
        root = tt.tmpdir(self)
        manifest, rows = write_referring_set(os.path.join(root, "data"), np.random.default_rng(13), n_images=5,
                                             h=23, w=37)
        set_prompts(manifest, {3: "label5"})
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        out = os.path.join(root, "out")
        run(model, manifest, out, "--model-option", "kind=labels", "--num-classes", "2", "--batch-size", "3")
        report = tt.read_report(out)
        self.assertEqual((report["images_evaluated"], report["images_failed"]), (len(rows) - 1, 1))
        self.assertEqual(report["failures"][0]["index"], 3)
        self.assertIn("the model's output has label 5 at (y=2, x=3) >= number of classes 2",
                      report["failures"][0]["reason"])
        per_image = tt.read_per_image(out)
        for k, (img, mask, prompt, name) in enumerate(rows):
            if k == 3:
                continue
            tp, fp, fn, tn = binary_counts(reference_score(img, prompt) > 0, mask)
            got = next(r for r in per_image if r["id"] == name and r["class"] == "1")
            self.assertEqual((int(got["tp"]), int(got["fp"]), int(got["fn"]), int(got["tn"])), (tp, fp, fn, tn))

    def test_raising_crashing_wrong_shape_and_hanging_rows_fail_alone(self):
        root = tt.tmpdir(self)
        manifest, rows = write_referring_set(os.path.join(root, "data"), np.random.default_rng(9), n_images=6)
        # Rewrite some prompts: row 1 raises, row 4 kills the stub, row 6 has the wrong shape, row 9 hangs.
        bad = {1: "boom", 4: "die", 6: "wrongshape", 9: "hang"}
        set_prompts(manifest, bad)
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        out = os.path.join(root, "out")
        p = run(model, manifest, out, "--batch-size", "4", "--shard-size", "4", "--batch-timeout", "3",
                "--lease-seconds", "3")
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"] + report["images_failed"], len(rows))
        reasons = {f["index"]: f["reason"] for f in report["failures"]}
        self.assertEqual(set(reasons), set(bad), reasons)
        self.assertIn("ValueError: boom on", reasons[1])
        self.assertIn("model process died (signal 9)", reasons[4])
        self.assertIn("shape (19, 28) and dtype float32", reasons[6])
        self.assertIn("20x28", reasons[6])
        self.assertIn("timed out after 3 s", reasons[9])
        # The others match the reference.
        per_image = tt.read_per_image(out)
        for k, (img, mask, prompt, name) in enumerate(rows):
            if k in bad:
                continue
            tp, fp, fn, tn = binary_counts(reference_score(img, prompt) > 0, mask)
            got = next(r for r in per_image if r["id"] == name and r["class"] == "1")
            self.assertEqual((int(got["tp"]), int(got["fp"]), int(got["fn"]), int(got["tn"])), (tp, fp, fn, tn))
        del p

    def test_a_hang_is_blamed_on_its_batch_not_on_a_retry_queued_behind_it(self):
        # Rows 0-1 raise after a second; by then the batch of rows 2-3 (row 2 hangs) is in the
        # stub's queue, ahead of any retry of rows 0-1. The worker finishes that batch before it
        # retries, so the batch timeout catches the hanging batch itself: tallyd's first release
        # names its shard (1), and only the two guilty rows fail. Leases are long (10 s): the batch
        # timeout is what must catch the hang. The worker that restarts after a timeout gives its other
        # shards back unbegun, so its prefetched rows are not counted lost with it.
        root = tt.tmpdir(self)
        manifest, rows = write_referring_set(os.path.join(root, "data"), np.random.default_rng(5), n_images=3)
        bad = {0: "slowboom", 2: "hang"}
        set_prompts(manifest, bad)
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        out = os.path.join(root, "out")
        run(model, manifest, out, "--batch-size", "2", "--shard-size", "2", "--batch-timeout", "3",
            "--lease-seconds", "10", check=False)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"] + report["images_failed"], len(rows))
        reasons = {f["index"]: f["reason"] for f in report["failures"]}
        self.assertEqual(set(reasons), set(bad), reasons)
        self.assertIn("slow boom on", reasons[0])
        self.assertIn("timed out after 3 s", reasons[2])
        with open(os.path.join(out, ".tally", "tallyd.log")) as f:
            releases = [line for line in f if " released shard " in line]
        self.assertTrue(releases)
        self.assertIn(" released shard 1 of job", releases[0])

    def test_init_raising_or_missing_class_fails_the_job_with_the_reason(self):
        root = tt.tmpdir(self)
        manifest, _ = write_referring_set(os.path.join(root, "data"), np.random.default_rng(1), n_images=2)
        broken = write_model(root, "broken.py", """
            class Model:
                def __init__(self, devices, options):
                    raise RuntimeError("weights file is missing: /nowhere/model.safetensors")
                def predict(self, images, rows):
                    return []
        """)
        p = run(broken, manifest, os.path.join(root, "o1"), check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("weights file is missing: /nowhere/model.safetensors", p.stderr)
        self.assertIn("Traceback", tt.read_report(os.path.join(root, "o1"))["error"])
        p = run(broken + ":Segmenter", manifest, os.path.join(root, "o2"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("defines no class 'Segmenter' (it defines: Model)", p.stderr)

    def test_label_maps_need_a_class_count(self):
        root = tt.tmpdir(self)
        manifest, _ = write_referring_set(os.path.join(root, "data"), np.random.default_rng(2), n_images=2)
        model = write_model(root, "prompt_model.py", PROMPT_MODEL)
        p = run(model, manifest, os.path.join(root, "o"), "--model-option", "kind=labels", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("neither its num_classes attribute nor --num-classes", p.stderr)

    def test_usage_errors(self):
        root = tt.tmpdir(self)
        manifest, _ = write_referring_set(os.path.join(root, "data"), np.random.default_rng(2), n_images=1)
        p = tt.tally_run(tt.fixture("three_class.pt"), manifest, os.path.join(root, "o"), "--python", PY,
                         check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--python and --model-option are for Python models", p.stderr)
        p = tt.tally_run(tt.fixture("three_class.pt"), manifest, os.path.join(root, "o"), "--gpus", "0",
                         "--gpus-per-worker", "2", check=False)
        self.assertNotEqual(p.returncode, 0)


if __name__ == "__main__":
    unittest.main()
