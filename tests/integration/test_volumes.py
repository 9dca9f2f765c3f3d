"""Volumes into models (docs/volumes.md "Volumes into models"): NIfTI volumes with several channels through a
TorchScript 3D network with --sliding-window (checked against a sliding-window loop written here
from MONAI's definition) and through a Python model (which must get the voxels, spacing and
affine exactly), scored in 3D against scipy, identical for any number of workers.
"""
import csv
import json
import math
import os
import unittest

import nibabel as nib
import numpy as np
import torch

import tallytest as tt


class Net3D(torch.nn.Module):
    """A few 3D convolutions: 2 channels in, 3 classes out."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv3d(2, 6, 3, padding=1)
        self.b = torch.nn.Conv3d(6, 6, 3, padding=1)
        self.c = torch.nn.Conv3d(6, 3, 1)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def window_starts(size, roi, overlap):
    interval = roi if roi == size else max(int(roi * (1 - overlap)), 1)
    starts, i = [], 0
    while True:
        s = i * interval
        starts.append(min(s, size - roi))
        if s + roi >= size:
            return starts
        i += 1


def gaussian(roi):
    m = None
    for n in roi:
        x = torch.arange(-(n - 1) / 2.0, (n - 1) / 2.0 + 1, dtype=torch.float)
        x = torch.exp(x ** 2 / (-2 * (n * 0.125) ** 2))
        m = x if m is None else m.unsqueeze(-1) * x
    return torch.clamp(m, min=max(m.min().item(), 1e-3))


def sliding_window(net, image, roi, overlap):
    """The reference loop: pad to the window, Gaussian-weighted sum of every window, divided by the
    summed weights, cropped back. image: C x D x H x W float32."""
    size = image.shape[1:]
    pads = [max(r - s, 0) for r, s in zip(roi, size)]
    x = torch.nn.functional.pad(torch.from_numpy(image)[None],
                                [p for d in (2, 1, 0) for p in (pads[d] // 2, pads[d] - pads[d] // 2)])
    padded = x.shape[2:]
    w = gaussian(roi)
    total, weight = None, torch.zeros(padded)
    with torch.no_grad():
        for z in window_starts(padded[0], roi[0], overlap):
            for y in window_starts(padded[1], roi[1], overlap):
                for xx in window_starts(padded[2], roi[2], overlap):
                    out = net(x[:, :, z:z + roi[0], y:y + roi[1], xx:xx + roi[2]])[0]
                    if total is None:
                        total = torch.zeros((out.shape[0],) + tuple(padded))
                    total[:, z:z + roi[0], y:y + roi[1], xx:xx + roi[2]] += w * out
                    weight[z:z + roi[0], y:y + roi[1], xx:xx + roi[2]] += w
    scores = total / weight
    b = [p // 2 for p in pads]
    return scores[:, b[0]:b[0] + size[0], b[1]:b[1] + size[1], b[2]:b[2] + size[2]].numpy()


def zscore(a):
    a = a.astype(np.float64)
    sd = a.std()
    return ((a - a.mean()) / (sd if sd else 1.0)).astype(np.float32)


def save_volume(path, zyx, zooms_xyz, dtype):
    affine = np.diag(list(zooms_xyz) + [1.0])
    affine[:3, 3] = [4.0, -2.0, 7.5]
    img = nib.Nifti1Image(zyx.transpose(2, 1, 0).astype(dtype), affine)
    img.header.set_zooms(zooms_xyz)
    nib.save(img, path)


def read_zyx(path):
    img = nib.load(path)
    return np.asarray(img.dataobj).transpose(2, 1, 0), img


class VolumeModelTest(unittest.TestCase):
    def make_set(self, root, rng, n=7):
        """Volumes of a few sizes (some smaller than the window), two channels (float32 and int16)."""
        rows = ["id,image,mask"]
        cases = []
        for i in range(n):
            shape = tuple(int(s) for s in rng.integers(5, 15, 3))
            ref = np.zeros(shape, np.uint8)
            zz, yy, xx = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
            for c in (1, 2):
                centre = [rng.uniform(0, s) for s in shape]
                ref[(zz - centre[0]) ** 2 + (yy - centre[1]) ** 2 + (xx - centre[2]) ** 2 <= rng.uniform(2, 4) ** 2] = c
            t1 = (ref * 40 + rng.normal(0, 15, shape)).astype(np.float32)
            t2 = (ref * -30 + rng.normal(0, 20, shape) + 100).astype(np.int16)
            zooms = (0.9, 1.1, 2.5) if i % 2 else (1.0, 1.0, 1.0)
            files = []
            for name, a, dt in (("t1", t1, np.float32), ("t2", t2, np.int16), ("ref", ref, np.uint8)):
                files.append(os.path.join(root, f"{name}_{i}.nii.gz"))
                save_volume(files[-1], a, zooms, dt)
            rows.append(f"case{i},{files[0]};{files[1]},{files[2]}")
            cases.append(files)
        manifest = tt.write_manifest(root, rows, "m.csv")
        return manifest, cases

    def test_sliding_window_model_matches_a_reference_loop_and_scipy(self):
        rng = np.random.default_rng(3103)
        root = tt.tmpdir(self)
        manifest, cases = self.make_set(root, rng)
        torch.manual_seed(7)
        net = Net3D().eval()
        model = os.path.join(root, "net3d.pt")
        torch.jit.script(net).save(model)
        roi, overlap = (8, 6, 7), 0.4
        outs = []
        for workers in ("1", "3"):
            out = os.path.join(root, "o" + workers)
            saved = os.path.join(root, "saved" + workers)
            tt.tally("run", "--model", model, "--manifest", manifest, "--out", out, "--workers", workers,
                     "--shard-size", "1", "--sliding-window", ",".join(map(str, roi)), "--overlap", str(overlap),
                     "--sw-batch-size", "3", "--intensity", "zscore", "--metrics", "dice,iou,hd95,assd",
                     "--save-predictions", saved)
            outs.append((out, saved))
        self.assertTrue(tt.same_files(outs[0][0], outs[1][0]), "per_image.csv differs between 1 and 3 workers")
        rows = tt.read_per_image(outs[0][0])
        checked_voxels = 0
        for i, (t1, t2, refpath) in enumerate(cases):
            a1, _ = read_zyx(t1)
            a2, _ = read_zyx(t2)
            ref, refimg = read_zyx(refpath)
            image = np.stack([zscore(np.asarray(a1, np.float32)), zscore(np.asarray(a2, np.float32))])
            scores = sliding_window(net, image, roi, overlap)
            want = scores.argmax(0)
            got, gotimg = read_zyx(os.path.join(outs[0][1], f"case{i}.nii.gz"))
            np.testing.assert_allclose(gotimg.affine, refimg.affine)
            top2 = np.sort(scores, axis=0)[-2:]
            decided = (top2[1] - top2[0]) > 1e-4  # Voxels whose argmax float rounding cannot flip.
            self.assertTrue(np.array_equal(got[decided], want[decided]), f"case {i}: labels differ from the loop")
            checked_voxels += int(decided.sum())
            spacing = tuple(float(z) for z in refimg.header.get_zooms()[:3])[::-1]  # z, y, x
            for c in range(3):
                row = [r for r in rows if int(r["index"]) == i and int(r["class"]) == c][0]
                p, r = got == c, ref == c
                tp, fp, fn = int(np.sum(p & r)), int(np.sum(p & ~r)), int(np.sum(~p & r))
                self.assertEqual((int(row["tp"]), int(row["fp"]), int(row["fn"])), (tp, fp, fn), f"case {i} class {c}")
                s = tt.surface_metrics(p, r, spacing)
                for m in ("hd95", "assd"):
                    self.assertTrue(tt.same(tt.num(row[m]), s[m]), f"case {i} class {c} {m}: {row[m]} vs {s[m]}")
        self.assertGreater(checked_voxels, 3000)

    def test_whole_volume_without_a_window_is_one_forward_pass(self):
        rng = np.random.default_rng(55)
        root = tt.tmpdir(self)
        manifest, cases = self.make_set(root, rng, n=3)
        torch.manual_seed(9)
        net = Net3D().eval()
        model = os.path.join(root, "net3d.pt")
        torch.jit.script(net).save(model)
        out, saved = os.path.join(root, "o"), os.path.join(root, "s")
        tt.tally("run", "--model", model, "--manifest", manifest, "--out", out, "--save-predictions", saved)
        for i, (t1, t2, _) in enumerate(cases):
            image = np.stack([np.asarray(read_zyx(t1)[0], np.float32), np.asarray(read_zyx(t2)[0], np.float32)])
            with torch.no_grad():
                scores = net(torch.from_numpy(image)[None])[0].numpy()
            top2 = np.sort(scores, axis=0)[-2:]
            decided = (top2[1] - top2[0]) > 1e-4
            got = read_zyx(os.path.join(saved, f"case{i}.nii.gz"))[0]
            self.assertTrue(np.array_equal(got[decided], scores.argmax(0)[decided]))

    def test_python_model_gets_voxels_spacing_and_affine_exactly(self):
        rng = np.random.default_rng(8)
        root = tt.tmpdir(self)
        manifest, cases = self.make_set(root, rng, n=4)
        model = os.path.join(root, "vol_model.py")
        with open(model, "w") as f:
            f.write(
                "import json\n"
                "import numpy as np\n"
                "class Model:\n"
                "    num_classes = 3\n"
                "    def __init__(self, devices, options):\n"
                "        self.dir = options['dir']\n"
                "    def predict(self, images, rows):\n"
                "        outs = []\n"
                "        for im, r in zip(images, rows):\n"
                "            np.save('%s/%s.npy' % (self.dir, r['id']), im)\n"
                "            with open('%s/%s.json' % (self.dir, r['id']), 'w') as f:\n"
                "                json.dump({'spacing': list(r['spacing']), 'affine': r['affine'].tolist(),\n"
                "                           'dtype': str(im.dtype)}, f)\n"
                "            scores = np.zeros((3,) + im.shape[1:], np.float32)\n"
                "            scores[0] = 1.0\n"
                "            scores[1] = (im[0] > 20)\n"
                "            scores[2] = 2.0 * (im[0] > 60)\n"
                "            outs.append(scores)\n"
                "        return outs\n")
        for keep in (False, True):
            seen = os.path.join(root, "seen%d" % keep)
            os.makedirs(seen)
            out = os.path.join(root, "o%d" % keep)
            extra = ["--keep-dtype"] if keep else []
            # Both channels stored as int16 for --keep-dtype (one type for the whole volume).
            m = manifest
            if keep:
                m = os.path.join(root, "m2.csv")
                with open(manifest) as f, open(m, "w") as g:
                    lines = f.read().splitlines()
                    g.write(lines[0] + "\n")
                    for line in lines[1:]:
                        rid, image, mask = line.split(",")
                        g.write(f"{rid},{image.split(';')[1]};{image.split(';')[1]},{mask}\n")
            tt.tally("run", "--model", model, "--python", "/usr/bin/python3", "--manifest", m, "--out", out,
                     "--model-option", f"dir={seen}", "--workers", "2", "--shard-size", "1", *extra)
            rows = tt.read_per_image(out)
            for i, (t1, t2, refpath) in enumerate(cases):
                got = np.load(os.path.join(seen, f"case{i}.npy"))
                with open(os.path.join(seen, f"case{i}.json")) as f:
                    meta = json.load(f)
                img1, img = read_zyx(t1)
                img2, _ = read_zyx(t2)
                if keep:
                    want = np.stack([np.asarray(img2), np.asarray(img2)])
                    self.assertEqual(meta["dtype"], "int16")
                else:
                    want = np.stack([np.asarray(img1, np.float32), np.asarray(img2, np.float32)])
                    self.assertEqual(meta["dtype"], "float32")
                self.assertEqual(got.shape, want.shape)
                self.assertTrue(np.array_equal(got, want), f"case {i}: voxels differ")
                self.assertEqual(meta["spacing"], [float(z) for z in img.header.get_zooms()[:3]][::-1])
                np.testing.assert_array_equal(np.array(meta["affine"]), img.affine)
                if not keep:
                    ref = read_zyx(refpath)[0]
                    scores = np.stack([np.ones_like(want[0]), (want[0] > 20).astype(np.float32),
                                       2.0 * (want[0] > 60)])
                    labels = scores.argmax(0)  # First maximum on ties, as the stub's argmax.
                    for c in range(3):
                        row = [r for r in rows if int(r["index"]) == i and int(r["class"]) == c][0]
                        self.assertEqual(int(row["tp"]), int(np.sum((labels == c) & (ref == c))))

    def test_bad_volumes_fail_their_rows_naming_the_files(self):
        rng = np.random.default_rng(1)
        root = tt.tmpdir(self)
        manifest, cases = self.make_set(root, rng, n=2)
        other = os.path.join(root, "other.nii.gz")
        save_volume(other, np.zeros((3, 4, 5), np.float32), (1.0, 1.0, 1.0), np.float32)
        with open(manifest, "a") as f:
            f.write(f"wrong,{other},{cases[0][2]}\n")
            f.write(f"missing,{root}/nope.nii.gz,{cases[0][2]}\n")
        torch.manual_seed(1)
        model = os.path.join(root, "net3d.pt")
        torch.jit.script(Net3D().eval()).save(model)
        out = os.path.join(root, "o")
        p = tt.tally("run", "--model", model, "--manifest", manifest, "--out", out, "--sliding-window", "4,4,4",
                     "--max-failed-fraction", "1", check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        report = tt.read_report(out)
        reasons = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertIn(other, reasons["wrong"])
        self.assertIn(cases[0][2], reasons["wrong"])
        self.assertIn("nope.nii.gz", reasons["missing"])
        self.assertEqual(report["images_evaluated"], 2)
        # A window for 2D images is refused at submission.
        png = os.path.join(root, "p.csv")
        with open(png, "w") as f:
            f.write("image,mask\na.png,b.png\n")
        bad = tt.tally("run", "--model", model, "--manifest", png, "--out", out, "--sliding-window", "4,4,4",
                       check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("are not NIfTI volumes", bad.stderr + bad.stdout)


if __name__ == "__main__":
    unittest.main()
