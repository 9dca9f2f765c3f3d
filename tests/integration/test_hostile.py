"""Hostile inputs (SECURITY.md "Hostile inputs handled"), end to end, each with a memory guard where it used
to blow up: a COCO image whose size overflows (a worker crash), COCO/panoptic/results paths that
are FIFOs, devices or too large (submission threads held), rasterisation bombs under
--max-worker-memory, a result larger than gRPC's 64 MiB (retried for ever), NaN/Inf and misplaced
NIfTI voxels (silently scored as empty), the memory estimates of lesion and panoptic rows against
the measured peak, and the dashboard under idle sockets, a wrong Host and %00."""
import concurrent.futures
import json
import os
import socket
import struct
import subprocess
import time
import unittest
import urllib.request

import nibabel as nib
import numpy as np
from PIL import Image

import tallytest as tt
from test_dashboard import dashboard_url, get


def coco_files(root, images, annotations, results=None, categories=({"id": 1, "name": "thing"},)):
    os.makedirs(root, exist_ok=True)
    gt = {"images": images, "categories": list(categories), "annotations": annotations}
    with open(os.path.join(root, "gt.json"), "w") as f:
        json.dump(gt, f)
    if results is not None:
        with open(os.path.join(root, "results.json"), "w") as f:
            json.dump(results, f)
    return os.path.join(root, "gt.json"), os.path.join(root, "results.json")


def failures(out):
    return {int(f["id"]): f["reason"] for f in tt.read_report(out)["failures"]}


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class CocoSizesTest(unittest.TestCase):
    def test_an_image_whose_size_overflows_fails_its_row_and_the_worker_lives(self):
        root = tt.tmpdir(self)
        tri = [[1, 1, 6, 1, 1, 6]]
        images = [{"id": 1, "file_name": "a.png", "height": 8, "width": 8},
                  {"id": 2, "file_name": "b.png", "height": 4294967296, "width": 4294967296},
                  {"id": 3, "file_name": "c.png", "height": 2 ** 40, "width": 2 ** 40}]
        anns = [{"id": i, "image_id": i, "category_id": 1, "iscrowd": 0, "area": 10, "segmentation": tri}
                for i in (1, 2, 3)]
        results = [{"image_id": i, "category_id": 1, "score": 0.9, "segmentation": tri} for i in (1, 2, 3)]
        gt, res = coco_files(root, images, anns, results)
        c = tt.Cluster(self, os.path.join(root, "c"))
        worker = c.start_worker()
        job = c.cli("submit", "--coco", gt, "--images", root, "--coco-results", res, "--max-failed-fraction", "1").stdout.strip()
        self.assertEqual(c.wait(job, timeout=120)["state"], "succeeded")
        out = os.path.join(root, "out")
        c.fetch(job, out)
        self.assertEqual(tt.read_report(out)["images_evaluated"], 1)
        failed = failures(out)
        self.assertIn("4294967296x4294967296 (HxW)", failed[2])
        self.assertIn("1099511627776x1099511627776 (HxW)", failed[3])
        self.assertIsNone(worker.poll(), "the worker died")
        self.assertNotIn("restarting", c.log("worker-0.log"))


