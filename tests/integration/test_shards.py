"""Tar shards and plain folders (docs/data.md "Where your data can be"). A job over WebDataset tar
shards gives the report of the same samples in a manifest (per_image.csv with the image column aside,
and every aggregate), with 1 and 3 workers, compressed shards, --order random, a worker SIGKILLed
mid-shard and tallyd SIGKILLed and restarted mid-job; predictions can come from shards; hostile shards
fail only their samples, each naming the shard and member; two folders pair into the manifest's job
and list files without a partner in the report's warnings. Fixtures: Python's tarfile and PIL."""
import csv
import io
import os
import shutil
import signal
import tarfile
import time
import unittest

import numpy as np
from PIL import Image

import tallytest as tt
from test_fault_tolerance import kill_and_restart_tallyd

PER_SHARD = 25
FLAGS = ("--metrics", "dice,hd95", "--shard-size", "8", "--batch-size", "4")
# Aggregates that must not depend on where the samples came from.
AGGREGATES = ("images_total", "images_evaluated", "images_failed", "num_classes", "classes", "foreground_dice_mean",
              "foreground_iou_mean", "foreground_hd95_mean", "failures")


def add(t, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 1700000000
    t.addfile(ti, io.BytesIO(data))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def manifest_rows(manifest):
    base = os.path.dirname(manifest)
    with open(manifest) as f:
        return [(r["id"], os.path.join(base, r["image"]), os.path.join(base, r["mask"])) for r in csv.DictReader(f)]


def write_shards(root, rows, per_shard, mode="w", ext="tar", extra=None, fmt=tarfile.PAX_FORMAT):
    """rows (id, image path, mask path) into shards of `per_shard` samples: id.png (or .jpg), id.seg.png,
    and id.json; `extra(t, i, row)` may add members. Returns the shard paths."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for s in range(0, len(rows), per_shard):
        path = os.path.join(root, f"train-{s // per_shard:06d}.{ext}")
        with tarfile.open(path, mode, format=fmt) as t:
            for i, (rid, image, mask) in enumerate(rows[s:s + per_shard]):
                add(t, rid + os.path.splitext(image)[1], read(image))
                add(t, rid + ".seg.png", read(mask))
                add(t, rid + ".json", b'{"prompt": "cells", "n": %d}' % i)
                if extra:
                    extra(t, s + i, (rid, image, mask))
        paths.append(path)
    return paths


def drop_images(value):
    """A report value without its image paths (they name the shard's member or the file)."""
    if isinstance(value, dict):
        return {k: drop_images(v) for k, v in value.items() if k != "image"}
    if isinstance(value, list):
        return [drop_images(v) for v in value]
    return value


def without_image(out):
    return [{k: v for k, v in r.items() if k != "image"} for r in tt.read_per_image(out)]


class ShardsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-shards-")
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(44), 120,
                                        [(48, 48), (40, 56)], classes=2, jpeg_every=5)
        cls.rows = manifest_rows(cls.manifest)
        cls.shards = write_shards(os.path.join(cls.root, "shards"), cls.rows, PER_SHARD)
        cls.pattern = os.path.join(cls.root, "shards", "train-{000000..000004}.tar")
        cls.model = tt.fixture("slow.pt")
        cls.reference = os.path.join(cls.root, "reference")
        tt.tally_run(cls.model, cls.manifest, cls.reference, "--workers", "1", *FLAGS)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

    def assertSameAsManifest(self, out, what):
        self.assertEqual(without_image(out), without_image(self.reference), what)
        report, reference = tt.read_report(out), tt.read_report(self.reference)
        for key in AGGREGATES:
            self.assertEqual(drop_images(report[key]), drop_images(reference[key]), (what, key))
        self.assertTrue(report["complete"], what)

    def run_shards(self, name, shards, *extra):
        out = os.path.join(self.root, name)
        tt.tally("run", "--model", self.model, "--shards", shards, "--out", out, *FLAGS, *extra)
        return out

    def test_shards_equal_the_manifest_for_1_and_3_workers_compressed_and_random_order(self):
        out = self.run_shards("one", self.pattern, "--workers", "1")
        self.assertSameAsManifest(out, "1 worker")
        report = tt.read_report(out)
        self.assertIn("5 shards", report["manifest"])
        first = tt.read_per_image(out)[0]
        self.assertEqual(first["image"], self.shards[0] + ":s0000.jpg")
        self.assertSameAsManifest(self.run_shards("three", self.pattern, "--workers", "3"), "3 workers")
        # A glob and a list file name the same shards.
        self.assertSameAsManifest(self.run_shards("glob", os.path.join(self.root, "shards", "train-*.tar"),
                                                  "--workers", "2"), "glob")
        listing = tt.write_text(os.path.join(self.root, "shards.txt"),
                                "# the shards\n" + "\n".join(os.path.join("shards", os.path.basename(p))
                                                             for p in self.shards) + "\n\n")
        self.assertSameAsManifest(self.run_shards("list", listing, "--workers", "2"), "list file")
        # Compressed: one lease a shard; the same numbers.
        gz = write_shards(os.path.join(self.root, "gz"), self.rows, PER_SHARD, mode="w:gz", ext="tar.gz")
        out = self.run_shards("gz", os.path.join(self.root, "gz", "train-*.tar.gz"), "--workers", "3")
        self.assertSameAsManifest(out, "tar.gz")
        # --order random reads the samples scattered: uncompressed only.
        out = self.run_shards("random", self.pattern, "--workers", "2", "--order", "random:7")
        self.assertSameAsManifest(out, "random order")
        # --sample draws the same rows from shards as from the manifest (the order depends on the row
        # count and the seed only).
        sampled = self.run_shards("sample", self.pattern, "--workers", "2", "--order", "random:11", "--sample", "40")
        manifest_sampled = os.path.join(self.root, "manifest-sample")
        tt.tally_run(self.model, self.manifest, manifest_sampled, "--workers", "1", *FLAGS, "--order", "random:11",
                     "--sample", "40")
        self.assertEqual(without_image(sampled), without_image(manifest_sampled))
        self.assertEqual(len({r["id"] for r in tt.read_per_image(sampled)}), 40)
        p = tt.tally("run", "--model", self.model, "--shards", os.path.join(self.root, "gz", "train-*.tar.gz"),
                     "--out", os.path.join(self.root, "gz-random"), "--order", "random", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)  # A usage error, found before anything starts.
        self.assertIn("is compressed (read front to back only)", p.stderr)
        self.assertNotIn("coordinator at", p.stderr)

    def test_a_worker_sigkilled_mid_shard_and_tallyd_restarted_lose_nothing(self):
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root, lease_seconds=2.0)
        for _ in range(3):
            cluster.start_worker()
        cluster.wait_registered(3)
        job = cluster.cli("submit", "--model", self.model, "--shards", self.pattern, *FLAGS).stdout.strip()
        at_kill = cluster.wait_for_progress(job, 0.25)
        self.assertLess(at_kill["done"], 120, "the job finished before the kill; make it slower")
        cluster.workers[0].send_signal(signal.SIGKILL)
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "killed")
        cluster.fetch(job, out)
        self.assertSameAsManifest(out, "worker killed")
        # tallyd SIGKILLed mid-job and started again on its state: the job resumes and ends the same.
        job = cluster.cli("submit", "--model", self.model, "--shards", self.pattern, *FLAGS).stdout.strip()
        cluster.wait_for_progress(job, 0.25)
        kill_and_restart_tallyd(self, cluster, root)
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        out = os.path.join(root, "restarted")
        cluster.fetch(job, out)
        self.assertSameAsManifest(out, "tallyd restarted")

    def test_the_python_client_submits_shards(self):
        from tally.client import Client
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root)
        for _ in range(2):
            cluster.start_worker()
        client = Client(cluster.address)
        self.addCleanup(client.close)
        job = client.submit(model=self.model, shards=os.path.relpath(self.pattern), image_ext="png,jpg",
                            mask_ext=".seg.png", metrics="dice,hd95", shard_size=8, batch_size=4)
        self.assertEqual(client.wait([job], timeout=300)[0]["state"], "succeeded")
        out = os.path.join(root, "out")
        client.fetch(job, out)
        self.assertSameAsManifest(out, "python client")

    def test_predictions_from_shards_equal_a_prediction_manifest(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(3)
        lines = ["id,mask,prediction"]
        rows = []
        for rid, _, mask in self.rows[:40]:
            ref = np.asarray(Image.open(mask))
            pred = np.where(rng.random(ref.shape) < 0.1, 1 - np.minimum(ref, 1), ref).astype(np.uint8)
            pp = os.path.join(root, rid + ".pred.png")
            Image.fromarray(pred).save(pp)
            lines.append(f"{rid},{mask},{pp}")
            rows.append((rid, mask, pp))
        manifest = tt.write_manifest(root, lines)
        reference = os.path.join(root, "manifest-out")
        tt.tally("run", "--manifest", manifest, "--out", reference, "--metrics", "dice,hd95")
        path = os.path.join(root, "preds.tar")
        with tarfile.open(path, "w") as t:
            for rid, mask, pp in rows:
                add(t, rid + ".seg.png", read(mask))
                add(t, rid + ".pred.png", read(pp))
        out = os.path.join(root, "shard-out")
        tt.tally("run", "--shards", path, "--out", out, "--metrics", "dice,hd95")
        self.assertEqual(without_image(out), without_image(reference))

    def test_hostile_shards_fail_only_their_samples_naming_shard_and_member(self):
        root = tt.tmpdir(self)
        image, mask = read(self.rows[1][1]), read(self.rows[1][2])
        ext = os.path.splitext(self.rows[1][1])[1]
        good = os.path.join(root, "a-good.tar")
        with tarfile.open(good, "w") as t:
            add(t, "ok1" + ext, image)
            add(t, "ok1.seg.png", mask)
            add(t, "text.png", b"this is not an image")                    # Not an image.
            add(t, "text.seg.png", mask)
            add(t, "nomask" + ext, image)                                  # No mask.
            add(t, "twice" + ext, image)
            add(t, "twice.seg.png", mask)
            add(t, "between" + ext, image)
            add(t, "between.seg.png", mask)
            add(t, "twice.cls", b"3")                                      # The key again, not adjacent.
            link = tarfile.TarInfo("escape" + ext)                         # A symlink out of the data roots.
            link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
            t.addfile(link)
            add(t, "escape.seg.png", mask)
            add(t, "ok2" + ext, image)
            add(t, "ok2.seg.png", mask)
        # A member whose header claims 2 TB (GNU base-256 size), then the end of the file.
        huge = os.path.join(root, "b-huge.tar")
        with tarfile.open(huge, "w", format=tarfile.GNU_FORMAT) as t:
            add(t, "ok3" + ext, image)
            add(t, "ok3.seg.png", mask)
            add(t, "big" + ext, image)
            add(t, "big.seg.png", mask)
        data = bytearray(read(huge))
        at = data.find(b"big" + ext.encode()) // 512 * 512
        data[at + 124:at + 136] = b"\x80" + (2 * 10 ** 12).to_bytes(11, "big")
        data[at + 148:at + 156] = b" " * 8
        data[at + 148:at + 156] = ("%06o\0 " % sum(data[at:at + 512])).encode()
        with open(huge, "wb") as f:
            f.write(data)
        # Truncated inside its second sample's image.
        cut = os.path.join(root, "c-cut.tar")
        with tarfile.open(cut, "w") as t:
            add(t, "ok4" + ext, image)
            add(t, "ok4.seg.png", mask)
            add(t, "cut" + ext, image)
            add(t, "cut.seg.png", mask)
        data = read(cut)
        with open(cut, "wb") as f:
            f.write(data[:data.find(b"cut" + ext.encode()) + 512 + 100])
        # The same key in another shard.
        other = os.path.join(root, "d-other.tar")
        with tarfile.open(other, "w") as t:
            add(t, "ok1" + ext, image)
            add(t, "ok1.seg.png", mask)
            add(t, "ok5" + ext, image)
            add(t, "ok5.seg.png", mask)
        out = os.path.join(root, "out")
        p = tt.tally("run", "--model", self.model, "--shards", os.path.join(root, "*.tar"), "--out", out, *FLAGS,
                     "--max-failed-fraction", "1", check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        report = tt.read_report(out)
        # Two shards end before their end-of-archive marker (a size past the file's end, a cut): what
        # may have followed is in no row, so the job is not complete, and says why.
        self.assertFalse(report["complete"])
        self.assertEqual(len(report["incomplete_sources"]), 2, report["incomplete_sources"])
        evaluated = sorted({r["id"] for r in tt.read_per_image(out)})
        self.assertEqual(evaluated, ["between", "ok1", "ok2", "ok3", "ok4", "ok5", "twice"])
        failed = {os.path.basename(f["id"]) if f["id"].endswith("(the rest)") else f["id"]: f["reason"]
                  for f in report["failures"]}
        expect = {
            "b-huge.tar:(the rest)": ["b-huge.tar", "ends early after", "not in the job"],
            "c-cut.tar:(the rest)": ["c-cut.tar", "ends early after", "not in the job"],
            "text": ["a-good.tar:text.png", "not an image"],
            "nomask": ["a-good.tar", "no mask member"],
            "twice": ["a-good.tar", "its key is that of an earlier sample in this shard"],
            "escape": ["a-good.tar", "escape" + ext, "symbolic link"],
            "big": ["b-huge.tar", "big" + ext, "2000000000000 bytes"],
            "cut": ["c-cut.tar", "cut" + ext, "past the end of the shard", "truncated"],
            "ok1": ["d-other.tar", "its key is that of an earlier sample in shard '" + os.path.join(root, "a-good.tar")],
        }
        self.assertEqual(sorted(failed), sorted(expect))
        for rid, words in expect.items():
            for w in words:
                self.assertIn(w, failed[rid], rid)
        self.assertEqual(report["images_total"], 16)
        self.assertEqual(report["images_evaluated"] + report["images_failed"], 16)
        self.assertTrue(any("end early" in w for w in report["warnings"]), report["warnings"])
        # Not a tar at all: the submission is refused, naming it.
        tt.write_text(os.path.join(root, "zz.tar"), "plain text, not a tar\n" * 40)
        p = tt.tally("run", "--model", self.model, "--shards", os.path.join(root, "zz.tar"), "--out",
                     os.path.join(root, "out2"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("zz.tar", p.stderr)
        p = tt.tally("run", "--model", self.model, "--shards", os.path.join(root, "none-{0..3}.tar"), "--out",
                     os.path.join(root, "out3"), check=False)
        self.assertIn("none-0.tar", p.stderr)


class FoldersTest(unittest.TestCase):
    def test_two_folders_equal_their_manifest_and_list_files_without_a_partner(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(5), 30, [(32, 40)], classes=3,
                                    jpeg_every=4)
        rows = manifest_rows(manifest)
        images, masks = os.path.join(root, "images"), os.path.join(root, "masks")
        lines = ["id,image,mask"]
        for i, (rid, image, mask) in enumerate(rows):
            sub = "a" if i % 2 else "b/c"
            os.makedirs(os.path.join(images, sub), exist_ok=True)
            os.makedirs(os.path.join(masks, sub), exist_ok=True)
            ip = os.path.join(images, sub, rid + os.path.splitext(image)[1])
            mp = os.path.join(masks, sub, rid + "_mask.png")
            shutil.copy(image, ip)
            shutil.copy(mask, mp)
            lines.append(f"{sub}/{rid},{ip},{mp}")
        # Without a partner: an image, a mask; a file of another kind.
        shutil.copy(rows[0][1], os.path.join(images, "lonely" + os.path.splitext(rows[0][1])[1]))
        shutil.copy(rows[0][2], os.path.join(masks, "a", "orphan_mask.png"))
        tt.write_text(os.path.join(images, "notes.txt"), "not an image\n")
        by_id = sorted(lines[1:], key=lambda l: l.split(",")[0])
        reference_manifest = tt.write_manifest(root, [lines[0]] + by_id, "pairs.csv")
        model = tt.fixture("three_class.pt")
        reference = os.path.join(root, "manifest-out")
        tt.tally_run(model, reference_manifest, reference, "--metrics", "dice,hd95")
        out = os.path.join(root, "folders-out")
        p = tt.tally("run", "--model", model, "--images", images, "--masks", masks, "--mask-suffix", "_mask",
                     "--out", out, "--metrics", "dice,hd95", "--workers", "2")
        self.assertEqual(tt.read_per_image(out), tt.read_per_image(reference))
        warnings = tt.read_report(out)["warnings"]
        self.assertTrue(any(w.startswith("1 image(s)") and "lonely" in w for w in warnings), warnings)
        self.assertTrue(any(w.startswith("1 mask(s)") and "orphan_mask.png" in w for w in warnings), warnings)
        self.assertTrue(any(w.startswith("1 file(s)") for w in warnings), warnings)
        self.assertIn("lonely", p.stdout + p.stderr)
        # The manifest is kept with the job, in tallyd's state folder.
        kept = tt.read_report(out)["manifest"]
        self.assertTrue(os.path.exists(kept), kept)
        with open(kept) as f:
            self.assertEqual(sum(1 for _ in f), 31)

    def test_predictions_without_a_reference_are_listed_in_the_report(self):
        root = tt.tmpdir(self)
        preds, refs = os.path.join(root, "preds"), os.path.join(root, "refs")
        os.makedirs(preds)
        os.makedirs(refs)
        rng = np.random.default_rng(9)
        for i in range(5):
            m = tt.blob_mask(rng, 24, 24, 3)
            Image.fromarray(m).save(os.path.join(refs, f"case{i}.png"))
            Image.fromarray(np.roll(m, 1, axis=1)).save(os.path.join(preds, f"case{i}.png"))
        Image.fromarray(m).save(os.path.join(preds, "extra.png"))
        Image.fromarray(m).save(os.path.join(preds, "extra2.png"))
        out = os.path.join(root, "out")
        p = tt.tally("run", "--predictions", preds, "--references", refs, "--out", out, "--file-ending", ".png",
                     check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 5)
        self.assertTrue(any(w.startswith("2 prediction(s)") and "extra.png, extra2.png" in w
                            for w in report["warnings"]), report["warnings"])


if __name__ == "__main__":
    unittest.main()
