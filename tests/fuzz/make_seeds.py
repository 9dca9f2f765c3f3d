"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>): small valid files of
every layout the decoders handle, and manifests with the features the parser handles. Run with
Debian's python3 (PIL, numpy); the output is committed."""
import io
import os

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


def save(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def png(img, **kw):
    b = io.BytesIO()
    img.save(b, format="PNG", **kw)
    return b.getvalue()


def main():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, (6, 5), dtype=np.uint8)
    pngs = {
        "rgb8.png": png(Image.fromarray(rgb)),
        "rgba8.png": png(Image.fromarray(np.dstack([rgb, rgb[..., :1]]))),
        "gray8.png": png(Image.fromarray(labels)),
        "gray_alpha.png": png(Image.fromarray(np.dstack([labels, labels])).convert("LA")),
        "gray16.png": png(Image.fromarray(labels.astype(np.uint16) * 300)),
        "palette.png": png(Image.fromarray(labels).convert("P")),
        "one_bit.png": png(Image.fromarray(labels > 1)),
    }
    # An Adam7-interlaced PNG (PIL cannot write one): 2x2 gray, hand-made.
    import zlib, struct
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    raw = b"".join(b"\x00" + bytes([v]) for v in (10,)) + b"\x00" + bytes([20]) + b"\x00" + bytes([30, 40])
    pngs["adam7.png"] = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 0, 0, 0, 1)) +
                         chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    for target in ("png_fast", "png_libpng", "image"):
        for name, data in pngs.items():
            save(target, name, data)
    b = io.BytesIO()
    Image.fromarray(rgb).save(b, format="JPEG", quality=90)
    save("image", "rgb.jpg", b.getvalue())
    b = io.BytesIO()
    Image.fromarray(labels * 60).save(b, format="JPEG", quality=50)
    save("image", "gray.jpg", b.getvalue())
    b = io.BytesIO()
    Image.fromarray(rgb).save(b, format="JPEG", progressive=True)
    save("image", "progressive.jpg", b.getvalue())

    manifests = {
        "basic.csv": "id,image,mask\na,a.png,a_mask.png\nb,b.jpg,b_mask.png\n",
        "quoted.csv": 'image,mask,prompt\n"x, y.png",m.png,"the ""left"" lung"\n',
        "crlf.csv": "image,mask\r\n/abs/a.png,../m.png\r\n",
        "prediction.csv": "mask,prediction,id\nref.nii.gz,pred.nii.gz,case1\n",
        "bom.csv": "\ufeffimage,mask\na.png,b.png\n",
        "ragged.csv": "image,mask\na.png\nb.png,c.png,d.png\n,\n",
        "utf8.csv": "image,mask,id\nbild\u00e4.png,maske.png,\u5927\n",
        "no_header_cols.csv": "root:*:20228:0:99999:7:::\n",
    }
    for name, text in manifests.items():
        save("manifest", name, text.encode("utf-8"))
    save("manifest", "invalid_utf8.csv", b"image,mask\n\xff\xfe.png,m.png\n")
    # Refused: NUL and control characters (tabs aside; line breaks only inside a quoted prompt).
    save("manifest", "nul.csv", b"id,image,mask\ncase_a,images/case_000.png\x00../../etc/passwd,m.png\n")
    save("manifest", "control.csv", b"image,mask,prompt\na\x1b[2J.png,m\x7f.png,\"p\xc2\x85\"\n")
    save("manifest", "prompt_newlines.csv", b"image,mask,prompt\na.png,m.png,\"the left\r\nlung\tand more\"\n")
    for i, s in enumerate([b"plain", b"with,comma", b'quote"inside', b"new\nline", b"\x00\x01\x1f\x7f",
                           "\u00e9\u4e2d\U0001F600".encode(), b"\xc3\x28 invalid", b"\xed\xa0\x80 surrogate"]):
        save("report_strings", f"s{i}", s)
    hostile_seeds()


