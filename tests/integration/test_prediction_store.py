"""The prediction store (--prediction-store DIR), end to end with real processes: rows found in the
store are scored from it without running the model, and a job's numbers are those of a run without
the store. A Python model appends the id of every row it predicts to a file, so the test counts the
model's own work, not Tally's account of it. The file is named by the environment, not by a
--model-option: the bytes of a file an option names are part of the model's digest.
"""
import base64
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import textwrap
import time
import unittest
import zlib

import numpy as np
from PIL import Image

import tallytest as tt
import test_volumes as tv  # Its volumes and 3D network (as a module: its tests are not run twice here).

PY = "/usr/bin/python3"

# Class 1 where red > blue + offset; `offset` comes from a weights file when one is named.
COUNTING_MODEL = """
import os
import re
import time
import numpy as np

class Model:
    num_classes = 2

    def __init__(self, devices, options):
        self.log = os.environ["STORE_TEST_LOG"]
        self.offset = 0
        if "weights" in options:
            with open(options["weights"]) as f:
                self.offset = int(f.read())

    def predict(self, images, rows):
        time.sleep(float(os.environ.get("STORE_TEST_SLEEP", "0")))
        with open(self.log, "a") as f:
            for row in rows:
                f.write(row["id"] + "\\n")
        return [(im[..., 0].astype(np.int32) > im[..., 2].astype(np.int32) + self.offset).astype(np.int64)
                for im in images]
"""


# A single score a pixel: the probability (red + 0.5) / 256, on a grid no threshold below is within
# 1/65535 of, so a rescore from kept 16-bit scores counts every pixel as the model's own floats do.
SCORE_MODEL = """
import os
import numpy as np

class Model:
    outputs_probabilities = True

    def __init__(self, devices, options):
        self.log = os.environ["STORE_TEST_LOG"]

    def predict(self, images, rows):
        with open(self.log, "a") as f:
            for row in rows:
                f.write(row["id"] + "\\n")
        return [((im[..., 0].astype(np.float32) + 0.5) / 256).astype(np.float32) for im in images]
"""


def thumbnails(out):
    """report.html's thumbnails: (class, row index) -> JPEG bytes."""
    with open(os.path.join(out, "report.html")) as f:
        html = f.read()
    pattern = r'<figure data-index="(\d+)" data-class="(\d+)"><img src="data:image/jpeg;base64,([A-Za-z0-9+/=]+)"'
    return {(int(c), int(i)): base64.b64decode(b) for i, c, b in re.findall(pattern, html)}