class ClientFilesTest(unittest.TestCase):
    def test_fifos_and_devices_are_refused_at_once_while_others_submit(self):
        root = tt.tmpdir(self)
        gt, res = coco_files(os.path.join(root, "coco"), [{"id": 1, "file_name": "a.png", "height": 4, "width": 4}], [],
                             [])
        fifos = []
        for i in range(6):
            fifos.append(os.path.join(root, f"fifo{i}.json"))
            os.mkfifo(fifos[-1])
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(1), 4, [(8, 8)], classes=2)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        pan = ["--panoptic-dir", root, "--panoptic-predictions-dir", root]
        hostile = [["--coco", fifos[0], "--images", root, "--coco-results", res],
                   ["--coco", fifos[1], "--images", root, "--coco-results", res],
                   ["--coco", gt, "--images", root, "--coco-results", fifos[2]],
                   ["--coco-panoptic", fifos[3], "--panoptic-predictions", fifos[4], *pan],
                   ["--coco-panoptic", gt, "--panoptic-predictions", fifos[5], *pan],
                   ["--coco", "/dev/zero", "--images", root, "--coco-results", res]]

        def submit(flags):
            return tt.tally("submit", "--server", c.address, *flags, check=False, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            refused = [pool.submit(submit, f) for f in hostile]
            normal = pool.submit(c.submit, tt.fixture("red_vs_rest.pt"), manifest)
            job = normal.result(timeout=60)  # Not held behind the FIFOs (4 submission threads).
            for f, p in zip(hostile, refused):
                p = p.result(timeout=60)
                self.assertNotEqual(p.returncode, 0, f)
                self.assertRegex(p.stderr, r"is a (FIFO|device), not a regular file", f)
        self.assertEqual(c.wait(job)["state"], "succeeded")

    def test_json_files_past_the_size_limit_are_refused_naming_the_flag(self):
        root = tt.tmpdir(self)
        images = [{"id": i, "file_name": f"{i}.png", "height": 4, "width": 4} for i in range(100)]
        gt, res = coco_files(root, images, [], [])
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--max-json-file-size", "1KiB"])
        p = c.cli("submit", "--coco", gt, "--images", root, "--coco-results", res, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("more than the 1024 allowed (--max-json-file-size)", p.stderr)
        self.assertIn("--max-json-file-size", tt.run_binary("tallyd", "--help").stdout)


class RasterisationTest(unittest.TestCase):
    def run_under_budget(self, root, images, anns, results, budget="1GiB"):
        gt, res = coco_files(root, images, anns, results)
        c = tt.Cluster(self, os.path.join(root, "c"))
        worker = c.start_worker("--max-worker-memory", budget)
        c.wait_registered(1)
        base = status_kb(worker.pid, "VmRSS")
        job = c.cli("submit", "--coco", gt, "--images", root, "--coco-results", res, "--max-failed-fraction", "1",
                    "--thumbnails", "0").stdout.strip()
        self.assertEqual(c.wait(job, timeout=240)["state"], "succeeded")
        peak = status_kb(worker.pid, "VmHWM") - base
        out = os.path.join(root, "out")
        c.fetch(job, out)
        self.assertIsNone(worker.poll())
        return failures(out), peak

    def test_bombs_fail_their_rows_naming_the_cost_within_the_budget(self):
        root = tt.tmpdir(self)
        # A triangle 268 435 455 px long on a 1 x 268 435 456 image (204 bytes of JSON) and 5 000 vertices
        # zigzagging across a 16 384^2 image: their label maps alone pass 1 GiB. The same shapes where
        # the maps fit (1 x 16 777 216, 8 192^2): their walks would take gigabytes, refused unwalked.
        def zigzag(side):
            return [v for k in range(2500) for v in ((k % 2) * (side - 1.0), k * side / 2600,
                                                     (1 - k % 2) * (side - 1.0), k * side / 2600 + 1)]

        images = [{"id": 1, "file_name": "a.png", "height": 1, "width": 268435456},
                  {"id": 2, "file_name": "b.png", "height": 16384, "width": 16384},
                  {"id": 3, "file_name": "c.png", "height": 1, "width": 16777216},
                  {"id": 4, "file_name": "d.png", "height": 8192, "width": 8192}]
        segs = {1: [0, 0, 268435455, 0, 0, 0.9], 2: zigzag(16384), 3: [0, 0, 16777215, 0, 0, 0.9], 4: zigzag(8192)}
        anns = [{"id": i, "image_id": i, "category_id": 1, "iscrowd": 0, "area": 1, "segmentation": [segs[i]]}
                for i in segs]
        failed, peak = self.run_under_budget(root, images, anns, [], budget="1GiB")
        self.assertEqual(set(failed), {1, 2, 3, 4})
        for image in (1, 2):
            self.assertIn("needs about", failed[image])
            self.assertIn("this worker may use 1.0 GiB (--max-worker-memory)", failed[image])
        for image in (3, 4):
            self.assertIn("annotation {}: polygon 0: rasterising it walks".format(image), failed[image])
            self.assertIn("boundary points", failed[image])
        self.assertLess(peak, 1 << 30, "the worker went past its 1 GiB budget")


class OversizeResultTest(unittest.TestCase):
    def test_a_result_past_the_message_limit_fails_its_row_and_the_job_ends(self):
        root = tt.tmpdir(self)
        z, y, x = np.indices((160, 160, 160))
        board = ((z + y + x) % 2).astype(np.uint8)  # 2 048 000 one-voxel lesions under 6-connectivity.
        for name in ("r", "p"):
            nib.save(nib.Nifti1Image(board, np.eye(4)), os.path.join(root, f"{name}.nii.gz"))
        small = np.zeros((8, 8, 8), np.uint8)
        small[2:5, 2:5, 2:5] = 1
        for name in ("rs", "ps"):
            nib.save(nib.Nifti1Image(small, np.eye(4)), os.path.join(root, f"{name}.nii.gz"))
        manifest = tt.write_manifest(root, ["id,mask,prediction", "board,r.nii.gz,p.nii.gz",
                                            "small,rs.nii.gz,ps.nii.gz"])
        out = os.path.join(root, "out")
        tt.tally("run", "--manifest", manifest, "--out", out, "--metrics", "dice,lesion", "--connectivity", "6",
                 "--lesion-dilation", "0", "--lesion-min-volume", "0", "--num-classes", "2",
                 "--max-failed-fraction", "1", timeout=600)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 1)
        by_id = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertEqual(list(by_id), ["board"])
        self.assertRegex(by_id["board"], r"results of [0-9.]+ MB exceed the 64 MiB message limit: \d+ lesions")


class VolumeVoxelsTest(unittest.TestCase):
    def test_non_finite_and_misplaced_voxels_fail_naming_the_file(self):
        root = tt.tmpdir(self)
        ref = np.zeros((6, 5, 4), np.uint8)
        ref[1:4, 1:4, 1:3] = 1
        nib.save(nib.Nifti1Image(ref, np.eye(4)), os.path.join(root, "r.nii.gz"))
        rows = ["id,mask,prediction"]
        cases = {}
        for name, value in (("nan", np.nan), ("inf", np.inf), ("allnan", None)):
            pred = ref.astype(np.float32)
            if value is None:
                pred[:] = np.nan
            else:
                pred[2, 2, 1] = value
            nib.save(nib.Nifti1Image(pred, np.eye(4)), os.path.join(root, f"{name}.nii"))
            rows.append(f"{name},r.nii.gz,{name}.nii")
            cases[name] = "is not finite"
        good = ref.astype(np.float32)
        nib.save(nib.Nifti1Image(good, np.eye(4)), os.path.join(root, "good.nii"))
        raw = open(os.path.join(root, "good.nii"), "rb").read()
        for offset in (2147483904.0, 3e9, 1e12, -1000.0):
            name = f"off{int(offset)}"
            with open(os.path.join(root, f"{name}.nii"), "wb") as f:
                f.write(raw[:108] + struct.pack("<f", offset) + raw[112:])
            rows.append(f"{name},r.nii.gz,{name}.nii")
            cases[name] = "vox_offset"
        rows.append("good,r.nii.gz,good.nii")
        manifest = tt.write_manifest(root, rows)
        out = os.path.join(root, "out")
        tt.tally("run", "--manifest", manifest, "--out", out, "--max-failed-fraction", "1", "--num-classes", "2")
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 1)
        by_id = {f["id"]: f["reason"] for f in report["failures"]}
        for name, why in cases.items():
            self.assertIn(why, by_id[name], name)
            self.assertIn(f"{name}.nii", by_id[name], name)


