"""tally merge: a set evaluated as several jobs gives, merged, exactly the report one job over the
whole set gives (aggregates, bootstrap interval, per-image rows)."""
import json
import os
import unittest

import numpy as np

import tallytest as tt

# Fields that describe the run rather than the results.
RUN_FIELDS = {"job_id", "name", "manifest", "source", "created_unix", "finished_unix", "wall_seconds",
              "images_per_second", "throughput", "workers", "state", "shard_size", "provenance"}


class MergeTest(unittest.TestCase):
    def test_four_parts_merged_equal_one_job(self):
        root = tt.tmpdir(self)
        data = os.path.join(root, "data")
        manifest = tt.write_dataset(data, np.random.default_rng(11), 400, [(16, 16), (12, 20)], classes=3)
        with open(manifest) as f:
            lines = f.read().splitlines()
        parts = []
        for i in range(4):
            path = os.path.join(data, f"part{i}.csv")
            with open(path, "w") as f:
                f.write("\n".join([lines[0]] + lines[1 + 100 * i:1 + 100 * (i + 1)]) + "\n")
            parts.append(path)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        c.start_worker()
        flags = ["--batch-size", "4", "--metrics", "all", "--thumbnails", "3"]
        whole = c.submit(tt.fixture("three_class.pt"), manifest, *flags)
        part_ids = [c.submit(tt.fixture("three_class.pt"), p, *flags) for p in parts]
        for j in [whole] + part_ids:
            self.assertEqual(c.wait(j, timeout=300)["state"], "succeeded")
        one = os.path.join(root, "one")
        c.fetch(whole, one)
        merged = os.path.join(root, "merged")
        p = c.cli("merge", *part_ids, "--out", merged)
        self.assertIn(os.path.join(merged, "report.json"), p.stdout)
        a, b = tt.read_report(one), tt.read_report(merged)
        self.assertEqual(b["images_total"], 400)
        self.assertEqual({k: v for k, v in a.items() if k not in RUN_FIELDS},
                         {k: v for k, v in b.items() if k not in RUN_FIELDS})
        self.assertEqual(a["classes"][1]["dice_mean_ci95"], b["classes"][1]["dice_mean_ci95"])
        self.assertTrue(tt.same_files(one, merged, "per_image.csv"))
        # --thumbnails 3: three marked rows per class, not three of each part's; the parts' shard size.
        for cl in b["classes"]:
            self.assertLessEqual(sum(1 for w in cl.get("worst", []) if w["thumbnail"]), 3, cl["class"])
        self.assertEqual(sum(1 for w in b["classes"][1]["worst"] if w["thumbnail"]), 3)
        self.assertEqual((a["shard_size"], b["shard_size"]), (8, 8))
        self.assertEqual(b["provenance"]["model_sha256"], a["provenance"]["model_sha256"])
        self.assertEqual(b["provenance"]["manifest_sha256"], "")  # Several manifests.
        # Jobs with different settings do not merge.
        other = c.submit(tt.fixture("three_class.pt"), parts[0], "--batch-size", "4", "--metrics", "dice")
        c.wait(other)
        p = c.cli("merge", part_ids[0], other, "--out", os.path.join(root, "bad"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("their metrics differ", p.stderr)
        # Parts cut into shards of different sizes: the merged report has no one shard size.
        wide = c.submit(tt.fixture("three_class.pt"), parts[1], *flags, "--shard-size", "16")
        c.wait(wide)
        mixed = os.path.join(root, "mixed")
        c.cli("merge", part_ids[0], wide, "--out", mixed)
        self.assertIsNone(tt.read_report(mixed)["shard_size"])
        # The temporary folders are gone once the reports are sent.
        self.assertEqual(os.listdir(os.path.join(c.state, "merged")), [])

    def test_interleaved_parts_merge_to_the_whole_jobs_intervals(self):
        # Rows 0, 4, 8, ... / 1, 5, 9, ...: the merged order is not the manifest's, yet the bootstrap
        # (keyed by row id, exact sums) and every aggregate equal the whole job's.
        root = tt.tmpdir(self)
        data = os.path.join(root, "data")
        manifest = tt.write_dataset(data, np.random.default_rng(12), 300, [(16, 16)], classes=3)
        with open(manifest) as f:
            lines = f.read().splitlines()
        parts = []
        for i in range(4):
            path = os.path.join(data, f"inter{i}.csv")
            with open(path, "w") as f:
                f.write("\n".join([lines[0]] + lines[1 + i::4]) + "\n")
            parts.append(path)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        flags = ["--batch-size", "4", "--metrics", "dice,iou"]
        whole = c.submit(tt.fixture("three_class.pt"), manifest, *flags)
        part_ids = [c.submit(tt.fixture("three_class.pt"), p, *flags) for p in parts]
        for j in [whole] + part_ids:
            self.assertEqual(c.wait(j, timeout=300)["state"], "succeeded")
        one, merged = os.path.join(root, "one"), os.path.join(root, "merged")
        c.fetch(whole, one)
        c.cli("merge", *part_ids, "--out", merged)
        a, b = tt.read_report(one), tt.read_report(merged)
        for ca, cb in zip(a["classes"], b["classes"]):
            for key in ("dice_mean_ci95", "dice_mean", "dice_global", "iou_mean", "iou_global", "tp", "fp", "fn"):
                self.assertEqual(ca[key], cb[key], (ca["class"], key))
        self.assertLess(a["classes"][1]["dice_mean_ci95"][0], a["classes"][1]["dice_mean_ci95"][1])
        self.assertEqual(a["foreground_dice_mean"], b["foreground_dice_mean"])


if __name__ == "__main__":
    unittest.main()


class CompareTest(unittest.TestCase):
    def test_two_runs_paired_against_scipy(self):
        import warnings
        from scipy import stats
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(12), 60, [(16, 16)], classes=3)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        a = c.submit(tt.fixture("three_class.pt"), manifest, "--metrics", "dice,iou,hd95")
        b = c.submit(tt.fixture("three_class.pt"), manifest, "--metrics", "dice,iou", "--input-size", "8x8")
        for j in (a, b):
            self.assertEqual(c.wait(j)["state"], "succeeded")
        ra, rb = os.path.join(root, "a"), os.path.join(root, "b")
        c.fetch(a, ra)
        c.fetch(b, rb)
        out = os.path.join(root, "cmp")
        c.cli("compare", a, b, "--out", out)
        for name in ("compare.json", "compare.csv", "compare.md", "compare.html"):
            self.assertTrue(os.path.exists(os.path.join(out, name)), name)
        with open(os.path.join(out, "compare.json")) as f:
            cmp = json.load(f)
        self.assertEqual((cmp["a"], cmp["b"], cmp["paired_images"]), (a, b, 60))
        rows_a, rows_b = tt.read_per_image(ra), tt.read_per_image(rb)
        for k in (1, 2):
            for metric in ("dice", "iou"):
                pa = {r["index"]: tt.num(r[metric]) for r in rows_a if r["class"] == str(k)}
                pb = {r["index"]: tt.num(r[metric]) for r in rows_b if r["class"] == str(k)}
                pairs = [(pa[i], pb[i]) for i in pa if np.isfinite(pa[i]) and np.isfinite(pb[i])]
                diffs = np.array([y - x for x, y in pairs])
                got = cmp["classes"][k][metric]
                self.assertEqual(got["pairs"], len(pairs))
                self.assertTrue(tt.same(got["mean_diff"], float(np.mean(diffs)), 1e-9))
                self.assertTrue(tt.same(got["mean_a"], float(np.mean([x for x, _ in pairs])), 1e-9))
                self.assertLessEqual(got["diff_ci95"][0], got["mean_diff"])
                self.assertGreaterEqual(got["diff_ci95"][1], got["mean_diff"])
                self.assertEqual(got["b_higher"], int(np.sum(diffs > 0)))
                # What the pairs leave out, by run, and each run's own mean: its report's.
                self.assertEqual(got["defined_only_a"], sum(np.isfinite(pa[i]) and not np.isfinite(pb[i]) for i in pa))
                self.assertEqual(got["defined_only_b"], sum(np.isfinite(pb[i]) and not np.isfinite(pa[i]) for i in pa))
                for run, report_dir in (("a", ra), ("b", rb)):
                    mean = tt.read_report(report_dir)["classes"][k][f"{metric}_mean"]
                    self.assertTrue(tt.same(got[f"own_mean_{run}"], mean, 1e-12), (run, got[f"own_mean_{run}"], mean))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    p = stats.wilcoxon(diffs, zero_method="wilcox", correction=False, method="approx").pvalue
                self.assertTrue(tt.same(got["wilcoxon_p"], float(p), 1e-9), (got["wilcoxon_p"], p))
            changed = cmp["classes"][k]["most_changed"]
            if changed:
                pa = {int(r["index"]): tt.num(r["dice"]) for r in rows_a if r["class"] == str(k)}
                pb = {int(r["index"]): tt.num(r["dice"]) for r in rows_b if r["class"] == str(k)}
                biggest = max(abs(pb[i] - pa[i]) for i in pa if np.isfinite(pa[i]) and np.isfinite(pb[i]))
                self.assertTrue(tt.same(abs(changed[0]["dice_b"] - changed[0]["dice_a"]), biggest, 1e-12))
        # hd95 was selected in A only: it is not compared.
        self.assertNotIn("hd95", cmp["classes"][1])
        with open(os.path.join(out, "compare.md")) as f:
            self.assertIn("Wilcoxon p", f.read())
        # Different manifests do not pair.
        other = tt.write_dataset(os.path.join(root, "other"), np.random.default_rng(13), 10, [(16, 16)], classes=3)
        o = c.submit(tt.fixture("three_class.pt"), other)
        c.wait(o)
        p = c.cli("compare", a, o, "--out", os.path.join(root, "bad"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("compare two runs of the same manifest", p.stderr)


class DuplicateIdsTest(unittest.TestCase):
    """Found by probing: two rows with one id were both evaluated without a word, and joins by id were
    ambiguous. A warning at submission and in the report; compare, merge and --save-predictions refuse."""

    def test_warned_at_submit_and_in_the_report_refused_where_ids_join(self):
        root = tt.tmpdir(self)
        manifest = tt.marked_dataset(os.path.join(root, "data"), 6, set())
        with open(manifest) as f:
            lines = f.read().splitlines()
        # r001 twice more (lines 5 and 7), r000 once more (line 6).
        lines[4] = lines[4].replace("r003,", "r001,")
        lines[5] = lines[5].replace("r004,", "r000,")
        lines[6] = lines[6].replace("r005,", "r001,")
        dup = os.path.join(root, "data", "dup.csv")
        with open(dup, "w") as f:
            f.write("\n".join(lines) + "\n")
        expected = "3 rows repeat the id of an earlier row (2 ids): 'r001' (lines 3, 5, 7), 'r000' (lines 2, 6)"
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        p = c.cli("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", dup)
        self.assertIn(f"tally submit: warning: {expected}", p.stderr)
        a = p.stdout.strip()
        b = c.submit(tt.fixture("red_vs_rest.pt"), manifest)
        ok = c.submit(tt.fixture("red_vs_rest.pt"), manifest)
        for job in (a, b, ok):
            self.assertEqual(c.wait(job)["state"], "succeeded")
        out = os.path.join(root, "a")
        c.fetch(a, out)
        warnings = tt.read_report(out)["warnings"]
        self.assertTrue(any(w.startswith(expected) for w in warnings), warnings)
        self.assertEqual(len(tt.read_per_image(out)), 12)  # Every row evaluated all the same (2 classes).
        # Joins by id refuse, naming the ids.
        for args in (["compare", a, ok], ["compare", ok, a], ["merge", a, ok]):
            p = c.cli(*args, "--out", os.path.join(root, "x"), check=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(expected, p.stderr, args)
        # Two jobs of one manifest share every id: merged, rows would repeat ids.
        p = c.cli("merge", b, ok, "--out", os.path.join(root, "y"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("6 rows repeat an id of another job's row", p.stderr)
        self.assertIn(f"'r000' ({b} line 2, {ok} line 2)", p.stderr)
        self.assertEqual(c.cli("compare", b, ok, "--out", os.path.join(root, "z")).returncode, 0)
        # --save-predictions names files by id: refused at submit, nothing stored.
        p = c.cli("submit", "--model", tt.fixture("red_vs_rest.pt"), "--manifest", dup, "--save-predictions",
                  os.path.join(root, "preds"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--save-predictions writes each prediction as <id>.png, and " + expected, p.stderr)
        self.assertEqual(len(c.cli("jobs").stdout.strip().splitlines()), 4)  # The header and three jobs.

