"""Inputs at rest (SECURITY.md "Hostile inputs handled", docs/data.md "Tar shards"): every row is
scored from its own bytes or fails saying why, and a report says which bytes it read.

- per_image.csv's *_xxh128 columns equal `xxhsum -H2` of the files (an independent implementation);
  `tally verify` finds a file changed after the job.
- A shard repacked between submission and reading: every row right or failed naming the shard.
- A scratch disk that fills (a small tmpfs, where the machine lets us mount one): no row wrong, the
  next job on the same worker correct.
- A 10 MB member name mid-shard fails its own sample, the others are evaluated; a shard that ends
  early makes the job not complete.
- DICOM: a RescaleSlope of 1e308 fails its row naming the tag; 10 000 nested sequences fail theirs,
  the neighbours are evaluated, no worker dies.
- A row that crashes its worker (TALLY_TEST_CRASH_ID) fails after two crashes, its neighbours are
  evaluated, and `tally run` ends with a report.
- Bombs: a sparse member declaring 6 GiB, gzip and bzip2 tars declaring 4 GiB, under
  --max-worker-memory 1GiB: their rows fail naming the size and the limit; nothing aborts.
- A shard's JSON of 75 000 fields (a Python model job): the sample fails naming shard and key, tallyd
  stays small.
"""
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest

import numpy as np

import tallytest as tt

FLAGS = ["--metrics", "dice,iou", "--batch-size", "2", "--max-failed-fraction", "1"]