class RowMemoryTest(unittest.TestCase):
    """The estimate a row is admitted with (read from the failure a tiny budget gives) against the
    worker's measured peak resident memory for the same row, within 20 %."""

    def estimate_and_peak(self, root, submit):
        est = tt.Cluster(self, os.path.join(root, "est"))
        est.start_worker("--max-worker-memory", "1MiB")
        job = est.cli("submit", *submit).stdout.strip()
        est.wait(job)
        est.fetch(job, os.path.join(root, "est-out"))
        reason = tt.read_report(os.path.join(root, "est-out"))["failures"][0]["reason"]
        value, unit = reason.split("needs about ")[1].split(" ")[:2]
        estimate = float(value) * {"MiB": 2 ** 20, "GiB": 2 ** 30}[unit]
        est.stop()
        c = tt.Cluster(self, os.path.join(root, "run"))
        w = c.start_worker()
        c.wait_registered(1)
        time.sleep(0.5)
        base = status_kb(w.pid, "VmRSS")
        job = c.cli("submit", *submit).stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        peak = status_kb(w.pid, "VmHWM") - base
        return estimate, peak

    def test_lesion_rows(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(49)
        shape = (128, 256, 256)
        ref = np.zeros(shape, np.uint8)
        zz, yy, xx = np.ogrid[:shape[0], :shape[1], :shape[2]]
        for i in range(20):
            c = [int(rng.integers(8, s - 8)) for s in shape]
            ref[(zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= int(rng.integers(3, 8)) ** 2] = 1 + i % 2
        pred = np.roll(ref, 2, axis=0)
        for name, v in (("r", ref), ("p", pred)):
            nib.save(nib.Nifti1Image(np.transpose(v, (2, 1, 0)), np.eye(4)), os.path.join(root, f"{name}.nii.gz"))
        manifest = tt.write_manifest(root, ["id,mask,prediction", "case,r.nii.gz,p.nii.gz"])
        for flags in (["--lesion-dilation", "0"], []):
            estimate, peak = self.estimate_and_peak(os.path.join(root, str(len(flags))),
                                                    ["--manifest", manifest, "--metrics", "dice,hd95,lesion",
                                                     "--num-classes", "3", *flags])
            self.assertLess(abs(estimate - peak), 0.2 * peak, f"{flags}: estimate {estimate}, measured {peak}")

    def test_panoptic_rows(self):
        root = tt.tmpdir(self)
        size = 4096
        rng = np.random.default_rng(3)
        ids = np.zeros((size, size), np.uint32)
        for k in range(1, 30):
            y, x = rng.integers(0, size - size // 8, 2)
            ids[y:y + size // 8, x:x + size // 8] = k
        segs = [{"id": int(k), "category_id": 1 + int(k) % 2, "area": int((ids == k).sum()), "iscrowd": 0}
                for k in np.unique(ids) if k]
        rgb = np.stack([ids % 256, (ids // 256) % 256, ids // 65536], -1).astype(np.uint8)
        cats = [{"id": 1, "name": "a", "isthing": 1}, {"id": 2, "name": "b", "isthing": 0}]
        for d in ("gt", "pred"):
            os.makedirs(os.path.join(root, d))
            Image.fromarray(rgb).save(os.path.join(root, d, "1.png"))
            with open(os.path.join(root, d + ".json"), "w") as f:
                json.dump({"images": [{"id": 1, "file_name": "1.jpg", "height": size, "width": size}],
                           "categories": cats,
                           "annotations": [{"image_id": 1, "file_name": "1.png", "segments_info": segs}]}, f)
        estimate, peak = self.estimate_and_peak(root, [
            "--coco-panoptic", os.path.join(root, "gt.json"), "--panoptic-dir", os.path.join(root, "gt"),
            "--panoptic-predictions", os.path.join(root, "pred.json"), "--panoptic-predictions-dir",
            os.path.join(root, "pred")])
        self.assertLess(abs(estimate - peak), 0.2 * peak, f"estimate {estimate}, measured {peak}")


class DashboardHostileTest(unittest.TestCase):
    def test_idle_sockets_a_wrong_host_nul_and_files_that_are_not_regular(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(2), 4, [(8, 8)], classes=2)
        c = tt.Cluster(self, os.path.join(root, "c"), tallyd_args=["--http-listen", "127.0.0.1:0"])
        c.start_worker()
        url = dashboard_url(c)
        job = c.submit(tt.fixture("red_vs_rest.pt"), manifest)
        self.assertEqual(c.wait(job)["state"], "succeeded")
        host, port = url[len("http://"):].split(":")
        idle = []
        for _ in range(40):  # Connected, never a byte sent.
            s = socket.create_connection((host, int(port)))
            idle.append(s)
        start = time.time()
        status, _, body = get(url + "/api/jobs")
        self.assertEqual(status, 200)
        self.assertLess(time.time() - start, 2.0, "40 idle sockets held the dashboard")
        for s in idle:
            s.close()

        def raw(request):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(request)
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return data
                    data += chunk

        reply = raw(b"GET /api/jobs HTTP/1.1\r\nHost: evil.example.com\r\n\r\n")
        self.assertTrue(reply.startswith(b"HTTP/1.1 403"), reply[:80])
        self.assertIn(b"evil.example.com", reply)
        for path in (f"/api/jobs/{job}%00garbage/files/report.json", f"/api/jobs/{job}/files/report.json%00../../tally.db"):
            reply = raw(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            self.assertRegex(reply.split(b"\r\n")[0], rb"HTTP/1.1 40[04]", path)
        reply = raw(b"GET / HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n")
        self.assertIn(b"application/json", reply)
        self.assertIn(b'{"error":', reply)
        # A FIFO and a symlink put in the job's report folder are not followed or opened.
        reports = os.path.join(c.state, "reports", job)
        os.remove(os.path.join(reports, "summary.md"))
        os.symlink("/etc/passwd", os.path.join(reports, "summary.md"))
        os.remove(os.path.join(reports, "per_image.csv"))
        os.mkfifo(os.path.join(reports, "per_image.csv"))
        for name in ("summary.md", "per_image.csv"):
            status, _, body = get(f"{url}/api/jobs/{job}/files/{name}")
            self.assertEqual(status, 404, name)
            self.assertNotIn(c.state.encode(), body)
            self.assertNotIn(b"root:", body)
        status, _, body = get(f"{url}/api/jobs/{job}/files/report.json")
        self.assertEqual(status, 200)
