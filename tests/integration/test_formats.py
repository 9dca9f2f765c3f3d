"""Images and masks as labs keep them (docs/data.md "Where your data can be"): TIFF (none, LZW,
deflate, PackBits, tiled, planar, BigTIFF, 16-bit, RGBA, pages), WebP and DICOM. Every lossless
variant's per_image.csv equals that of the same pixels stored as PNG (image column aside); DICOM
and windowed 16-bit images equal PNGs of the values an independent numpy rendition of DICOM's
window rule gives; lossy masks and unreadable files fail only their rows, naming the reason.
Fixtures are written with Debian's python3-pil, python3-tifffile and python3-pydicom."""
import csv
import os
import shutil
import unittest

import numpy as np
import tifffile
from PIL import Image

import tallytest as tt

DEMO = os.path.join(tt.SRC, "examples", "demo")
N = 10


def demo_rows():
    with open(os.path.join(DEMO, "manifest.csv")) as f:
        rows = list(csv.DictReader(f))[:N]
    out = []
    for r in rows:
        image = np.asarray(Image.open(os.path.join(DEMO, r["image"])).convert("RGB"))
        mask = np.asarray(Image.open(os.path.join(DEMO, r["mask"])))
        out.append((r["id"], image, mask))
    return out


def write_set(root, rows, write_image, write_mask, image_ext, mask_ext, extra=None):
    """One manifest over the rows, each written by the given functions; `extra`: {column: value}."""
    os.makedirs(root, exist_ok=True)
    columns = ["id", "image", "mask"] + sorted(extra or {})
    lines = [",".join(columns)]
    for rid, image, mask in rows:
        ip, mp = f"{rid}.{image_ext}", f"{rid}_m.{mask_ext}"
        write_image(os.path.join(root, ip), image)
        write_mask(os.path.join(root, mp), mask)
        lines.append(",".join([rid, ip, mp] + [str((extra or {})[c]) for c in sorted(extra or {})]))
    return tt.write_manifest(root, lines)


def png_image(path, a):
    Image.fromarray(a).save(path)


def png_mask(path, m):
    Image.fromarray(m.astype(np.uint8)).save(path)


def pil_tiff(compression):
    return lambda path, a: Image.fromarray(a).save(path, compression=compression)


def window(v, center, width):
    """DICOM PS3.3 C.11.2.1.2.1, linear, to 0..255, rounded half up (the values here are >= 0)."""
    v = np.asarray(v, np.float64)
    c = center - 0.5
    half = (width - 1) / 2
    y = np.floor(((v - c) / (width - 1) + 0.5) * 255 + 0.5)
    return np.where(v <= c - half, 0, np.where(v > c + half, 255, y)).astype(np.uint8)


def grey(a):
    return (0.299 * a[..., 0] + 0.587 * a[..., 1] + 0.114 * a[..., 2]).astype(np.float64)


def dicom(path, stored, photometric="MONOCHROME2", bits_stored=12, signed=False, slope=1.0, intercept=0.0,
          center=None, width=None, rgb=None, pixel_data=True):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"  # CT Image Storage.
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID, "CT"
    if rgb is not None:
        ds.Rows, ds.Columns = rgb.shape[:2]
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        if pixel_data:
            ds.PixelData = rgb.astype(np.uint8).tobytes()
    else:
        ds.Rows, ds.Columns = stored.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, bits_stored, bits_stored - 1
        ds.PixelRepresentation = 1 if signed else 0
        ds.RescaleSlope, ds.RescaleIntercept = str(slope), str(intercept)
        if center is not None:
            ds.WindowCenter, ds.WindowWidth = str(center), str(width)
        if pixel_data:
            ds.PixelData = stored.astype("<i2" if signed else "<u2").tobytes()
    ds.save_as(path, write_like_original=False)


def truncated(src, dst, size):
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read()[:size])