def hostile_seeds():
    """Hostile cases: COCO sizes that overflow, fields of the wrong type, control characters; a
    dashboard path with %00 and Host headers; NIfTI files with NaN voxels and misplaced vox_offset."""
    import json
    import struct
    import tempfile
    import nibabel as nib
    tri = [[0, 0, 5, 0, 0, 5]]
    save("coco_json", "hostile_sizes.json", json.dumps({
        "images": [{"id": 1, "height": 4294967296, "width": 4294967296}, {"id": 2, "height": 1, "width": 268435456}],
        "categories": [{"id": 1, "name": "a"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "segmentation": tri},
                        {"id": 2, "image_id": 2, "category_id": 1, "segmentation": [[0, 0, 268435455, 0, 0, 0.9]]},
                        {"id": 3, "image_id": 2, "category_id": 1,
                         "segmentation": {"counts": [0, 4], "size": [100.5, 100]}}]}).encode())
    save("coco_json", "hostile_types.json", json.dumps({
        "images": [{"id": 7, "file_name": "a\u0000b.png", "height": 4, "width": 4}],
        "categories": [{"id": 1, "name": "c\u001bt"}],
        "annotations": [{"id": 1, "image_id": "7", "category_id": "1", "segmentation": tri},
                        {"id": 2, "image_id": 7, "category_id": 1e20, "segmentation": tri}]}).encode())
    save("dashboard", "nul_path", b"/api/jobs/j1%00garbage/files/report.json")
    save("dashboard", "nul_file", b"/api/jobs/j1/files/report.json%00../../tally.db")
    save("dashboard", "double_encoded", b"/api/jobs/%256a")
    save("dashboard", "follow_file", b"/api/follows/f1/files/curve.csv")
    save("dashboard", "host", b"[::1]:8080")
    with tempfile.TemporaryDirectory() as tmp:
        vol = np.zeros((4, 3, 2), np.uint8)
        vol[1:3, 1, :] = 2
        for name, v in (("uint8.nii", vol), ("float32_nan.nii", np.where(vol > 0, np.nan, 0).astype(np.float32)),
                        ("int16.nii", vol.astype(np.int16))):
            nib.save(nib.Nifti1Image(v, np.eye(4)), os.path.join(tmp, name))
            with open(os.path.join(tmp, name), "rb") as f:
                save("nifti", name, f.read())
        nib.save(nib.Nifti2Image(vol, np.eye(4)), os.path.join(tmp, "nifti2.nii"))
        with open(os.path.join(tmp, "nifti2.nii"), "rb") as f:
            save("nifti", "nifti2.nii", f.read())
        with open(os.path.join(tmp, "uint8.nii"), "rb") as f:
            raw = f.read()
        for offset in (2147483904.0, -1000.0, 1e12):
            save("nifti", f"offset_{int(offset)}.nii", raw[:108] + struct.pack("<f", offset) + raw[112:])


