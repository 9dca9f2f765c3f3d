"""tally slices: failing slices of a finished report, against references computed here with numpy and
scipy. A planted slice (site C with small foreground, where the predictions are made to fail) is
found with its rows and effect, Welch's p-values and the Benjamini-Hochberg adjustment equal
scipy's and a hand-written BH over every candidate, and on the same set with its values shuffled
over the rows (no slice planted) the search reports none in at least 95 of 100 seeded shuffles. Derived properties
(the reference's foreground fraction, the predicted / reference ratio) are searched beside the
columns: the small boxes are found as a foreground fraction too."""
import csv
import json
import math
import os
import shutil
import tempfile
import unittest

import numpy as np
from PIL import Image
from scipy import stats

import tallytest as tt


def plant(root, rng, n=400, size=24):
    """n prediction/reference pairs with columns site (A-D), scanner (X, Y), size (small, large: the
    foreground's size) and age (numeric); site C with small foreground fails (70 % of pixels flipped)."""
    os.makedirs(os.path.join(root, "pred"))
    os.makedirs(os.path.join(root, "ref"))
    rows = [["id", "prediction", "mask", "site", "scanner", "size", "age"]]
    for i in range(n):
        site, scanner, small = "ABCD"[i % 4], "XY"[(i // 4) % 2], (i // 8) % 2 == 0
        ref = np.zeros((size, size), np.uint8)
        r = 3 if small else 9
        cy, cx = rng.integers(r, size - r, 2)
        ref[cy - r:cy + r, cx - r:cx + r] = 1
        rate = 0.7 if site == "C" and small else rng.uniform(0, 0.2)
        pred = ref.copy()
        flip = rng.random(ref.shape) < rate
        pred[flip] = 1 - pred[flip]
        Image.fromarray(pred).save(os.path.join(root, "pred", f"p{i:04d}.png"))
        Image.fromarray(ref).save(os.path.join(root, "ref", f"m{i:04d}.png"))
        rows.append([f"case{i:04d}", f"pred/p{i:04d}.png", f"ref/m{i:04d}.png", site, scanner,
                     "small" if small else "large", f"{rng.uniform(20, 80):.3f}"])
    path = os.path.join(root, "manifest.csv")
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path, rows


def dice_by_row(out):
    """Class 1's Dice per row, from per_image.csv."""
    with open(os.path.join(out, "per_image.csv"), newline="") as f:
        return {int(r["index"]): float(r["dice"]) for r in csv.DictReader(f) if r["class"] == "1"}


def counts_by_row(out):
    """Class 1's (tp, fp, fn, tn) per row, from per_image.csv."""
    with open(os.path.join(out, "per_image.csv"), newline="") as f:
        return {int(r["index"]): tuple(int(r[k]) for k in ("tp", "fp", "fn", "tn"))
                for r in csv.DictReader(f) if r["class"] == "1"}


def quantile_bin(values, bins):
    edges = np.quantile(values, np.linspace(0, 1, bins + 1))
    return [str(min(bins, max(1, int(np.searchsorted(edges, a, side="left"))))) for a in values]


def candidates(rows, bins, counts):
    """Every candidate slice as the search defines it: each value of each column (age in `bins`
    quantile bins, an inner edge in the lower bin), of the derived properties (the reference's
    foreground fraction: two values here; the predicted / reference foreground ratio, binned; the
    pixels: one value, not searched), and each pair of values of two of them."""
    header, data = rows[0], rows[1:]
    cols = {h: [r[k] for r in data] for k, h in enumerate(header) if h in ("site", "scanner", "size", "age")}
    cols["age"] = quantile_bin(np.array([float(v) for v in cols["age"]]), bins)
    k = [counts[i] for i in range(len(data))]
    cols["derived:fg_fraction"] = ["%.17g" % ((tp + fn) / (tp + fp + fn + tn)) for tp, fp, fn, tn in k]
    cols["derived:volume_ratio"] = quantile_bin(np.array([(tp + fp) / (tp + fn) for tp, fp, fn, tn in k]), bins)
    names = sorted(cols)
    out = {}
    for a in names:
        for v in set(cols[a]):
            out[((a, v),)] = [i for i in range(len(data)) if cols[a][i] == v]
    for x in range(len(names)):
        for y in range(x + 1, len(names)):
            a, b = names[x], names[y]
            for va in set(cols[a]):
                for vb in set(cols[b]):
                    members = [i for i in range(len(data)) if cols[a][i] == va and cols[b][i] == vb]
                    if members:
                        out[tuple(sorted(((a, va), (b, vb))))] = members
    return out


def bh(p):
    p = np.asarray(p, float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adj = np.empty(m)
    running = 1.0
    for k in range(m - 1, -1, -1):
        running = min(running, p[order[k]] * m / (k + 1))
        adj[order[k]] = min(1.0, running)
    return adj


class SlicesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tally-it-")
        cls.addClassCleanup(shutil.rmtree, cls.root, True)
        cls.manifest, cls.rows = plant(os.path.join(cls.root, "set"), np.random.default_rng(11))
        cls.out = os.path.join(cls.root, "out")
        tt.tally("run", "--manifest", cls.manifest, "--out", cls.out, "--workers", "2", "--metrics", "dice")
        cls.dice = dice_by_row(cls.out)

    def slices(self, *args):
        return json.loads(tt.tally("slices", self.out, "--json", *args).stdout)

    def test_the_planted_slice_is_found_with_its_rows_effect_and_p_values(self):
        found = self.slices("--slice-bins", "2")
        self.assertEqual(found["rows"], 400)
        top = found["slices"][0]
        self.assertEqual(top["slice"], "site=C & size=small")
        # The same rows under another name (the derived foreground fraction of the small boxes: 36 / 576
        # pixels) are folded into it, as are the slices inside a larger significant one and no worse.
        self.assertIn("site=C & derived:fg_fraction=0.0625", top["folded"])
        shown = {s["slice"]: s for s in found["slices"]}
        self.assertEqual(len(shown), 4)
        self.assertIn("site=B & size=small", shown["size=small"]["folded"])
        self.assertIn("derived:fg_fraction=0.0625", shown["size=small"]["folded"])
        self.assertIn("site=C & scanner=X", shown["site=C"]["folded"])
        self.assertTrue(any(n.startswith("derived:volume_ratio (2 quantile bins)=q2") for n in shown))
        planted = [i for i, r in enumerate(self.rows[1:]) if r[3] == "C" and r[5] == "small"]
        values = np.array([self.dice[i] for i in range(400)])
        inside, outside = values[planted], np.delete(values, planted)
        self.assertEqual(top["rows"], len(planted))
        self.assertTrue(tt.same(top["mean_inside"], inside.mean()))
        self.assertTrue(tt.same(top["effect"], inside.mean() - outside.mean()))
        self.assertEqual(top["test"], "welch")
        welch = stats.ttest_ind(inside, outside, equal_var=False, alternative="less")
        self.assertTrue(tt.same(top["p"], welch.pvalue, rel=1e-9) or top["p"] < 1e-200, (top["p"], welch.pvalue))
        # The effect's interval: Welch's, with scipy's t quantile.
        a, b = inside.var(ddof=1) / len(inside), outside.var(ddof=1) / len(outside)
        df = (a + b) ** 2 / (a * a / (len(inside) - 1) + b * b / (len(outside) - 1))
        half = stats.t.ppf(0.975, df) * math.sqrt(a + b)
        self.assertTrue(tt.same(top["effect_lo"], top["effect"] - half, rel=1e-9))
        # Its worst rows are its lowest Dice.
        self.assertEqual(top["worst_rows"], sorted(planted, key=lambda i: (values[i], i))[:5])
        # Benjamini-Hochberg over every candidate tested (all have 30 rows or more: Welch's test).
        cands = candidates(self.rows, 2, counts_by_row(self.out))
        tested = {k: v for k, v in cands.items() if len(v) >= 5 and 400 - len(v) >= 2}
        self.assertEqual(found["tested"], len(tested))
        self.assertTrue(all(len(v) >= 30 for v in tested.values()))
        keys = sorted(tested)
        p = [stats.ttest_ind(values[tested[k]], np.delete(values, tested[k]), equal_var=False,
                             alternative="less").pvalue for k in keys]
        adjusted = dict(zip(keys, bh(p)))
        self.assertEqual(found["significant"], sum(1 for k in keys if adjusted[k] <= 0.05 and
                                                   values[tested[k]].mean() < np.delete(values, tested[k]).mean()))
        for s in found["slices"]:
            key = tuple(sorted((c["attribute"].split(" ")[0], c["value"][1] if "quantile bins" in c["attribute"] else
                                c["value"]) for c in s["conditions"]))
            self.assertTrue(tt.same(s["p_adjusted"], adjusted[key], rel=1e-8) or s["p_adjusted"] < 1e-100,
                            (key, s["p_adjusted"], adjusted[key]))
        # Deterministic.
        self.assertEqual(found, self.slices("--slice-bins", "2"))

    def test_no_slice_on_shuffled_values_in_95_of_100(self):
        # No planted slice: each row's Dice shuffled over the rows (class 1's, the value searched), the
        # columns and the counts the derived properties come from left as they are.
        with open(os.path.join(self.out, "per_image.csv"), newline="") as f:
            lines = list(csv.reader(f))
        dice_col = lines[0].index("dice")
        ones = [k for k, r in enumerate(lines) if k > 0 and r[lines[0].index("class")] == "1"]
        folder = os.path.join(self.root, "shuffled")
        os.makedirs(folder, exist_ok=True)
        shutil.copy(os.path.join(self.out, "report.json"), folder)
        quiet = 0
        for seed in range(100):
            order = np.random.default_rng(1000 + seed).permutation(len(ones))
            shuffled = [list(r) for r in lines]
            for k, src in zip(ones, order):
                shuffled[k][dice_col] = lines[ones[src]][dice_col]
            with open(os.path.join(folder, "per_image.csv"), "w", newline="") as f:
                csv.writer(f).writerows(shuffled)
            quiet += not json.loads(tt.tally("slices", folder, "--json").stdout)["slices"]
        self.assertGreaterEqual(quiet, 95)

    def test_a_job_of_a_tallyd_gives_the_same_slices(self):
        c = tt.Cluster(self, os.path.join(self.root, "cluster"))
        c.start_worker()
        job = c.cli("submit", "--manifest", self.manifest, "--metrics", "dice").stdout.strip()
        self.assertEqual(c.wait(job)["state"], "succeeded")
        remote = json.loads(c.cli("slices", job, "--json").stdout)
        self.assertEqual(remote, self.slices())

    def test_bad_flags_and_folders_are_named(self):
        p = tt.tally("slices", self.out, "--slice-metric", "hd95", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--slice-metric", p.stderr)
        p = tt.tally("slices", os.path.join(self.root, "nowhere"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("report.json", p.stderr)
        empty = os.path.join(self.root, "empty")
        os.makedirs(empty, exist_ok=True)
        p = tt.tally("slices", empty, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("report.json", p.stderr)
        # An index from a hostile per_image.csv is held to the row budget before it sizes anything.
        hostile = os.path.join(self.root, "hostile")
        os.makedirs(hostile, exist_ok=True)
        shutil.copy(os.path.join(self.out, "report.json"), hostile)
        with open(os.path.join(hostile, "per_image.csv"), "w") as f:
            f.write("index,id,image,class,tp,fp,fn,tn,dice,iou\n0,a,a.png,1,1,0,0,1,1,1\n"
                    "999999999999999,b,b.png,1,1,0,0,1,1,1\n")
        p = tt.tally("slices", hostile, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("line 3: index 999999999999999 is past the 50000000 rows", p.stderr)
        text = tt.tally("slices", self.out).stdout
        self.assertIn("Benjamini-Hochberg", text)
        self.assertIn("site=C & size=small", text)


if __name__ == "__main__":
    unittest.main()