def predicted(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return f.read().split()


class PredictionStoreTest(unittest.TestCase):
    def setUp(self):
        self.root = tt.tmpdir(self)
        self.manifest = tt.write_dataset(os.path.join(self.root, "data"), np.random.default_rng(11), 24, [(12, 16)],
                                         classes=2)
        self.model = os.path.join(self.root, "model.py")
        with open(self.model, "w") as f:
            f.write(textwrap.dedent(COUNTING_MODEL))
        self.store = os.path.join(self.root, "store")
        self.ids = [f"s{i:04d}" for i in range(24)]

    def run_py(self, name, *extra, store=True, log="log"):
        out = os.path.join(self.root, name)
        args = ["--python", PY, "--batch-size", "4"]
        if store:
            args += ["--prediction-store", self.store]
        os.environ["STORE_TEST_LOG"] = os.path.join(self.root, log)
        try:
            tt.tally_run(self.model, self.manifest, out, *args, *extra)
        finally:
            del os.environ["STORE_TEST_LOG"]
        return out, tt.read_report(out)

    def test_a_sample_extended_to_the_whole_manifest_predicts_only_the_rest(self):
        out, r = self.run_py("sample", "--sample", "25%", "--workers", "2")
        sampled = predicted(os.path.join(self.root, "log"))
        self.assertEqual(len(sampled), 6)
        self.assertEqual(r["rows_from_store"], 0)
        self.assertEqual(r["prediction_store"], self.store)
        out, r = self.run_py("full", "--workers", "2")
        everything = predicted(os.path.join(self.root, "log"))
        self.assertEqual(sorted(everything), sorted(self.ids))  # Every row once: the sample's were not run again.
        self.assertEqual(r["rows_from_store"], 6)
        self.assertEqual(r["images_evaluated"], 24)
        plain, _ = self.run_py("plain", store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("6 of 24 rows from it", f.read())
        # Again: nothing for the model; the numbers unchanged. The rows found in the store were not
        # decoded (found before decoding): their thumbnails decode them, the same pictures.
        out, r = self.run_py("again", "--workers", "3")
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 24)
        self.assertEqual(r["rows_from_store"], 24)
        self.assertTrue(tt.same_files(out, plain))
        self.assertEqual(thumbnails(out), thumbnails(plain))
        self.assertEqual(len(thumbnails(out)), 5)  # Class 1 (background has none), its 5 worst.

    def test_changed_weights_or_image_bytes_are_predicted_again(self):
        weights = os.path.join(self.root, "weights.txt")
        with open(weights, "w") as f:
            f.write("0")
        self.run_py("first", "--model-option", "weights=" + weights)
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 24)
        with open(weights, "w") as f:
            f.write("9")  # Same option, same file name, new bytes: another model.
        out, r = self.run_py("new_weights", "--model-option", "weights=" + weights)
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 48)
        self.assertEqual(r["rows_from_store"], 0)
        # One image rewritten under its name: that row alone goes to the model.
        path = os.path.join(self.root, "data", "img", "s0005.png")
        pixels = np.asarray(Image.open(path)).copy()
        pixels[0, 0] = 255 - pixels[0, 0]
        Image.fromarray(pixels).save(path)
        out, r = self.run_py("new_image", "--model-option", "weights=" + weights)
        self.assertEqual(predicted(os.path.join(self.root, "log"))[48:], ["s0005"])
        self.assertEqual(r["rows_from_store"], 23)
        plain, _ = self.run_py("plain", "--model-option", "weights=" + weights, store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))

    def test_a_broken_entry_is_predicted_again_and_never_scored(self):
        self.run_py("first")
        entries = sorted(glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps")))
        self.assertEqual(len(entries), 24)
        with open(entries[0], "r+b") as f:  # A flipped byte in the labels' payload.
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x5A]))
        with open(entries[1], "r+b") as f:  # Truncated, as a killed writer could not leave it.
            f.truncate(60)
        shutil.copy(entries[3], entries[2])  # Another row's entry under this row's name.
        out, r = self.run_py("second")
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 24 + 3)
        self.assertEqual(r["rows_from_store"], 21)
        plain, _ = self.run_py("plain", store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))
        self.assertEqual(glob.glob(os.path.join(self.store, "**", "*.tmp.*"), recursive=True), [])

    def test_store_verbs_count_list_and_drop_the_least_recently_used(self):
        self.run_py("first", "--sample", "12")  # 12 entries, then 12 more a little later.
        first = set(predicted(os.path.join(self.root, "log")))
        time.sleep(0.05)
        self.run_py("second")
        entries = sorted(glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps")))
        sizes = sum(os.path.getsize(e) for e in entries)
        stats = json.loads(tt.tally("store", "stats", self.store, "--json").stdout)
        self.assertEqual((stats["entries"], stats["bytes"]), (24, sizes))
        self.assertEqual([(g["entries"], g["bytes"]) for g in stats["groups"]], [(24, sizes)])
        listed = json.loads(tt.tally("store", "ls", self.store, "--json").stdout)
        self.assertEqual(sorted(e["path"] for e in listed), entries)
        self.assertTrue(all((e["height"], e["width"], e["classes"]) == (12, 16, 2) for e in listed))
        # The second run scored the sample's 12 from the store (a hit is a use): the 12 written by
        # the second run are as recent. Keep about half: the oldest go, whichever they are, and
        # the next run predicts exactly the rows whose entries went.
        by_age = sorted(entries, key=lambda e: (os.stat(e).st_mtime_ns, e))
        keep = sum(os.path.getsize(e) for e in by_age[12:])
        p = tt.tally("store", "gc", self.store, "--max-bytes", str(keep))
        self.assertIn("dropped 12 of 24 entries", p.stdout)
        gone = set(by_age[:12])
        self.assertEqual(set(glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps"))), set(entries) - gone)
        before = len(predicted(os.path.join(self.root, "log")))
        out, r = self.run_py("third")
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))) - before, 12)
        self.assertEqual(r["rows_from_store"], 12)
        plain, _ = self.run_py("plain", store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))
        self.assertEqual(len(first), 12)
        p = tt.tally("store", "gc", self.store, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--max-bytes", p.stderr)

    def test_torchscript_rows_come_from_the_store_and_settings_key_it(self):
        out1 = os.path.join(self.root, "ts1")
        out2 = os.path.join(self.root, "ts2")
        out3 = os.path.join(self.root, "ts3")
        model = tt.fixture("three_class.pt")
        tt.tally_run(model, self.manifest, out1, "--prediction-store", self.store)
        tt.tally_run(model, self.manifest, out2, "--prediction-store", self.store, "--workers", "2")
        self.assertEqual(tt.read_report(out1)["rows_from_store"], 0)
        self.assertEqual(tt.read_report(out2)["rows_from_store"], 24)
        self.assertTrue(tt.same_files(out1, out2))
        # Another normalisation, input size or precision changes the predictions' bits: nothing is
        # taken from the store; each run's own settings find its own entries again.
        for i, flags in enumerate([("--mean", "0.5,0.5,0.5"), ("--input-size", "8x8"), ("--precision", "bf16")]):
            tt.tally_run(model, self.manifest, f"{out3}_{i}", "--prediction-store", self.store, *flags)
            self.assertEqual(tt.read_report(f"{out3}_{i}")["rows_from_store"], 0, flags)
            tt.tally_run(model, self.manifest, f"{out3}_{i}_again", "--prediction-store", self.store, *flags)
            self.assertEqual(tt.read_report(f"{out3}_{i}_again")["rows_from_store"], 24, flags)
        self.assertEqual(len(glob.glob(os.path.join(self.store, "v1", "*", "*", "settings"))), 4)


    def rescore(self, name, *extra, check=True, store=None):
        out = os.path.join(self.root, name)
        os.environ["STORE_TEST_LOG"] = os.path.join(self.root, "log")
        try:
            p = tt.tally("rescore", "--from-store", store or self.store, "--model", self.model, "--manifest",
                         self.manifest, "--out", out, "--python", PY, "--max-failed-fraction", "1", *extra, check=check)
        finally:
            del os.environ["STORE_TEST_LOG"]
        return out, p

    def test_rescore_equals_a_fresh_run_with_the_new_flags_and_runs_no_model(self):
        self.run_py("stored", "--workers", "2")
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 24)
        for i, flags in enumerate([("--metrics", "dice,iou,precision,recall", "--include-background"),
                                   ("--metrics", "lesion,dice", "--lesion-dilation", "1", "--lesion-min-volume", "3"),
                                   ("--ignore-index", "none", "--metrics", "dice,accuracy")]):
            out, _ = self.rescore(f"rescored{i}", "--workers", "3", *flags)
            self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 24)  # The model never ran.
            r = tt.read_report(out)
            # Without an ignore index the masks' 255 bands are labels out of range: those rows fail in both.
            self.assertEqual((r["rows_from_store"], r["images_failed"]), (24, 0) if i < 2 else (18, 6))
            fresh, _ = self.run_py(f"fresh{i}", *flags, store=False, log="plain_log")
            self.assertTrue(tt.same_files(out, fresh), flags)
        # One value by hand: class 1's Dice of each row, the model's rule against the mask (255 ignored).
        rows = {row["id"]: row for row in tt.read_per_image(os.path.join(self.root, "rescored0")) if row["class"] == "1"}
        for i in (0, 5, 17):
            name = f"s{i:04d}"
            im = np.asarray(Image.open(os.path.join(self.root, "data", "img", name + ".png"))).astype(np.int32)
            ref = np.asarray(Image.open(os.path.join(self.root, "data", "msk", name + ".png")))
            tp, fp, fn, _ = tt.counts((im[..., 0] > im[..., 2]).astype(np.uint8), ref, 2)[1]
            want = tt.ratio(2 * tp, 2 * tp + fp + fn)
            self.assertTrue(tt.same(float(rows[name]["dice"]), want), (name, rows[name]["dice"], want))

    def test_rescore_refuses_what_would_change_a_prediction_and_fails_rows_it_lacks(self):
        self.run_py("stored", "--sample", "25%")
        out, p = self.rescore("other_mean", "--mean", "0.5,0.5,0.5", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--mean", p.stderr)
        for flag in (("--compile",), ("--decode", "gpu"), ("--prediction-store", self.store)):
            _, p = self.rescore("refused", *flag, check=False)
            self.assertEqual(p.returncode, 2, flag)
            self.assertIn(flag[0], p.stderr)
        weights = os.path.join(self.root, "weights.txt")
        tt.write_text(weights, "3")
        _, p = self.rescore("other_model", "--model-option", "weights=" + weights, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no predictions of this model", p.stderr)
        # The whole manifest from a 25 % sample's store: 6 rows scored, 18 failed naming the store.
        out, _ = self.rescore("partial")
        r = tt.read_report(out)
        self.assertEqual((r["images_evaluated"], r["rows_from_store"], r["images_failed"]), (6, 6, 18))
        self.assertTrue(all("has no prediction of this row" in f["reason"] for f in r["failures"]))
        self.assertEqual(len(predicted(os.path.join(self.root, "log"))), 6)

    def test_a_store_past_its_bound_evicts_and_the_job_is_unchanged(self):
        self.run_py("sizing", "--sample", "4", store=True)
        entry = max(os.path.getsize(e) for e in glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps")))
        shutil.rmtree(self.store)
        bound = 8 * entry
        out, r = self.run_py("bounded", "--store-max-bytes", str(bound))
        self.assertEqual((r["images_evaluated"], r["images_failed"]), (24, 0))
        entries = glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps"))
        self.assertLessEqual(sum(os.path.getsize(e) for e in entries), bound)
        self.assertLess(len(entries), 24)
        plain, _ = self.run_py("plain", store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))

    def test_torchscript_single_logit_keeps_its_scores(self):
        model = tt.fixture("single_logit.pt")  # logit r - 0.5 (r in [0, 1]): no threshold below is near a pixel's.
        tt.tally_run(model, self.manifest, os.path.join(self.root, "sl_first"), "--prediction-store", self.store,
                     "--batch-size", "4")
        flags = ("--thresholds", "0.45,0.5,0.55")
        rescored = os.path.join(self.root, "sl_rescored")
        tt.tally("rescore", "--from-store", self.store, "--model", model, "--manifest", self.manifest, "--out", rescored,
                 "--workers", "2", *flags)
        fresh = os.path.join(self.root, "sl_fresh")
        tt.tally_run(model, self.manifest, fresh, *flags)
        r = tt.read_report(rescored)
        self.assertEqual(r["rows_from_store"], 24)
        self.assertTrue(tt.same_files(rescored, fresh))
        self.assertEqual(r["thresholds"], tt.read_report(fresh)["thresholds"])
        # The kept scores: the model's probability, sigmoid(r - 0.5), to 16 bits.
        digest = {row["id"]: row["image_xxh128"] for row in tt.read_per_image(rescored)}["s0009"]
        entry = glob.glob(os.path.join(self.store, "v1", "*", "*", "*", digest + ".tps"))[0]
        with open(entry, "rb") as f:
            data = f.read()
        height, width = struct.unpack("<II", data[16:24])
        raw = zlib.decompress(data[104:], wbits=-15)
        scores = np.frombuffer(raw[(height * width + 7) // 8:], "<u2").reshape(height, width).astype(np.int64)
        red = np.asarray(Image.open(os.path.join(self.root, "data", "img", "s0009.png")))[..., 0] / 255.0
        want = np.round(65535 / (1 + np.exp(-(red - 0.5))))
        self.assertLessEqual(np.max(np.abs(scores - want)), 1)  # float32 on the model's side.

    def test_torchscript_predictions_rescored_on_cpu_workers(self):
        model = tt.fixture("three_class.pt")
        first = os.path.join(self.root, "ts_first")
        tt.tally_run(model, self.manifest, first, "--prediction-store", self.store, "--metrics", "dice")
        settings = glob.glob(os.path.join(self.store, "v1", "*", "*", "settings"))
        self.assertEqual(len(settings), 1)
        with open(settings[0]) as f:
            text = f.read()
        self.assertTrue(text.startswith("tally-store-settings-v1\nmodel "), text)
        self.assertIn("\nprecision fp32\n", text)
        rescored = os.path.join(self.root, "ts_rescored")
        tt.tally("rescore", "--from-store", self.store, "--model", model, "--manifest", self.manifest, "--out", rescored,
                 "--metrics", "dice,iou,hd95", "--workers", "2", "--max-failed-fraction", "1")
        fresh = os.path.join(self.root, "ts_fresh")
        tt.tally_run(model, self.manifest, fresh, "--metrics", "dice,iou,hd95")
        self.assertTrue(tt.same_files(rescored, fresh))
        self.assertEqual(tt.read_report(rescored)["rows_from_store"], 24)
        # The entries as PNG files, by input digest (export) and by row id (rescore --save-predictions):
        # each the model's labels as torch computes them here.
        exported = os.path.join(self.root, "exported")
        p = tt.tally("store", "export", self.store, "--out", exported)
        self.assertIn("exported 24 entries", p.stdout)
        by_id = os.path.join(self.root, "by_id")
        tt.tally("rescore", "--from-store", self.store, "--model", model, "--manifest", self.manifest, "--out",
                 os.path.join(self.root, "ts_saved"), "--save-predictions", by_id, "--max-failed-fraction", "1")
        digests = {r["id"]: r["image_xxh128"] for r in tt.read_per_image(rescored)}
        for name in ("s0000", "s0007", "s0023"):
            want, _ = tt.predict(model, os.path.join(self.root, "data", "img", name + ".png"))
            png = glob.glob(os.path.join(exported, "*", "*", digests[name] + ".png"))
            self.assertEqual(len(png), 1)
            np.testing.assert_array_equal(np.asarray(Image.open(png[0])), want)
            np.testing.assert_array_equal(np.asarray(Image.open(os.path.join(by_id, name + ".png"))), want)
        self.assertEqual(len(glob.glob(os.path.join(exported, "*", "*", "settings"))), 1)
        # An entry read as docs/prediction-store.md lays it out, by a script of the user's own.
        entry = glob.glob(os.path.join(self.store, "v1", "*", "*", "*", digests["s0007"] + ".tps"))[0]
        with open(entry, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"TALLYPS3")
        header, bits, height, width, classes, depth = struct.unpack("<IIIIII", data[8:32])
        self.assertEqual((header, bits, classes, depth, data[96]), (104, 2, 3, 1, 0))
        raw = np.frombuffer(zlib.decompress(data[104:], wbits=-15), np.uint8)
        labels = ((raw[:, None] >> np.arange(0, 8, bits, dtype=np.uint8)) & ((1 << bits) - 1)).reshape(-1)
        want, _ = tt.predict(model, os.path.join(self.root, "data", "img", "s0007.png"))
        np.testing.assert_array_equal(labels[:height * width].reshape(height, width), want)


    def test_tallyd_default_store_and_a_killed_worker_leaves_no_half_entry(self):
        cluster = tt.Cluster(self, os.path.join(self.root, "cluster"), tallyd_args=["--prediction-store", self.store])
        log = os.path.join(self.root, "cluster_log")
        slow = cluster.start_worker(env={"STORE_TEST_LOG": log, "STORE_TEST_SLEEP": "0.4"})
        cluster.wait_registered(1)
        job = cluster.submit(self.model, self.manifest, "--python", PY, "--batch-size", "2", "--shard-size", "4")
        cluster.wait_for_progress(job, 0.25)
        slow.kill()  # SIGKILL: whatever it was writing stays a temporary file, never an entry.
        slow.wait()
        cluster.start_worker(env={"STORE_TEST_LOG": log})
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(self.root, "killed")
        cluster.fetch(job, out)
        r = tt.read_report(out)
        self.assertEqual((r["prediction_store"], r["images_evaluated"]), (self.store, 24))
        plain, _ = self.run_py("plain", "--batch-size", "2", store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, plain))
        # Every entry there is whole and verifies (export reads each one and fails on any that does not).
        p = tt.tally("store", "export", self.store, "--out", os.path.join(self.root, "export"))
        self.assertIn("exported 24 entries", p.stdout)
        # Opting out, then the default again: none from the store, then all.
        off = cluster.submit(self.model, self.manifest, "--python", PY, "--prediction-store", "off")
        cluster.wait(off)
        cluster.fetch(off, os.path.join(self.root, "off"))
        r = tt.read_report(os.path.join(self.root, "off"))
        self.assertEqual((r["prediction_store"], r["rows_from_store"]), (None, 0))
        again = cluster.submit(self.model, self.manifest, "--python", PY, "--batch-size", "2")
        cluster.wait(again)
        cluster.fetch(again, os.path.join(self.root, "again"))
        self.assertEqual(tt.read_report(os.path.join(self.root, "again"))["rows_from_store"], 24)
        self.assertTrue(tt.same_files(os.path.join(self.root, "again"), plain))
        # `tally rescore JOB`: the job's model, data, settings and store, other metrics.
        rescored = os.path.join(self.root, "rescored_job")
        os.environ["STORE_TEST_LOG"] = log
        try:
            cluster.cli("rescore", job, "--out", rescored, "--metrics", "dice,iou,recall", "--workers", "2")
        finally:
            del os.environ["STORE_TEST_LOG"]
        fresh, _ = self.run_py("fresh", "--metrics", "dice,iou,recall", store=False, log="plain_log")
        self.assertTrue(tt.same_files(rescored, fresh))
        self.assertEqual(tt.read_report(rescored)["rows_from_store"], 24)
        p = cluster.cli("rescore", off, "--out", os.path.join(self.root, "x"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("kept no predictions", p.stderr)

    def test_kept_scores_rescore_thresholds_as_the_model_counts_them(self):
        folder = os.path.join(self.root, "score_model")  # Its own folder: sibling .py files are the model's digest.
        os.makedirs(folder)
        self.model = os.path.join(folder, "score.py")
        tt.write_text(self.model, textwrap.dedent(SCORE_MODEL))
        log = os.path.join(self.root, "log")
        self.run_py("stored", "--workers", "2")  # No --thresholds: the scores are kept all the same.
        self.assertEqual(len(predicted(log)), 24)
        flags = ("--thresholds", "0.8,0.3,0.5", "--metrics", "dice,iou")
        out, _ = self.rescore("rescored", "--workers", "3", *flags)
        self.assertEqual(len(predicted(log)), 24)  # No model ran.
        r = tt.read_report(out)
        self.assertEqual((r["rows_from_store"], r["images_evaluated"]), (24, 24))
        fresh, _ = self.run_py("fresh", *flags, store=False, log="plain_log")
        self.assertTrue(tt.same_files(out, fresh))
        self.assertEqual(r["thresholds"], tt.read_report(fresh)["thresholds"])
        self.assertEqual(r["best_threshold"], tt.read_report(fresh)["best_threshold"])
        # A run with --thresholds takes the store's rows too, counted from their scores.
        again, _ = self.run_py("again", *flags, "--workers", "2")
        self.assertEqual(tt.read_report(again)["rows_from_store"], 24)
        self.assertEqual(tt.read_report(again)["thresholds"], r["thresholds"])
        self.assertEqual(len(predicted(log)), 24)
        # The sweep by hand: foreground where (red + 0.5) / 256 > t, against the masks (255 ignored).
        images, masks = [], []
        for i in range(24):
            images.append(np.asarray(Image.open(os.path.join(self.root, "data", "img", f"s{i:04d}.png"))))
            masks.append(np.asarray(Image.open(os.path.join(self.root, "data", "msk", f"s{i:04d}.png"))))
        for sweep in r["thresholds"]:
            total = np.zeros(3, np.int64)
            for im, ref in zip(images, masks):
                fg, known = (im[..., 0].astype(np.float64) + 0.5) / 256 > sweep["threshold"], ref <= 1
                total += (np.sum(fg & (ref == 1) & known), np.sum(fg & (ref == 0) & known), np.sum(~fg & (ref == 1)))
            tp, fp, fn = (int(v) for v in total)
            self.assertTrue(tt.same(sweep["dice_global"], 2 * tp / (2 * tp + fp + fn)), sweep)
        # An entry's scores as docs/prediction-store.md lays them out: round(p * 65535), after the labels.
        digest = {row["id"]: row["image_xxh128"] for row in tt.read_per_image(out)}["s0003"]
        digest = hashlib.sha256(digest.encode()).hexdigest()[:32]  # A Python model's input: with no other columns.
        entry = glob.glob(os.path.join(self.store, "v1", "*", "*", "*", digest + ".tps"))[0]
        with open(entry, "rb") as f:
            data = f.read()
        height, width = struct.unpack("<II", data[16:24])
        self.assertEqual((data[12], struct.unpack("<I", data[96:100])[0]), (1, 16))  # 1-bit labels, 16-bit scores.
        raw = zlib.decompress(data[104:], wbits=-15)
        scores = np.frombuffer(raw[(height * width + 7) // 8:], "<u2").reshape(height, width)
        want = np.round((images[3][..., 0].astype(np.float64) + 0.5) / 256 * 65535).astype(np.uint16)
        np.testing.assert_array_equal(scores, want)

    def test_volumes_come_from_the_store_and_rescore_as_a_fresh_run(self):
        root = os.path.join(self.root, "volumes")
        os.makedirs(root)
        manifest, _ = tv.VolumeModelTest.make_set(self, root, np.random.default_rng(41), n=4)
        torch = tv.torch
        torch.manual_seed(3)
        model = os.path.join(root, "net3d.pt")
        torch.jit.script(tv.Net3D().eval()).save(model)
        window = ("--sliding-window", "8,6,7", "--overlap", "0.4", "--intensity", "zscore")

        def run(name, *extra, store=True):
            out = os.path.join(self.root, name)
            tt.tally("run", "--model", model, "--manifest", manifest, "--out", out, "--shard-size", "1", *window,
                     *(("--prediction-store", self.store) if store else ()), *extra)
            return out, tt.read_report(out)

        first, r = run("v_first", "--workers", "2")
        self.assertEqual((r["rows_from_store"], r["images_evaluated"]), (0, 4))
        self.assertEqual(len(glob.glob(os.path.join(self.store, "v1", "*", "*", "*", "*.tps"))), 4)
        again, r = run("v_again", "--workers", "3")
        self.assertEqual(r["rows_from_store"], 4)
        self.assertTrue(tt.same_files(first, again))
        other, r = run("v_other", "--overlap", "0.25")  # Another setting: predicted again.
        self.assertEqual(r["rows_from_store"], 0)
        # Rescored with other metrics on CPU workers: as a fresh run of the model with them.
        flags = ("--metrics", "dice,hd95,assd,lesion", "--include-background")
        rescored = os.path.join(self.root, "v_rescored")
        tt.tally("rescore", "--from-store", self.store, "--model", model, "--manifest", manifest, "--out", rescored,
                 "--workers", "2", *window, *flags)  # The 0.25 run is not this one: its --overlap differs.
        self.assertEqual(tt.read_report(rescored)["rows_from_store"], 4)
        fresh, _ = run("v_fresh", *flags, store=False)
        self.assertTrue(tt.same_files(rescored, fresh))
        p = tt.tally("rescore", "--from-store", self.store, "--model", model, "--manifest", manifest, "--out",
                     os.path.join(self.root, "v_refused"), "--sliding-window", "8,6,7", "--overlap", "0.4", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--intensity 'none' here, 'zscore' in the stored run", p.stderr)
        # Exported as NIfTI: the labels of the saved predictions of a run.
        saved = os.path.join(self.root, "v_saved")
        run("v_saving", "--save-predictions", saved)
        exported = os.path.join(self.root, "v_exported")
        tt.tally("store", "export", self.store, "--out", exported)
        digests = sorted(glob.glob(os.path.join(exported, "*", "*", "*.nii.gz")))
        self.assertEqual(len(digests), 8)  # Two overlaps, four volumes each.
        saved_labels = sorted(np.asarray(tv.read_zyx(os.path.join(saved, f"case{i}.nii.gz"))[0]).tobytes()
                              for i in range(4))
        exported_labels = [np.asarray(tv.read_zyx(d)[0]).tobytes() for d in digests]
        self.assertTrue(all(l in exported_labels for l in saved_labels))


if __name__ == "__main__":
    unittest.main()