def format_seeds():
    """TIFF (every layout tiff_io.cc reads, and pages), WebP (lossy, lossless, alpha) and DICOM
    (MONOCHROME1/2 of 8-16 bits, signed, RGB, a window, RLE) seeds: small, so mutations stay cheap."""
    import tempfile
    import tifffile
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    grey = rng.integers(0, 4, (9, 11), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        def tif(name, data, page_byte=0, **kw):
            path = os.path.join(tmp, name)
            tifffile.imwrite(path, data, **kw)
            with open(path, "rb") as f:
                save("tiff", name, bytes([page_byte]) + f.read())

        def pil_tif(name, img, compression):
            path = os.path.join(tmp, name)
            img.save(path, compression=compression)
            with open(path, "rb") as f:
                save("tiff", name, b"\0" + f.read())

        tif("rgb.tif", rgb, photometric="rgb")
        tif("grey16.tif", grey.astype(np.uint16) * 3000, page_byte=4)
        tif("planar_tiled.tif", np.moveaxis(np.tile(rgb, (2, 2, 1)), -1, 0), photometric="rgb", tile=(16, 16),
            planarconfig="separate")
        tif("bigtiff.tif", grey, bigtiff=True)
        tif("pages.tif", np.stack([grey, grey + 1]), page_byte=1)
        tif("zlib.tif", rgb, photometric="rgb", compression="zlib")
        tif("bilevel.tif", grey > 1)
        tif("palette.tif", grey, photometric="palette", colormap=rng.integers(0, 65536, (3, 256), dtype=np.uint16))
        pil_tif("lzw.tif", Image.fromarray(rgb), "tiff_lzw")
        pil_tif("packbits.tif", Image.fromarray(grey), "packbits")
        pil_tif("jpeg.tif", Image.fromarray(rgb), "jpeg")
        for name, img, kw in (("lossless.webp", Image.fromarray(rgb), {"lossless": True}),
                              ("lossy.webp", Image.fromarray(rgb), {"quality": 80}),
                              ("grey.webp", Image.fromarray(grey * 60).convert("RGB"), {"lossless": True}),
                              ("alpha.webp", Image.fromarray(np.dstack([rgb, rgb[..., :1]])), {"lossless": True})):
            b = io.BytesIO()
            img.save(b, format="WEBP", **kw)
            save("webp", name, b.getvalue())
        from pydicom.dataset import Dataset, FileMetaDataset
        from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid

        def dcm(name, pixels, photometric, bits, signed=False, window=None, rle=False, flag=0):
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
            meta.MediaStorageSOPInstanceUID = generate_uid()
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            ds = Dataset()
            ds.file_meta = meta
            ds.is_little_endian, ds.is_implicit_VR = True, False
            ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
            ds.Rows, ds.Columns = pixels.shape[:2]
            ds.SamplesPerPixel = 3 if pixels.ndim == 3 else 1
            ds.PhotometricInterpretation = photometric
            if pixels.ndim == 3:
                ds.PlanarConfiguration = 0
            ds.BitsAllocated = 8 if pixels.dtype.itemsize == 1 else 16
            ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits, bits - 1, int(signed)
            ds.RescaleSlope, ds.RescaleIntercept = "1.5", "-20"
            if window:
                ds.WindowCenter, ds.WindowWidth = window
            ds.PixelData = pixels.tobytes()
            if rle:
                ds.compress(RLELossless)
            path = os.path.join(tmp, name)
            ds.save_as(path, write_like_original=False)
            with open(path, "rb") as f:
                save("dicom", name, bytes([flag]) + f.read())

        dcm("mono2_12bit.dcm", (grey.astype(np.uint16) * 1000), "MONOCHROME2", 12, window=("40", "400"))
        dcm("mono1_8bit.dcm", grey * 60, "MONOCHROME1", 8, flag=1)
        dcm("signed16.dcm", (grey.astype(np.int16) - 2) * 3000, "MONOCHROME2", 16, signed=True)
        dcm("rgb.dcm", rgb, "RGB", 8)
        try:
            dcm("rle.dcm", grey.astype(np.uint16) * 100, "MONOCHROME2", 16, rle=True)
        except Exception:  # pydicom's RLE encoder needs numpy only, but older versions lack it.
            pass


def tar_seeds():
    """Tar shards: ustar, pax (long names), GNU, gzip; samples with json, a symlink, a directory."""
    import io
    import tarfile
    rng = np.random.default_rng(2)
    image = png(Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)))
    mask = png(Image.fromarray(rng.integers(0, 3, (4, 5), dtype=np.uint8)))

    def tar(name, mode="w", fmt=tarfile.USTAR_FORMAT, flags=1):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode, format=fmt) as t:
            def add(n, data):
                ti = tarfile.TarInfo(n)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            add("a/k1.png", image)
            add("a/k1.seg.png", mask)
            add("a/k1.json", b'{"prompt": "x", "n": [1, 2]}')
            if fmt != tarfile.USTAR_FORMAT:
                add("b/" + "L" * 120 + ".jpg", image)
            d = tarfile.TarInfo("dir")
            d.type = tarfile.DIRTYPE
            t.addfile(d)
            s = tarfile.TarInfo("k2.png")
            s.type, s.linkname = tarfile.SYMTYPE, "../x"
            t.addfile(s)
            add("k2.seg.png", mask)
            add("k3.pred.png", mask)
        save("tar", name, bytes([flags]) + buf.getvalue())

    tar("ustar.tar")
    tar("pax.tar", fmt=tarfile.PAX_FORMAT)
    tar("gnu.tar", fmt=tarfile.GNU_FORMAT, flags=2)
    tar("pax.tar.gz", mode="w:gz", fmt=tarfile.PAX_FORMAT)