def add(t, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def xxhsum(path):
    """XXH128 as the xxhash package's xxhsum prints it (-H2)."""
    return subprocess.run(["xxhsum", "-H2", path], capture_output=True, text=True, check=True).stdout.split()[0]


def by_id(out):
    rows = {}
    for r in tt.read_per_image(out):
        rows.setdefault(r["id"], []).append(r)
    return rows


class InputsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-inputs-")
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), np.random.default_rng(11), 12, [(24, 32)],
                                        classes=3)
        cls.model = tt.fixture("three_class.pt")
        with open(cls.manifest) as f:
            import csv
            cls.rows = [(r["id"] if "id" in r else os.path.splitext(os.path.basename(r["image"]))[0],
                         os.path.join(os.path.dirname(cls.manifest), r["image"]),
                         os.path.join(os.path.dirname(cls.manifest), r["mask"])) for r in csv.DictReader(f)]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

    def shard(self, path, order):
        with tarfile.open(path, "w") as t:
            for i in order:
                rid, image, mask = self.rows[i]
                add(t, rid + os.path.splitext(image)[1], read(image))
                add(t, rid + ".seg.png", read(mask))

    @unittest.skipIf(shutil.which("xxhsum") is None, "needs xxhsum (Debian's xxhash)")
    def test_digests_are_the_files_and_verify_finds_a_changed_one(self):
        root = tt.tmpdir(self)
        data = os.path.join(root, "data")
        shutil.copytree(os.path.dirname(self.manifest), data)
        manifest = os.path.join(data, os.path.basename(self.manifest))
        out = os.path.join(root, "out")
        tt.tally_run(self.model, manifest, out, *FLAGS)
        rows = by_id(out)
        self.assertEqual(len(rows), 12)
        for rid, image, mask in self.rows:
            mine = rows[rid][0]
            here = os.path.dirname(self.manifest)
            image = os.path.join(data, os.path.relpath(image, here))
            mask = os.path.join(data, os.path.relpath(mask, here))
            self.assertEqual(mine["image_xxh128"], xxhsum(image), rid)
            self.assertEqual(mine["mask_xxh128"], xxhsum(mask), rid)
            self.assertEqual(mine["prediction_xxh128"], "")
            self.assertTrue(all(r["mask_xxh128"] == mine["mask_xxh128"] for r in rows[rid]))  # Every class's line.
        p = tt.tally("verify", out, check=False)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("12 rows, 0 differ", p.stdout)
        # One mask rewritten after the job: verify names that row and only it.
        rid, _, mask = self.rows[5]
        changed = os.path.join(data, os.path.relpath(mask, os.path.dirname(self.manifest)))
        with open(changed, "ab") as f:
            f.write(b"\0")
        p = tt.tally("verify", out, check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f"(id '{rid}'): mask '{changed}' differs", p.stdout)
        self.assertIn("12 rows, 1 differs", p.stdout)

    def test_long_and_non_ascii_names_from_gnu_tar_and_python_are_read_as_their_own_members(self):
        # Paths past the header's 100 bytes and a non-ASCII directory, written by two independent
        # writers in each of their formats: every sample is evaluated, equal to the loose files'.
        root = tt.tmpdir(self)
        inner = os.path.join("d" * 60, "e" * 60, "café")  # Long, yet ustar can split it into its prefix.
        deep = os.path.join(root, "src", inner)
        os.makedirs(deep)
        lines = ["id,image,mask"]
        for i in range(6):
            rid, image, mask = self.rows[i]
            shutil.copy(image, os.path.join(deep, rid + os.path.splitext(image)[1]))
            shutil.copy(mask, os.path.join(deep, rid + ".seg.png"))
            lines.append(f"{rid},{image},{mask}")
        reference = os.path.join(root, "reference")
        tt.tally_run(self.model, tt.write_manifest(root, lines), reference, *FLAGS)
        want = {rid: [{k: v for k, v in r.items() if k not in ("id", "image")} for r in rs]
                for rid, rs in by_id(reference).items()}
        shards = []
        if shutil.which("tar"):
            for fmt in ("gnu", "pax", "ustar"):
                shards.append(os.path.join(root, f"gnu-{fmt}.tar"))
                subprocess.run(["tar", "--sort=name", f"--format={fmt}", "-cf", shards[-1], "-C",
                                os.path.join(root, "src"), "."], check=True, capture_output=True)
        for fmt, name in ((tarfile.PAX_FORMAT, "py-pax.tar"), (tarfile.GNU_FORMAT, "py-gnu.tar")):
            shards.append(os.path.join(root, name))
            with tarfile.open(shards[-1], "w", format=fmt) as t:
                for member in sorted(os.listdir(deep)):
                    t.add(os.path.join(deep, member), arcname=os.path.join(inner, member))
        for shard in shards:
            out = os.path.join(root, "out-" + os.path.basename(shard))
            tt.tally("run", "--model", self.model, "--shards", shard, "--out", out, *FLAGS)
            report = tt.read_report(out)
            self.assertEqual(report["images_evaluated"], 6, (shard, report["failures"]))
            got = {os.path.basename(rid): [{k: v for k, v in r.items() if k not in ("id", "image")} for r in rs]
                   for rid, rs in by_id(out).items()}
            self.assertEqual(got, want, shard)

    def test_a_file_changed_after_submission_is_named_in_the_reports_warnings(self):
        root = tt.tmpdir(self)
        data = os.path.join(root, "data")
        shutil.copytree(os.path.dirname(self.manifest), data)
        manifest = os.path.join(data, os.path.basename(self.manifest))
        c = tt.Cluster(self, os.path.join(root, "cluster"))
        job = c.cli("submit", "--model", self.model, "--manifest", manifest, *FLAGS).stdout.strip()
        rid, _, mask = self.rows[3]
        changed = os.path.join(data, os.path.relpath(mask, os.path.dirname(self.manifest)))
        later = time.time() + 60
        os.utime(changed, (later, later))  # Rewritten after the submission, as far as its time says.
        c.start_worker()
        c.wait(job)
        out = os.path.join(root, "out")
        c.cli("report", job, "--out", out)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 12)
        self.assertEqual(report["inputs_modified_after_submission"], 1)
        warning = [w for w in report["warnings"] if "modified after the job was submitted" in w]
        self.assertEqual(len(warning), 1, report["warnings"])
        self.assertIn(f"row 3 '{rid}'", warning[0])

    def test_folder_files_whose_names_no_manifest_can_hold_fail_by_name(self):
        root = tt.tmpdir(self).encode()
        images, masks = os.path.join(root, b"images"), os.path.join(root, b"masks")
        os.makedirs(images)
        os.makedirs(masks)
        names = [b"good0", b"bad\xe9", b"line\rfeed", b"good1"]
        for i, name in enumerate(names):
            _, image, mask = self.rows[i]
            shutil.copy(image, os.path.join(images, name + b".png"))
            shutil.copy(mask, os.path.join(masks, name + b".png"))
        out = os.path.join(root.decode(), "out")
        p = tt.tally("run", "--model", self.model, "--images", images.decode(), "--masks", masks.decode(),
                     "--out", out, *FLAGS, check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        report = tt.read_report(out)
        self.assertEqual(report["images_total"], 4)
        self.assertEqual(report["images_evaluated"], 2)
        reasons = sorted(f["reason"] for f in report["failures"])
        self.assertEqual(len(reasons), 2, reasons)
        self.assertIn("bad\\xe9.png' in --images cannot be evaluated", reasons[0])
        self.assertIn("it is not valid UTF-8 (byte 0xE9 at byte 3)", reasons[0])
        self.assertIn("line\\x0dfeed.png' in --images cannot be evaluated", reasons[1])
        self.assertIn("it holds a control character (0x0D at byte 4)", reasons[1])
        self.assertTrue(any("mask(s) in" in w and "bad\\xe9.png" in w for w in report["warnings"]), report["warnings"])

    def test_a_shard_repacked_after_submission_is_never_read_at_the_old_offsets(self):
        root = tt.tmpdir(self)
        shard = os.path.join(root, "s.tar")
        self.shard(shard, range(12))
        c = tt.Cluster(self, os.path.join(root, "cluster"))
        job = c.cli("submit", "--model", self.model, "--shards", shard, *FLAGS).stdout.strip()
        mtime = os.stat(shard).st_mtime_ns
        self.shard(shard, list(range(6, 12)) + list(range(6)))  # Same names and sizes, another order.
        os.utime(shard, ns=(mtime, mtime))  # Even its time as it was.
        c.start_worker()
        c.wait(job)
        out = os.path.join(root, "out")
        c.cli("report", job, "--out", out)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 0)
        self.assertEqual(report["images_failed"], 12)
        for f in report["failures"]:
            self.assertIn("s.tar", f["reason"])
            self.assertIn("not the one indexed when the job was submitted", f["reason"])
        # The shard changed in size or time: its rows fail saying so. (The worker waits meanwhile.)
        c.workers[0].send_signal(signal.SIGSTOP)
        self.shard(shard, range(12))
        job = c.cli("submit", "--model", self.model, "--shards", shard, *FLAGS).stdout.strip()
        self.shard(shard, range(11))
        c.workers[0].send_signal(signal.SIGCONT)
        c.wait(job)
        out2 = os.path.join(root, "out2")
        c.cli("report", job, "--out", out2)
        report = tt.read_report(out2)
        self.assertEqual(report["images_failed"], 12)
        self.assertTrue(all("changed after the job was submitted" in f["reason"] for f in report["failures"]))

    def test_a_full_scratch_disk_scores_no_row_wrong_and_the_next_job_is_right(self):
        if os.geteuid() != 0:
            self.skipTest("mounting a small tmpfs needs root")
        root = tt.tmpdir(self)
        scratch = os.path.join(root, "scratch")
        os.makedirs(scratch)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", scratch]).returncode != 0:
            self.skipTest("tmpfs cannot be mounted here")
        self.addCleanup(lambda: subprocess.run(["umount", "-l", scratch]))
        # 12 samples whose images are 300 KB of noise each: decompressed, 3.6 MB, past the 1 MB disk.
        rng = np.random.default_rng(3)
        shard = os.path.join(root, "s.tar.gz")
        loose = os.path.join(root, "loose")
        os.makedirs(loose)
        lines = ["id,image,mask"]
        with tarfile.open(shard, "w:gz") as t:
            for i in range(12):
                from PIL import Image
                img = Image.fromarray(rng.integers(0, 256, (200, 500, 3), dtype=np.uint8))
                mask = Image.fromarray((rng.integers(0, 3, (200, 500))).astype(np.uint8))
                img.save(os.path.join(loose, f"k{i:02d}.png"))
                mask.save(os.path.join(loose, f"k{i:02d}.seg.png"))
                add(t, f"k{i:02d}.png", read(os.path.join(loose, f"k{i:02d}.png")))
                add(t, f"k{i:02d}.seg.png", read(os.path.join(loose, f"k{i:02d}.seg.png")))
                lines.append(f"k{i:02d},k{i:02d}.png,k{i:02d}.seg.png")
        tt.write_text(os.path.join(loose, "manifest.csv"), "\n".join(lines) + "\n")
        reference = os.path.join(root, "reference")
        tt.tally_run(self.model, os.path.join(loose, "manifest.csv"), reference, *FLAGS)
        want = by_id(reference)
        c = tt.Cluster(self, os.path.join(root, "cluster"))
        c.start_worker("--scratch-limit", str(256 << 20), env={"TMPDIR": scratch})  # The limit above the disk.
        for attempt, size in ((1, "1m"), (2, "64m")):
            subprocess.run(["mount", "-o", f"remount,size={size}", scratch], check=True)
            job = c.cli("submit", "--model", self.model, "--shards", shard, *FLAGS).stdout.strip()
            c.wait(job)
            out = os.path.join(root, f"out{attempt}")
            c.cli("report", job, "--out", out)
            report = tt.read_report(out)
            got = by_id(out)
            for rid, lines_ in got.items():  # Every row scored is scored right.
                strip = lambda rs: [{k: v for k, v in r.items() if k != "image"} for r in rs]
                self.assertEqual(strip(lines_), strip(want[rid]), (attempt, rid))
            if attempt == 1:
                self.assertGreater(report["images_failed"], 0)
                self.assertTrue(all("scratch" in f["reason"] for f in report["failures"]), report["failures"])
                self.assertTrue(any("scratch full" in f["reason"] and "free in" in f["reason"]
                                    for f in report["failures"]), report["failures"])
            else:
                self.assertEqual(report["images_evaluated"], 12, report["failures"])
        # No scratch copy outlives the work: the tmpfs empties once the worker finds nothing to do
        # (its next lease poll, at most a few seconds).
        deadline = time.time() + 30
        while shutil.disk_usage(scratch).used >= 1 << 20 and time.time() < deadline:
            time.sleep(0.2)
        self.assertLess(shutil.disk_usage(scratch).used, 1 << 20)

    def test_a_long_name_fails_its_sample_and_a_shard_that_ends_early_is_not_complete(self):
        root = tt.tmpdir(self)
        shard = os.path.join(root, "a.tar")
        with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as t:
            for i in range(12):
                rid, image, mask = self.rows[i]
                name = rid if i != 6 else "x" * (10 << 20)
                add(t, name + os.path.splitext(image)[1], read(image))
                add(t, rid + ".seg.png", read(mask))
        out = os.path.join(root, "out")
        tt.tally("run", "--model", self.model, "--shards", shard, "--out", out, *FLAGS)
        report = tt.read_report(out)
        self.assertTrue(report["complete"])
        # The long-named image fails as a sample of its own, and its mask, left without an image, too.
        self.assertEqual(report["images_evaluated"], 11)
        self.assertEqual(report["images_failed"], 2, report["failures"])
        reasons = {f["index"]: f["reason"] for f in report["failures"]}
        self.assertIn("its long-name header is 10485765 bytes, more than the limit of 4096", reasons[6])  # With its NUL.
        self.assertIn("sample 's0006': no image member", reasons[7])
        # Garbage in the middle of a shard: what follows is in no row; the job says it is not complete.
        data = bytearray(read(os.path.join(root, "a.tar")))
        cut = os.path.join(root, "b.tar")
        self.shard(cut, range(12))
        data = bytearray(read(cut))
        at = data.find(self.rows[8][0].encode()) // 512 * 512
        data[at:at + 512] = b"g" * 512
        with open(cut, "wb") as f:
            f.write(data)
        out = os.path.join(root, "out2")
        p = tt.tally("run", "--model", self.model, "--shards", cut, "--out", out, "--metrics", "dice", check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        report = tt.read_report(out)
        self.assertFalse(report["complete"])
        self.assertIn("is no tar header", report["incomplete_sources"][0])
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("Not complete", f.read())

    def test_dicom_values_that_are_not_finite_and_deep_nesting_fail_their_rows(self):
        from pydicom.dataset import FileDataset, FileMetaDataset
        from pydicom.uid import ExplicitVRLittleEndian, generate_uid
        root = tt.tmpdir(self)
        lines = ["id,image,mask"]

        def dicom(path, slope=1.0, nest=0):
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
            meta.MediaStorageSOPInstanceUID = generate_uid()
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            ds = FileDataset(path, {}, file_meta=meta, preamble=b"\0" * 128)
            ds.Rows, ds.Columns, ds.SamplesPerPixel = 24, 32, 1
            ds.PhotometricInterpretation = "MONOCHROME2"
            ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
            ds.RescaleSlope, ds.RescaleIntercept = slope, 0
            ds.PixelData = (np.arange(24 * 32, dtype=np.uint16) % 4096).tobytes()
            ds.is_little_endian, ds.is_implicit_VR = True, False
            ds.save_as(path, write_like_original=False)
            if nest:  # Sequences in items `nest` deep, written by hand before the pixel data.
                import struct
                sq = struct.pack("<HH2sHI", 0x0054, 0x0016, b"SQ", 0, 0xFFFFFFFF)
                item, item_end = struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF), struct.pack("<HHI", 0xFFFE, 0xE00D, 0)
                seq_end = struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)
                nested = (sq + item) * nest + (item_end + seq_end) * nest
                data = read(path)
                at = data.rfind(struct.pack("<HH", 0x7FE0, 0x0010))
                with open(path, "wb") as f:
                    f.write(data[:at] + nested + data[at:])

        for i in range(4):
            _, _, mask = self.rows[i]
            name = os.path.join(root, f"d{i}.dcm")
            dicom(name, slope=1e308 if i == 1 else 1.0, nest=2000 if i == 2 else 0)
            lines.append(f"d{i},{name},{mask}")
        manifest = os.path.join(root, "m.csv")
        tt.write_text(manifest, "\n".join(lines) + "\n")
        out = os.path.join(root, "out")
        tt.tally("run", "--model", self.model, "--manifest", manifest, "--out", out, "--workers", "2", *FLAGS)
        report = tt.read_report(out)
        failed = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertEqual(sorted(failed), ["d1", "d2"])
        self.assertIn("RescaleSlope (0028,1053)", failed["d1"])
        self.assertIn("nest more than 64 deep", failed["d2"])
        self.assertEqual(report["images_evaluated"], 2)

    def test_a_row_that_crashes_its_worker_fails_after_two_crashes_and_the_rest_are_evaluated(self):
        root = tt.tmpdir(self)
        out = os.path.join(root, "out")
        victim = self.rows[4][0]
        p = subprocess.run([os.path.join(tt.BIN, "tally"), "run", "--model", self.model, "--manifest", self.manifest,
                            "--out", out, "--workers", "2", "--shard-size", "4", *FLAGS],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "TALLY_TEST_CRASH_ID": victim})
        self.assertEqual(p.returncode, 0, p.stderr)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 11, report["failures"])
        self.assertEqual([f["id"] for f in report["failures"]], [victim])
        self.assertIn("2 times", report["failures"][0]["reason"])
        self.assertIn("killed by signal 11", p.stderr)

    def test_declared_sizes_are_refused_before_anything_is_allocated(self):
        root = tt.tmpdir(self)
        rid, image, mask = self.rows[0]

        def header(name, size, kind=b"0", real_size=0):
            h = bytearray(512)
            h[:len(name)] = name.encode()
            h[100:108] = b"0000644\0"
            h[124:136] = b"\x80" + size.to_bytes(11, "big")
            h[156:157] = kind
            if kind == b"S":  # GNU's old sparse header: one stored block at the end of real_size bytes.
                h[386:398] = b"\x80" + (real_size - 512).to_bytes(11, "big")
                h[398:410] = b"\x80" + (512).to_bytes(11, "big")
                h[483:495] = b"\x80" + real_size.to_bytes(11, "big")
            h[257:265] = b"ustar  \0"
            h[148:156] = b" " * 8
            h[148:156] = ("%06o\0 " % sum(h)).encode()
            return bytes(h)

        ok = io.BytesIO()
        with tarfile.open(fileobj=ok, mode="w", format=tarfile.GNU_FORMAT) as t:
            add(t, "ok" + os.path.splitext(image)[1], read(image))
            add(t, "ok.seg.png", read(mask))
            end = t.offset  # Past the last member's data, before the end-of-archive marker.
        good = ok.getvalue()[:end]
        six = 6 << 30
        sparse = good + header("sp.png", 512, b"S", six) + b"\xff" * 512 + header("sp.seg.png", 0) + b"\0" * 1024
        bomb = good + header("big.png", 4 << 30) + b"\0" * 1024
        import bz2
        import gzip
        for name, data in (("sparse.tar", sparse), ("bomb.tar.gz", gzip.compress(bomb)), ("bomb.tar.bz2", bz2.compress(bomb))):
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
        cases = [("sparse.tar", ["sparse member"]),
                 ("bomb.tar.gz", ["declares 4294967296 bytes, more than the limit of 1073741824"]),
                 ("bomb.tar.bz2", ["declares 4294967296 bytes, more than the limit of 1073741824"])]
        if shutil.which("zstd"):
            # 900 MiB of zeros (under the member limit) in a few hundred KB of zstd, between two good
            # samples: the one after it lies past the 64 MiB scratch limit, and fails saying so.
            zst = os.path.join(root, "wide.tar.zst")
            with open(zst, "wb") as out_file:
                z = subprocess.Popen(["zstd", "-q", "-c"], stdin=subprocess.PIPE, stdout=out_file)
                z.stdin.write(good)
                info = tarfile.TarInfo("wide.png")
                info.size = 900 << 20
                z.stdin.write(info.tobuf(format=tarfile.GNU_FORMAT))
                for _ in range(900):
                    z.stdin.write(b"\0" * (1 << 20))
                late = io.BytesIO()
                with tarfile.open(fileobj=late, mode="w", format=tarfile.GNU_FORMAT) as t:
                    add(t, "late" + os.path.splitext(image)[1], read(image))
                    add(t, "late.seg.png", read(mask))
                z.stdin.write(late.getvalue())
                z.stdin.close()
                self.assertEqual(z.wait(), 0)
            cases.append(("wide.tar.zst", ["more than the scratch limit of 67108864"]))
        for name, words in cases:
            out = os.path.join(root, "out-" + name)
            tt.tally("run", "--model", self.model, "--shards", os.path.join(root, name), "--out", out,
                     "--max-worker-memory", "1GiB", "--worker-flags=--scratch-limit=64MiB", *FLAGS)
            report = tt.read_report(out)
            self.assertEqual(report["images_evaluated"], 1, name)
            reasons = " | ".join([f["reason"] for f in report["failures"]] + report.get("incomplete_sources", []))
            for w in words:
                self.assertIn(w, reasons, name)

    def test_a_shard_that_decompresses_for_ever_ends_the_submission_at_its_deadline_naming_it(self):
        # 6 GB of members in 7 KB of bzip2 (streams joined: 100 MiB of zeros compress to 113 bytes),
        # which takes some 20 s to decompress here.
        import bz2
        root = tt.tmpdir(self)
        shard = os.path.join(root, "slow.tar.bz2")
        zeros = bz2.compress(b"\0" * (100 << 20), 9)
        with open(shard, "wb") as f:
            for i in range(6):
                info = tarfile.TarInfo(f"m{i}.png")
                info.size = 1000 << 20
                f.write(bz2.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
                f.write(zeros * 10)
        c = tt.Cluster(self, os.path.join(root, "cluster"), tallyd_args=["--submit-read-timeout", "2"])
        p = c.cli("submit", "--model", self.model, "--shards", shard, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"shard '{shard}': still being indexed when the submission's time ran out", p.stderr)
        self.assertIn("--submit-read-timeout", p.stderr)
        self.assertNotIn("manifest", p.stderr)  # The deadline caught the indexing itself, inside the shard.

    def test_a_shard_json_of_75000_fields_fails_its_sample_and_tallyd_stays_small(self):
        root = tt.tmpdir(self)
        model = os.path.join(root, "model.py")
        tt.write_text(model, "import numpy as np\n\nclass Model:\n    num_classes = 3\n\n"
                      "    def __init__(self, devices, options):\n        pass\n\n"
                      "    def predict(self, images, rows):\n"
                      "        return [np.zeros(im.shape[:2], np.int64) for im in images]\n")
        shard = os.path.join(root, "s.tar")
        many = "{" + ",".join(f'"{i}":0' for i in range(75000)) + "}"  # 600 KB: under the byte limit.
        with tarfile.open(shard, "w") as t:
            for i in range(4):
                rid, image, mask = self.rows[i]
                add(t, rid + os.path.splitext(image)[1], read(image))
                add(t, rid + ".seg.png", read(mask))
                add(t, rid + ".json", (many if i == 1 else '{"prompt": "red"}').encode())
        out = os.path.join(root, "out")
        tt.tally("run", "--model", model, "--python", "/usr/bin/python3", "--shards", shard, "--out", out, *FLAGS)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 3)
        reason = report["failures"][0]["reason"]
        self.assertIn("s.tar", reason)
        self.assertIn(f"sample '{self.rows[1][0]}'", reason)
        self.assertIn("more than 1024 fields", reason)
        with open(os.path.join(out, ".tally", "tallyd.log")) as f:
            log = f.read()
        self.assertNotIn("bad_alloc", log)


if __name__ == "__main__":
    unittest.main()
