"""The prediction store (--prediction-store DIR), end to end with real processes: rows found in the
store are scored from it without running the model, and a job's numbers are those of a run without
the store. A Python model appends the id of every row it predicts to a file, so the test counts the
model's own work, not Tally's account of it. The file is named by the environment, not by a
--model-option: the bytes of a file an option names are part of the model's digest.
"""
import base64
import glob
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
        for flag in (("--compile",), ("--decode", "gpu"), ("--thresholds", "0.5"), ("--prediction-store", self.store)):
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
        self.assertEqual(data[:8], b"TALLYPS2")
        header, bits, height, width, classes = struct.unpack("<IIIII", data[8:28])
        self.assertEqual((header, bits, classes), (96, 2, 3))
        raw = np.frombuffer(zlib.decompress(data[96:], wbits=-15), np.uint8)
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


if __name__ == "__main__":
    unittest.main()