def store_entry_seeds():
    """Prediction store entries (common/store/prediction_store.h's layout), 1, 2, 4, 8 and 16 bits a
    label; the first byte is the row's size for the target (low nibble height - 1, high nibble width - 1)."""
    import struct
    import zlib

    for name, h, w, k, bits in (("bits1.tps", 3, 5, 2, 1), ("bits2.tps", 3, 5, 3, 2), ("bits4.tps", 4, 3, 9, 4),
                                ("bits8.tps", 3, 5, 200, 8), ("bits16.tps", 4, 2, 300, 16)):
        labels = [(i * 7) % k for i in range(h * w)]
        if bits == 16:
            raw = b"".join(struct.pack("<H", v) for v in labels)
        else:
            stream = 0
            for i, v in enumerate(labels):
                stream |= v << (i * bits)
            raw = stream.to_bytes((len(labels) * bits + 7) // 8, "little")
        c = zlib.compressobj(1, zlib.DEFLATED, -15)
        payload = c.compress(raw) + c.flush()
        header = b"TALLYPS2" + struct.pack("<IIIIII", 96, bits, h, w, k, 0) + struct.pack("<qQ", 2, len(payload))
        header += bytes(16) + bytes(32)  # Digests: not checked by the fuzz build.
        save("store_entry", name, bytes([(h - 1) | ((w - 1) << 4)]) + header + payload)
    # The current layout: a volume of depth 2, and a 2D entry with 16-bit scores after its labels.
    for name, h, w, d, scores in (("volume.tps", 3, 4, 2, False), ("scores.tps", 4, 3, 1, True)):
        n = h * w * d
        stream = 0
        for i in range(n):
            stream |= ((i * 5) % 3) << (i * 2)
        raw = stream.to_bytes((n * 2 + 7) // 8, "little")
        if scores:
            raw += b"".join(struct.pack("<H", (i * 4099) % 65536) for i in range(n))
        c = zlib.compressobj(1, zlib.DEFLATED, -15)
        payload = c.compress(raw) + c.flush()
        header = b"TALLYPS3" + struct.pack("<IIIIII", 104, 2, h, w, 3, d) + struct.pack("<qQ", 0, len(payload))
        header += bytes(16) + bytes(32) + struct.pack("<II", 16 if scores else 0, 0)
        save("store_entry", name, bytes([(h - 1) | ((w - 1) << 4)]) + header + payload)


def store_settings_seeds():
    """Prediction store settings files (common/store/store_settings.h); the first byte's bit 0 names the model."""
    text = ("precision fp32\ninput 0x0\nmean \nstd \nlabel_map \ncompile off\ndecode auto cpu\ndevice cpu \n"
            "batch 0\nlayout contiguous\njpeg host\n")
    volume = text + ("volume on\nintensity zscore\nsliding_window 8,6,7\noverlap 0.40000000000000002\nsw_batch 4\n"
                     "keep_dtype off\n")
    for name, first, body in (("plain.txt", 1, text), ("volume.txt", 0, volume), ("window.txt", 1,
                              text.replace("compile off\n", "compile off\nwindow 40,400\n"))):
        save("store_settings", name, bytes([first]) + ("tally-store-settings-v1\nmodel " + "a" * 64 + "\n" + body).encode())

def package_metadata_seeds():
    """An AOTInductor package's metadata as tally export writes it (worker/torch/package_metadata.h): key=value lines."""
    base = {"tally.input": "3x512x512", "tally.batch_max": "32", "tally.batch_dynamic": "1", "tally.precision": "bf16",
            "tally.torch": "2.11.0+cu130", "AOTI_DEVICE_KEY": "cuda"}
    for name, changes in (("dynamic.txt", {}), ("fixed.txt", {"tally.batch_dynamic": "0", "tally.precision": "fp32"}),
                          ("huge.txt", {"tally.input": "3x65536x65536", "tally.batch_max": "4096"}),
                          ("foreign.txt", {"tally.input": None, "tally.batch_max": None})):
        meta = dict(base)
        for k, v in changes.items():
            if v is None:
                meta.pop(k)
            else:
                meta[k] = v
        save("package_metadata", name, "".join("%s=%s\n" % kv for kv in meta.items()).encode())


if __name__ == "__main__":
    main()
    format_seeds()
    tar_seeds()
    store_entry_seeds()
    store_settings_seeds()
    package_metadata_seeds()
