"""--group-by and --find-slices: the per-group tables of every report format against a groupby of
per_image.csv and the manifest computed here (numpy, scipy's t quantiles), identical for 1 and 3
workers in random order; the derived row properties against independent computations (scipy's
connected components, the image's mean byte); the report's failing slices equal tally slices'
search; bad terms are refused naming the column."""
import csv
import json
import math
import os
import shutil
import tempfile
import unittest

import numpy as np
from PIL import Image
from scipy import ndimage, stats

import tallytest as tt
from test_slices import plant

TERMS = "site,size,age:3,derived:fg_fraction:2,derived:components"


def text(path):
    with open(path) as f:
        return f.read()


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def t_interval(v):
    if len(v) < 2:
        return None
    half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return v.mean() - half, v.mean() + half


def welch(a, b):
    if len(a) < 2 or len(b) < 2:
        return None
    x, y = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = a.mean() - b.mean()
    if x + y == 0:
        return d, d
    df = (x + y) ** 2 / (x * x / (len(a) - 1) + y * y / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(x + y)
    return d - half, d + half


def bin_of(values, bins):
    """numpy's linear quantile edges; a value on an inner edge goes to the lower bin (1-based)."""
    edges = np.quantile(values, np.linspace(0, 1, bins + 1))
    return [min(bins, max(1, int(np.searchsorted(edges, a, side="left")))) for a in values]


class GroupsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-it-")
        cls.addClassCleanup(shutil.rmtree, cls.root, True)
        folder = os.path.join(cls.root, "set")
        cls.manifest, rows = plant(folder, np.random.default_rng(5), n=240)
        # Three rows of site A whose prediction is missing: failed, counted in their groups.
        rows += [[f"gone{i}", f"pred/none{i}.png", "ref/m0000.png", "A", "X", "large", "50.0"] for i in range(3)]
        with open(cls.manifest, "w", newline="") as f:
            csv.writer(f).writerows(rows)
        cls.rows = rows
        cls.out1 = os.path.join(cls.root, "one")
        cls.out3 = os.path.join(cls.root, "three")
        common = ("--manifest", cls.manifest, "--metrics", "dice,iou", "--group-by", TERMS, "--find-slices",
                  "--max-failed-fraction", "1", "--min-group-rows", "30")
        tt.tally("run", "--out", cls.out1, "--workers", "1", *common)
        tt.tally("run", "--out", cls.out3, "--workers", "3", "--order", "random:7", "--shard-size", "17", *common)

    def test_tables_equal_a_groupby_of_per_image_csv(self):
        header, data = self.rows[0], self.rows[1:]
        per_image = [r for r in read_csv(os.path.join(self.out1, "per_image.csv")) if r["class"] == "1"]
        by_index = {int(r["index"]): r for r in per_image}
        evaluated = sorted(by_index)
        failed = [i for i in range(len(data)) if i not in by_index]
        self.assertEqual(len(failed), 3)
        col = {h: k for k, h in enumerate(header)}
        ages = np.array([float(data[i][col["age"]]) for i in evaluated])
        fg = np.array([float(by_index[i]["fg_fraction"]) for i in evaluated])
        keys = {
            "site": {i: data[i][col["site"]] for i in range(len(data))},
            "size": {i: data[i][col["size"]] for i in range(len(data))},
            "age:3": dict(zip(evaluated, (f"q{k}" for k in bin_of(ages, 3)))),
            "derived:fg_fraction:2": dict(zip(evaluated, (f"q{k}" for k in bin_of(fg, 2)))),
            "derived:components": {i: by_index[i]["components"] for i in evaluated},
        }
        report = tt.read_report(self.out1)["groups"]
        self.assertEqual(report["min_group_rows"], 30)
        lines = read_csv(os.path.join(self.out1, "groups.csv"))
        tables = {t["by"]: t for t in report["tables"]}
        self.assertEqual(list(tables), TERMS.split(","))
        for term, key in keys.items():
            groups = {}
            for i in range(len(data)):
                groups.setdefault(key.get(i, "(none)"), []).append(i)
            shown = {g["value"].split(" ")[0]: g for g in tables[term]["groups"]}
            self.assertEqual(sorted(shown), sorted(groups), term)
            for value, members in groups.items():
                g = shown[value]
                inside = [i for i in members if i in by_index]
                self.assertEqual(g["rows"], len(inside), (term, value))
                self.assertEqual(g["failed_rows"], len(members) - len(inside), (term, value))
                self.assertEqual(g["small"], len(inside) < 30)
                for metric in ("dice", "iou"):
                    v = np.array([float(by_index[i][metric]) for i in inside])
                    rest = np.array([float(by_index[i][metric]) for i in evaluated if i not in set(inside)])
                    cell = g["classes"][0][metric]
                    self.assertEqual(g["classes"][0]["class"], "1")
                    self.assertEqual(cell["n"], len(v))
                    if len(v) == 0:
                        continue
                    self.assertTrue(tt.same(cell["mean"], v.mean(), rel=1e-12), (term, value, metric))
                    ci, d = t_interval(v), welch(v, rest)
                    if ci is not None:
                        self.assertTrue(tt.same(cell["ci95"][0], ci[0], rel=1e-9) and tt.same(cell["ci95"][1], ci[1], rel=1e-9))
                    if d is not None:
                        self.assertTrue(tt.same(cell["diff"], v.mean() - rest.mean(), rel=1e-9))
                        self.assertTrue(tt.same(cell["diff_ci95"][0], d[0], rel=1e-9), (term, value, metric))
                        self.assertTrue(tt.same(cell["diff_ci95"][1], d[1], rel=1e-9))
                    line = [x for x in lines if x["by"] == term and x["group"] == g["value"] and x["metric"] == metric]
                    self.assertEqual(len(line), 1)
                    self.assertTrue(tt.same(float(line[0]["mean"]), v.mean(), rel=1e-12))
        # The human-readable reports carry each table.
        summary = text(os.path.join(self.out1, "summary.md"))
        html = text(os.path.join(self.out1, "report.html"))
        for term in keys:
            self.assertIn(f"## Groups by {term}", summary)
            self.assertIn(f"<h2>Groups by {term}</h2>", html)

    def test_identical_for_one_and_three_workers_in_random_order(self):
        for name in ("groups.csv", "per_image.csv"):
            self.assertTrue(tt.same_files(self.out1, self.out3, name), name)
        one, three = tt.read_report(self.out1), tt.read_report(self.out3)
        self.assertEqual(one["groups"], three["groups"])
        self.assertEqual(one["slices"], three["slices"])

    def test_components_are_scipys_per_label(self):
        per_image = read_csv(os.path.join(self.out1, "per_image.csv"))
        data = self.rows[1:]
        mask_col = self.rows[0].index("mask")
        checked = 0
        for r in per_image:
            ref = np.array(Image.open(os.path.join(self.root, "set", data[int(r["index"])][mask_col])))
            label = int(r["class"])
            _, n = ndimage.label(ref == label, structure=np.ones((3, 3)))
            self.assertEqual(int(r["components"]), n, r)
            checked += 1
        self.assertEqual(checked, 2 * 240)

    def test_the_reports_slices_equal_tally_slices(self):
        report = tt.read_report(self.out1)["slices"]
        self.assertEqual(report["slices"][0]["slice"], "site=C & size=small")
        # tally slices over the report folder searches the same attributes (per_image.csv has the
        # derived columns) and finds the same, to the bit.
        searched = json.loads(tt.tally("slices", self.out1, "--json").stdout)
        self.assertEqual(report, searched)
        self.assertIn("## Failing slices", text(os.path.join(self.out1, "summary.md")))
        # report.html shows the top slice's worst rows that a worker rendered a thumbnail of.
        html = text(os.path.join(self.out1, "report.html"))
        start = html.index("site=C &amp; size=small: its worst rows")
        strip = html[start:html.index("</div>", start)]
        shown = [int(x.split('"')[0]) for x in strip.split('data-index="')[1:]]
        self.assertGreater(len(shown), 0)
        self.assertTrue(set(shown) <= set(report["slices"][0]["worst_rows"]), shown)

    def test_bad_terms_are_refused_naming_them(self):
        p = tt.tally("run", "--manifest", self.manifest, "--out", os.path.join(self.root, "bad"), "--group-by", "hospital",
                     check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no column 'hospital'", p.stderr)
        self.assertIn("site", p.stderr)
        p = tt.tally("run", "--manifest", self.manifest, "--out", os.path.join(self.root, "bad"), "--group-by",
                     "derived:darkness", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no derived property 'darkness'", p.stderr)


    def test_merge_keeps_groups_and_compare_pairs_them(self):
        header, data = self.rows[0], self.rows[1:]
        folder = os.path.join(self.root, "set")
        # Two halves of the manifest as two jobs, merged: the groups of the whole.
        halves = []
        for k, part in enumerate((data[:120], data[120:])):
            path = os.path.join(folder, f"half{k}.csv")
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows([header] + part)
            halves.append(path)
        # The same rows with worse predictions at site B: paired per group by compare.
        worse = os.path.join(folder, "worse.csv")
        os.makedirs(os.path.join(folder, "pred2"), exist_ok=True)
        rng = np.random.default_rng(9)
        site, pred_col = header.index("site"), header.index("prediction")
        rows2 = []
        for r in data:
            r = list(r)
            src = os.path.join(folder, r[pred_col])
            if r[site] == "B" and os.path.exists(src):
                p = np.array(Image.open(src))
                flip = rng.random(p.shape) < 0.3
                p[flip] = 1 - p[flip]
                r[pred_col] = "pred2/" + os.path.basename(src)
                Image.fromarray(p).save(os.path.join(folder, r[pred_col]))
            rows2.append(r)
        with open(worse, "w", newline="") as f:
            csv.writer(f).writerows([header] + rows2)
        c = tt.Cluster(self, os.path.join(self.root, "cluster"))
        c.start_worker()
        flags = ("--metrics", "dice,iou", "--group-by", TERMS, "--find-slices", "--max-failed-fraction", "1",
                 "--min-group-rows", "30")
        jobs = [c.cli("submit", "--manifest", m, *flags).stdout.strip() for m in halves + [self.manifest, worse]]
        for j in jobs:
            c.wait(j)
        merged = os.path.join(self.root, "merged")
        c.cli("merge", jobs[0], jobs[1], "--out", merged)
        one = tt.read_report(self.out1)
        self.assertEqual(tt.read_report(merged)["groups"], one["groups"])
        self.assertTrue(tt.same_files(merged, self.out1, "groups.csv"))
        compared = os.path.join(self.root, "compared")
        c.cli("compare", jobs[2], jobs[3], "--out", compared)
        with open(os.path.join(compared, "compare.json")) as f:
            groups = {t["by"]: t for t in json.load(f)["groups"]}
        a = {int(r["index"]): float(r["dice"]) for r in read_csv(os.path.join(self.out1, "per_image.csv")) if r["class"] == "1"}
        b = {int(r["index"]): float(r["dice_b"]) for r in read_csv(os.path.join(compared, "compare.csv")) if r["class"] == "1"}
        for g in groups["site"]["groups"]:
            members = [i for i in a if data[i][site] == g["value"] and math.isfinite(a[i]) and math.isfinite(b[i])]
            d = np.array([b[i] - a[i] for i in members])
            cell = g["classes"][0]["dice"]
            self.assertEqual(cell["pairs"], len(members))
            self.assertTrue(tt.same(cell["mean_diff"], d.mean(), rel=1e-9), g["value"])
            if g["value"] == "B":
                self.assertLess(cell["diff_ci95"][1], 0)
            else:
                self.assertEqual(cell["mean_diff"], 0)
        self.assertIn("## Paired by site (A's groups)", text(os.path.join(compared, "compare.md")))


class ModelGroupsTest(unittest.TestCase):
    def test_coco_image_fields_are_groupable(self):
        from test_coco import H, W, blob, perturb, segmentation
        root = tt.tmpdir(self)
        rng = np.random.default_rng(12)
        images, anns, results = [], [], []
        for i in range(12):
            images.append({"id": 100 + i, "file_name": f"{i}.png", "height": H, "width": W, "site": "AB"[i % 2],
                           "exposure": 0.5 * (i % 3), "nested": {"left": "out"}})
            for _ in range(2):
                m = blob(rng)
                anns.append({"id": len(anns) + 1, "image_id": 100 + i, "category_id": 1, "iscrowd": 0,
                             "segmentation": segmentation(rng, m), "area": float(m.sum())})
                results.append({"image_id": 100 + i, "category_id": 1, "score": float(rng.random()),
                                "segmentation": segmentation(rng, perturb(rng, m) if i % 2 else blob(rng))})
        with open(os.path.join(root, "gt.json"), "w") as f:
            json.dump({"images": images, "categories": [{"id": 1, "name": "cell"}], "annotations": anns}, f)
        with open(os.path.join(root, "results.json"), "w") as f:
            json.dump(results, f)
        out = os.path.join(root, "out")
        tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--coco-results",
                 os.path.join(root, "results.json"), "--out", out, "--group-by", "site,exposure,width", "--metrics", "dice")
        report = tt.read_report(out)
        tables = {t["by"]: t for t in report["groups"]["tables"]}
        self.assertEqual({g["value"]: g["rows"] for g in tables["site"]["groups"]}, {"A": 6, "B": 6})
        self.assertEqual({g["value"]: g["rows"] for g in tables["exposure"]["groups"]}, {"0.0": 4, "0.5": 4, "1.0": 4})  # Numbers as written.
        self.assertEqual({g["value"]: g["rows"] for g in tables["width"]["groups"]}, {str(W): 12})
        dice = {int(r["index"]): float(r["dice"]) for r in read_csv(os.path.join(out, "per_image.csv")) if r["class"] == "1"}
        for g in tables["site"]["groups"]:
            v = np.array([dice[i] for i in range(12) if "AB"[i % 2] == g["value"] and math.isfinite(dice[i])])
            self.assertEqual(g["classes"][0]["class"], "1")
            self.assertTrue(tt.same(g["classes"][0]["dice"]["mean"], v.mean(), rel=1e-12))
        p = tt.tally("run", "--coco", os.path.join(root, "gt.json"), "--images", root, "--coco-results",
                     os.path.join(root, "results.json"), "--out", os.path.join(root, "bad"), "--group-by", "nested",
                     check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no column 'nested'", p.stderr)

    def test_dicom_attributes_are_groupable(self):
        from pydicom import dcmread
        from test_formats import dicom
        root = tt.tmpdir(self)
        rng = np.random.default_rng(4)
        lines = ["id,image,mask"]
        for i in range(16):
            stored = rng.integers(0, 4096, (12, 10))
            path = os.path.join(root, f"d{i}.dcm")
            dicom(path, stored, center=2048, width=4096)
            ds = dcmread(path)
            if i % 4 != 3:  # Every fourth image has no Manufacturer: "(none)".
                ds.Manufacturer = "ACME" if i % 2 == 0 else "Other Co"
            ds.SliceThickness = "1.5" if i < 8 else "3"
            ds.save_as(path)
            Image.fromarray((rng.random((12, 10)) < 0.5).astype(np.uint8)).save(os.path.join(root, f"m{i}.png"))
            lines.append(f"d{i},d{i}.dcm,m{i}.png")
        manifest = tt.write_manifest(root, lines)
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("red_vs_rest.pt"), manifest, out, "--group-by", "dicom:Manufacturer,dicom:SliceThickness",
                     "--metrics", "dice")
        tables = {t["by"]: t for t in tt.read_report(out)["groups"]["tables"]}
        rows = {g["value"]: g["rows"] for g in tables["dicom:Manufacturer"]["groups"]}
        self.assertEqual(rows, {"ACME": 8, "Other Co": 4, "(none)": 4})
        self.assertEqual({g["value"]: g["rows"] for g in tables["dicom:SliceThickness"]["groups"]}, {"1.5": 8, "3": 8})
        dice = {int(r["index"]): float(r["dice"]) for r in read_csv(os.path.join(out, "per_image.csv")) if r["class"] == "1"}
        acme = np.array([dice[i] for i in range(16) if i % 2 == 0 and i % 4 != 3 and math.isfinite(dice[i])])
        g = [g for g in tables["dicom:Manufacturer"]["groups"] if g["value"] == "ACME"][0]
        self.assertTrue(tt.same(g["classes"][0]["dice"]["mean"], acme.mean(), rel=1e-12))
        p = tt.tally("run", "--manifest", manifest, "--out", os.path.join(root, "bad"), "--group-by", "dicom:Maker",
                     check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("'Maker' is not a DICOM attribute keyword", p.stderr)

    def test_a_shard_samples_json_fields_are_groupable(self):
        from test_shards import write_shards
        root = tt.tmpdir(self)
        rng = np.random.default_rng(8)
        pairs = [(rng.integers(0, 3, (10, 12)), rng.integers(0, 3, (10, 12))) for _ in range(24)]
        tt.write_pairs(root, pairs)
        rows = [(f"p{i:04d}", os.path.join(root, "img", f"p{i:04d}.png"), os.path.join(root, "msk", f"p{i:04d}.png"))
                for i in range(24)]
        write_shards(os.path.join(root, "shards"), rows, 6)  # Each sample's JSON: {"prompt": "cells", "n": i % 6}.
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("echo4.pt"), "", out, "--shards", os.path.join(root, "shards", "train-{000000..000003}.tar"),
                     "--group-by", "n,prompt", "--metrics", "dice")
        per_image = [r for r in read_csv(os.path.join(out, "per_image.csv")) if r["class"] == "1"]
        tables = {t["by"]: t for t in tt.read_report(out)["groups"]["tables"]}
        self.assertEqual([g["value"] for g in tables["prompt"]["groups"]], ["cells"])
        self.assertEqual([g["value"] for g in tables["n"]["groups"]], [str(k) for k in range(6)])
        for g in tables["n"]["groups"]:
            v = np.array([float(r["dice"]) for r in per_image if r["id"] == f"p{int(r['index']):04d}" and
                          int(r["index"]) % 6 == int(g["value"]) and r["dice"] != "nan"])
            self.assertEqual(g["rows"], 4)
            self.assertGreater(len(v), 0)
            self.assertTrue(tt.same(g["classes"][0]["dice"]["mean"], v.mean(), rel=1e-12))

    def test_mean_intensity_is_the_images_mean_byte(self):
        root = tt.tmpdir(self)
        rng = np.random.default_rng(3)
        pairs = [(rng.integers(0, 4, (12, 16)), rng.integers(0, 4, (12, 16))) for _ in range(20)]
        manifest = tt.write_pairs(root, pairs)
        out = os.path.join(root, "out")
        tt.tally_run(tt.fixture("echo4.pt"), manifest, out, "--group-by", "derived:mean_intensity:2,derived:components")
        rows = read_csv(os.path.join(out, "per_image.csv"))
        for r in rows:
            img = np.array(Image.open(os.path.join(root, "img", f"p{int(r['index']):04d}.png")).convert("RGB"))
            self.assertTrue(tt.same(float(r["mean_intensity"]), img.astype(np.float64).mean(), rel=1e-12))
            ref = np.array(Image.open(os.path.join(root, "msk", f"p{int(r['index']):04d}.png")))
            _, n = ndimage.label(ref == int(r["class"]), structure=np.ones((3, 3)))
            self.assertEqual(int(r["components"]), n)
        tables = {t["by"]: t for t in tt.read_report(out)["groups"]["tables"]}
        self.assertEqual(sum(g["rows"] for g in tables["derived:mean_intensity:2"]["groups"]), 20)
        # Rows the prediction store answers (no model run) are measured as those the model ran on.
        store = os.path.join(root, "store")
        for k in range(2):
            o = os.path.join(root, f"stored{k}")
            tt.tally_run(tt.fixture("echo4.pt"), manifest, o, "--group-by", "derived:mean_intensity:2,derived:components",
                         "--prediction-store", store)
            self.assertEqual(tt.read_report(o)["rows_from_store"], 20 * k)
            self.assertTrue(tt.same_files(out, o, "per_image.csv"))
            self.assertTrue(tt.same_files(out, o, "groups.csv"))


if __name__ == "__main__":
    unittest.main()