def handmade_tiff(pages=1, tile=None, size=8):
    """A little-endian TIFF of `pages` IFDs sharing one strip (or one tile of `tile` x `tile`) of a
    size x size 8-bit grey image, written byte by byte (no library would write the hostile ones)."""
    import struct
    # A whole tile's bytes where it is small (a giant one is refused before its data is read).
    pixels = tile * tile if tile and tile * tile <= 1 << 16 else size * size
    data = bytes((x * 16) % 256 for x in range(pixels))
    header = b"II*\0" + struct.pack("<I", 8 + len(data))
    def ifd(at, next_at):
        entries = [(256, 4, size), (257, 4, size), (258, 3, 8), (259, 3, 1), (262, 3, 1), (277, 3, 1)]
        if tile:
            entries += [(322, 4, tile), (323, 4, tile), (324, 4, 8), (325, 4, len(data))]
        else:
            entries += [(273, 4, 8), (278, 4, size), (279, 4, len(data))]
        out = struct.pack("<H", len(entries))
        for tag, kind, value in sorted(entries):
            out += struct.pack("<HHI", tag, kind, 1) + (struct.pack("<HH", value, 0) if kind == 3 else
                                                        struct.pack("<I", value))
        return out + struct.pack("<I", next_at)
    size_ifd = len(ifd(0, 0))
    first = 8 + len(data)
    body = b"".join(ifd(first + k * size_ifd, first + (k + 1) * size_ifd if k + 1 < pages else 0)
                    for k in range(pages))
    return header + data + body


def grey_model(path):
    """A TorchScript model that sees grey levels (the demo's sees only red minus blue, so every grey
    image is background to it): class 1 where the 3x3 mean is bright, class 2 where it is dark."""
    import torch

    class Grey(torch.nn.Module):
        def forward(self, x):
            g = torch.nn.functional.avg_pool2d(x.mean(1, keepdim=True), 3, 1, 1)
            return torch.cat([torch.zeros_like(g), 16 * (g - 0.55), 16 * (0.35 - g)], 1)

    torch.jit.script(Grey()).save(path)
    return path


# A Python model that reads stored values: DICOM in physical units (rows[i]'s rescale), 16-bit TIFF as
# stored; it checks each image's dtype against the manifest's and the header's values it needs.
RAW_MODEL = """
import numpy as np


class Model:
    def __init__(self, devices, options):
        pass

    def predict(self, images, rows):
        out = []
        for img, row in zip(images, rows):
            if str(img.dtype) != row["dtype"] or img.ndim != 2:
                raise TypeError("row %s: got %s %s, expected %s" % (row["id"], img.dtype, img.shape, row["dtype"]))
            if row["kind"] == "tiff16":
                assert row["photometric"] == "min-is-black" and row["bits_per_sample"] == "16", row
                value, hi, lo = img.astype(np.float64), 40000, 12000
            else:
                assert row["photometric"] == "MONOCHROME2", row
                value = img.astype(np.float64) * float(row["rescale_slope"]) + float(row["rescale_intercept"])
                hi, lo = (700, 200) if row["kind"] == "dicom_unsigned" else (600, -1200)
                if row["kind"] == "dicom_unsigned":
                    assert float(row["window_center"]) == 300 and float(row["window_width"]) == 600, row
            out.append(np.where(value > hi, 1, np.where(value < lo, 2, 0)).astype(np.int64))
        return out
"""


def per_image_without_image(out):
    """per_image.csv's rows without what names the files (the image's path, the files' digests)."""
    return [{k: v for k, v in r.items() if k != "image" and not k.endswith("_xxh128")} for r in tt.read_per_image(out)]


class FormatsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-formats-")
        cls.rows = demo_rows()
        cls.grey_model = grey_model(os.path.join(cls.root, "grey.pt"))
        cls.cluster = tt.Cluster(cls, os.path.join(cls.root, "c"))
        cls.cluster.start_worker()
        cls.cluster.start_worker()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.root, True)

    @classmethod
    def addCleanup(cls, *args, **kwargs):
        pass

    def evaluate(self, name, manifest, *flags, model=None):
        job = self.cluster.submit(model or os.path.join(DEMO, "model.pt"), manifest, "--max-failed-fraction", "1",
                                  "--metrics", "dice,iou,hd95", *flags)
        self.assertEqual(self.cluster.wait(job)["state"], "succeeded", name)
        out = os.path.join(self.root, "out-" + name)
        self.cluster.fetch(job, out)
        return out

    def baseline(self, name, rows, model=None):
        return self.evaluate(name, write_set(os.path.join(self.root, name), rows, png_image, png_mask, "png", "png"),
                             model=model)

    def assertSameAsPng(self, png_out, out, what):
        report = tt.read_report(out)
        self.assertEqual(report["images_failed"], 0, (what, report.get("failures")))
        self.assertEqual(per_image_without_image(out), per_image_without_image(png_out), what)

    def test_lossless_tiff_and_webp_equal_the_same_pixels_as_png(self):
        rows = self.rows
        png = self.baseline("png", rows)

        def tiff(**kw):
            return lambda path, a: tifffile.imwrite(path, a, **kw)

        rgba = [(i, np.dstack([a, (np.arange(a.size // 3) % 256).reshape(a.shape[:2]).astype(np.uint8)]), m)
                for i, a, m in rows]
        variants = {
            "tiff_none": (rows, tiff(photometric="rgb"), tiff(), {}),
            "tiff_lzw": (rows, pil_tiff("tiff_lzw"), pil_tiff("tiff_lzw"), {}),
            "tiff_deflate": (rows, tiff(photometric="rgb", compression="zlib"), pil_tiff("tiff_adobe_deflate"), {}),
            "tiff_packbits": (rows, pil_tiff("packbits"), pil_tiff("packbits"), {}),
            "tiff_tiled_planar_bigtiff": (rows, lambda p, a: tifffile.imwrite(p, np.moveaxis(a, -1, 0), photometric="rgb",
                                                                              tile=(16, 16), planarconfig="separate",
                                                                              bigtiff=True),
                                          tiff(tile=(32, 32), bigtiff=True), {}),
            "tiff_rgba": (rgba, tiff(photometric="rgb", extrasamples=["unassalpha"]), tiff(), {}),
            # 16-bit: v * 257 has high byte v; masks as 16-bit labels.
            "tiff_16bit": (rows, lambda p, a: tifffile.imwrite(p, a.astype(np.uint16) * 257, photometric="rgb"),
                           lambda p, m: tifffile.imwrite(p, m.astype(np.uint16)), {}),
            # Two pages: page 0 is noise, the 'page' column names page 1; the mask's only page serves it.
            "tiff_pages": (rows, lambda p, a: tifffile.imwrite(p, np.stack([255 - a, a]), photometric="rgb"),
                           tiff(), {"page": 1}),
            "webp_lossless": (rows, lambda p, a: Image.fromarray(a).save(p, lossless=True),
                              lambda p, m: Image.fromarray(m.astype(np.uint8)).convert("RGB").save(p, lossless=True),
                              {}),
        }
        for name, (data, write_image, write_mask, extra) in variants.items():
            with self.subTest(variant=name):
                ext = "webp" if name.startswith("webp") else "tif"
                manifest = write_set(os.path.join(self.root, name), data, write_image, write_mask, ext, ext, extra)
                self.assertSameAsPng(png, self.evaluate(name, manifest), name)

    def test_dicom_and_windowed_16_bit_images_equal_their_windowed_pixels_as_png(self):
        rng = np.random.default_rng(44)
        stored = {i: np.clip(grey(a) * 16 + rng.integers(0, 16, a.shape[:2]), 0, 4095).astype(np.uint16)
                  for i, a, _ in self.rows}
        masks = {i: m for i, _, m in self.rows}
        cases = {
            # MONOCHROME2, 12 of 16 bits, slope and intercept, the header's window.
            "dicom_header_window": (lambda i: dict(slope=0.5, intercept=-50, center=700, width=1500),
                                    lambda i: window(stored[i] * 0.5 - 50, 700, 1500), ()),
            # MONOCHROME1 (inverted), --window overrides the header's.
            "dicom_mono1_flag_window": (lambda i: dict(photometric="MONOCHROME1", center=10, width=20),
                                        lambda i: 255 - window(stored[i], 2000, 3001), ("--window", "2000,3001")),
            # Signed values and no window: the type's range (-32768..32767, rescaled).
            "dicom_signed_type_range": (lambda i: dict(signed=True, bits_stored=16, slope=2.0, intercept=100),
                                        lambda i: np.floor((stored[i].astype(np.float64) * 2 + 100 - (-32768 * 2 + 100))
                                                           / (65535 * 2) * 255 + 0.5).astype(np.uint8), ()),
        }
        for name, (header, expected, flags) in cases.items():
            with self.subTest(case=name):
                want = [(i, np.repeat(expected(i)[..., None], 3, axis=2).astype(np.uint8), masks[i]) for i in stored]
                png = self.baseline(name + "_png", want, model=self.grey_model)
                data = [(i, i, masks[i]) for i in stored]
                manifest = write_set(os.path.join(self.root, name), data,
                                     lambda p, i: dicom(p, stored[i], **header(i)), png_mask, "dcm", "png")
                self.assertSameAsPng(png, self.evaluate(name, manifest, *flags, model=self.grey_model), name)
        # 8-bit RGB DICOM is the PNG's pixels; a 16-bit TIFF through --window, the window's.
        png = self.baseline("png_rgb", self.rows)
        manifest = write_set(os.path.join(self.root, "dicom_rgb"), self.rows, lambda p, a: dicom(p, None, rgb=a),
                             png_mask, "dcm", "png")
        self.assertSameAsPng(png, self.evaluate("dicom_rgb", manifest), "dicom_rgb")
        wide = {i: (a.astype(np.uint16) * 40 + 1000) for i, a, _ in self.rows}
        want = [(i, window(wide[i], 6000, 9000), masks[i]) for i in wide]
        png = self.baseline("tiff_window_png", want)
        manifest = write_set(os.path.join(self.root, "tiff_window"), [(i, i, masks[i]) for i in wide],
                             lambda p, i: tifffile.imwrite(p, wide[i], photometric="rgb"), png_mask, "tif", "png")
        self.assertSameAsPng(png, self.evaluate("tiff_window", manifest, "--window", "6000,9000"), "tiff_window")

    def test_python_models_get_16_bit_and_dicom_values_with_their_dtype_and_header(self):
        """A Python model gets a DICOM's stored values (uint16 or int16) with rescale and window in
        rows[i], and a 16-bit TIFF's uint16 values; thresholding them in physical units gives the
        label maps an independent numpy rendition writes as PNG predictions: identical per_image.csv."""
        root = os.path.join(self.root, "raw")
        os.makedirs(root)
        model = tt.write_text(os.path.join(root, "raw_model.py"), RAW_MODEL)
        rng = np.random.default_rng(7)
        stored, cases = {}, {}
        for i, (rid, a, m) in enumerate(self.rows[:6]):
            g = grey(a).astype(np.int64) * 16 + rng.integers(0, 16, a.shape[:2])
            kind = ("dicom_unsigned", "dicom_signed", "tiff16")[i % 3]
            if kind == "dicom_unsigned":
                v = g.astype(np.uint16)
                header = dict(slope=0.5, intercept=-100, center=300, width=600)
                value = v * 0.5 - 100
            elif kind == "dicom_signed":
                v = (g - 2048).astype(np.int16)
                header = dict(signed=True, bits_stored=16, slope=1.0, intercept=0.0)
                value = v.astype(np.float64)
            else:
                v = (g * 16).astype(np.uint16)
                value = v.astype(np.float64)
            stored[rid], cases[rid] = v, (kind, header if kind != "tiff16" else None)
            # The model's rule, independently: class 1 above the row's upper threshold, 2 below its lower.
            hi, lo = (700, 200) if kind != "tiff16" else (40000, 12000)
            if kind == "dicom_signed":
                hi, lo = 600, -1200
            label = np.where(value > hi, 1, np.where(value < lo, 2, 0)).astype(np.uint8)
            Image.fromarray(label).save(os.path.join(root, rid + "_pred.png"))
        lines = ["id,image,mask,kind,dtype"]
        pred_lines = ["id,mask,prediction"]
        for rid, a, m in self.rows[:6]:
            kind, header = cases[rid]
            if kind == "tiff16":
                path = os.path.join(root, rid + ".tif")
                tifffile.imwrite(path, stored[rid])
            else:
                path = os.path.join(root, rid + ".dcm")
                dicom(path, stored[rid], **header)
            mp = os.path.join(root, rid + "_m.png")
            png_mask(mp, m)
            lines.append(f"{rid},{path},{mp},{kind},{stored[rid].dtype}")
            pred_lines.append(f"{rid},{mp},{os.path.join(root, rid + '_pred.png')}")
        manifest = tt.write_manifest(root, lines)
        predictions = tt.write_manifest(root, pred_lines, "predictions.csv")
        out, ref = os.path.join(root, "out"), os.path.join(root, "ref")
        tt.tally_run(model, manifest, out, "--python", "/usr/bin/python3", "--num-classes", "3",
                     "--metrics", "dice,iou,hd95")
        tt.tally("run", "--manifest", predictions, "--out", ref, "--num-classes", "3", "--metrics", "dice,iou,hd95")
        report = tt.read_report(out)
        self.assertEqual(report["images_failed"], 0, report.get("failures"))
        self.assertEqual(per_image_without_image(out), per_image_without_image(ref))

    def test_lossy_masks_and_unreadable_files_fail_only_their_rows(self):
        root = os.path.join(self.root, "bad")
        os.makedirs(root)
        (i0, a0, m0), (i1, a1, m1) = self.rows[0], self.rows[1]
        bad = {
            "jpeg_tiff_mask": ("ok.png", lambda p: Image.fromarray(m0).save(p, compression="jpeg"), "tif",
                               "JPEG, which is lossy"),
            "lossy_webp_mask": ("ok.png", lambda p: Image.fromarray(m0).convert("RGB").save(p, quality=90), "webp",
                                "lossy WebP"),
            "dicom_mask": ("ok.png", lambda p: dicom(p, m0.astype(np.uint16)), "dcm", "a DICOM image, not a label map"),
            "colour_webp_mask": ("ok.png", lambda p: Image.fromarray(a0).save(p, lossless=True), "webp",
                                 "colour WebP"),
        }
        png_image(os.path.join(root, "ok.png"), a0)
        png_mask(os.path.join(root, "ok_m.png"), m0)
        lines = ["id,image,mask", "good,ok.png,ok_m.png"]
        for name, (image, write, ext, _) in bad.items():
            write(os.path.join(root, f"{name}.{ext}"))
            lines.append(f"{name},{image},{name}.{ext}")
        images = {
            "float_tiff": (lambda p: tifffile.imwrite(p, a0.astype(np.float32), photometric="rgb"), "tif",
                           "floating point samples"),
            "dicom_no_pixels": (lambda p: dicom(p, m0.astype(np.uint16), pixel_data=False), "dcm",
                                "without pixel data"),
            "missing_page": (lambda p: tifffile.imwrite(p, a0, photometric="rgb"), "tif", "has no page 3"),
            "truncated_tiff": (lambda p: truncated(os.path.join(root, "t.tif"), p, 300), "tif", "cannot be decoded"),
            "truncated_webp": (lambda p: truncated(os.path.join(root, "t.webp"), p, 200), "webp", "WebP"),
        }
        tifffile.imwrite(os.path.join(root, "t.tif"), a0, photometric="rgb")
        Image.fromarray(a0).save(os.path.join(root, "t.webp"), lossless=True)
        lines[0] += ",page"
        lines = [lines[0]] + [l + "," for l in lines[1:]]
        for name, (write, ext, _) in images.items():
            write(os.path.join(root, f"{name}.{ext}"))
            lines.append(f"{name},{name}.{ext},ok_m.png,{3 if name == 'missing_page' else ''}")
        lines.append("bad_page,ok.png,ok_m.png,x")
        manifest = tt.write_manifest(root, lines)
        out = self.evaluate("bad", manifest)
        report = tt.read_report(out)
        reasons = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertEqual(report["images_evaluated"], 1, reasons)
        for name, (_, _, _, why) in bad.items():
            self.assertIn(why, reasons[name], name)
            self.assertIn(f"{name}.", reasons[name], name)  # The file is named.
        for name, (_, _, why) in images.items():
            self.assertIn(why, reasons[name], name)
        self.assertIn("column 'page': 'x' is not a page number", reasons["bad_page"])


class HostileTiffTest(unittest.TestCase):
    def test_a_hundred_thousand_pages_and_a_giant_tile_fail_only_their_rows(self):
        root = tt.tmpdir(self)
        with open(os.path.join(root, "pages.tif"), "wb") as f:
            f.write(handmade_tiff(pages=100000))
        with open(os.path.join(root, "tile.tif"), "wb") as f:
            f.write(handmade_tiff(tile=65536))
        with open(os.path.join(root, "ok_tile.tif"), "wb") as f:
            f.write(handmade_tiff(tile=16))  # A tile larger than the image, as writers make for small ones.
        png_mask(os.path.join(root, "m.png"), np.zeros((8, 8), np.uint8))
        manifest = tt.write_manifest(root, ["id,image,mask,page", "last_page,pages.tif,m.png,99999",
                                            "past_the_end,pages.tif,m.png,100000", "giant_tile,tile.tif,m.png,",
                                            "small_tile,ok_tile.tif,m.png,"])
        out = os.path.join(root, "out")
        tt.tally("run", "--model", os.path.join(DEMO, "model.pt"), "--manifest", manifest, "--out", out,
                 "--max-failed-fraction", "1")
        report = tt.read_report(out)
        reasons = {f["id"]: f["reason"] for f in report["failures"]}
        self.assertEqual(sorted(reasons), ["giant_tile", "past_the_end"], reasons)
        self.assertIn("has no page 100000", reasons["past_the_end"])
        self.assertIn("has tiles of 65536x65536, larger than the image (8x8)", reasons["giant_tile"])
        self.assertEqual(report["images_evaluated"], 2)


if __name__ == "__main__":
    unittest.main()
