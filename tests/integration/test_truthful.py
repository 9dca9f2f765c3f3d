"""Every report tells the truth: for each kind of job (model, prediction 2D and 3D, volume
model, instance, panoptic, referring, lesion, sampled, stopped early, partial, cancelled) summary.md
and report.html state the rows that were and were not evaluated exactly as report.json counts them,
never "every manifest row was evaluated" when one was not, and show the inputs and settings that
apply to the kind (and only those): spacing per volume, sliding window, annotation and results
files with their hashes, category names, Pr@t and the threshold sweep, lesion tables without
background. Also the errors and client behaviour the issue lists: a Python model whose interpreter
lacks numpy, --until-ci that is not reached, usage errors (exit 2) before anything starts, `tally
wait` through a tallyd restart."""
import html as htmllib
import json
import os
import re
import subprocess
import time
import unittest

import numpy as np

import tallytest as tt
import test_coco as tc
import test_coco_jobs as tcj
import test_panoptic as tpan
import test_predictions as tpred
import test_python_backend as tpy
import test_volumes as tvol

PY = "/usr/bin/python3"
DEMO = os.path.join(tt.SRC, "examples", "demo")


def read_text(out, name):
    with open(os.path.join(out, name), encoding="utf-8") as f:
        return f.read()


def html_text(out):
    """report.html as text: tags dropped, entities decoded, white space collapsed."""
    text = re.sub(r"<[^>]+>", " ", read_text(out, "report.html"))
    return re.sub(r"\s+", " ", htmllib.unescape(text))


def f32(*values):
    return tuple(float(np.float32(v)) for v in values)


def flat(text):
    return re.sub(r"\s+", " ", text.replace("`", "").replace("**", ""))


class Reports:
    """The three files of one job's report."""

    def __init__(self, out):
        self.out = out
        self.json = tt.read_report(out)
        self.md = read_text(out, "summary.md")
        self.md_flat = flat(self.md)
        self.html = read_text(out, "report.html")
        self.html_flat = html_text(out)


def check_rows_statements(test, r, what):
    """The "Rows" fact and the failures section agree with report.json's counts."""
    j = r.json
    total, ev, failed = j["images_total"], j["images_evaluated"], j["images_failed"]
    left = total - ev - failed
    self_stated = f"Rows: {total} in the manifest: {ev} evaluated, {failed} failed"
    if left:
        self_stated += f", {left} not evaluated ("
        test.assertEqual(j.get("images_not_evaluated", 0) + j.get("images_missing", 0), left, what)
    for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat)):
        test.assertIn(self_stated, text, (what, name))
        everything = "None: every manifest row was evaluated."
        if left == 0 and failed == 0:
            test.assertIn(everything, text, (what, name))
        else:
            test.assertNotIn(everything, text, (what, name))
        if left and failed == 0:
            test.assertIn(f"None of the {ev} evaluated rows failed; {left} of the manifest's {total} rows were not "
                          "evaluated", text, (what, name))


def check_inputs(test, r, what, model=None, manifest=None, annotations=None, results=None):
    """The provenance names the files the job read, with their SHA-256, and nothing it did not."""
    for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat)):
        for label, path in (("Model", model), ("Manifest", manifest), ("Annotations", annotations),
                            ("Results", results)):
            if path:
                test.assertIn(f"{label}: {path} (sha256 {tt.sha256_file(path)})", text, (what, name, label))
            else:
                test.assertNotIn(f"{label}: ", text, (what, name, label))
        test.assertNotIn("sha256 -", text, (what, name))
        test.assertNotIn("Model: (", text, (what, name))


class JobKindsTest(unittest.TestCase):
    """One cluster, one job of each kind; each report checked against its report.json."""

    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-truthful-")
        cls.cluster = tt.Cluster(cls, os.path.join(cls.root, "c"))
        cls.cluster.start_worker()
        cls.cluster.start_worker()
        cls.jobs = {}
        cls.inputs = {}
        cls.submit_all()
        cls.reports = {}
        for kind, job in cls.jobs.items():
            state = cls.cluster.wait(job, timeout=600)["state"]
            assert state == "succeeded", (kind, state)
            out = os.path.join(cls.root, "out-" + kind)
            cls.cluster.fetch(job, out)
            cls.reports[kind] = Reports(out)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    # unittest calls these on the class: Cluster only needs addCleanup and a name.
    @classmethod
    def addCleanup(cls, *args, **kwargs):
        pass

    def status(self, job):
        return json.loads(self.cluster.cli("status", job, "--json").stdout)

    @classmethod
    def submit(cls, kind, *args):
        cls.jobs[kind] = cls.cluster.cli("submit", *args).stdout.strip()

    @classmethod
    def submit_all(cls):
        root = cls.root
        model, manifest = os.path.join(DEMO, "model.pt"), os.path.join(DEMO, "manifest.csv")
        cls.submit("model", "--model", model, "--manifest", manifest, "--metrics", "dice,iou,hd95")
        cls.submit("sampled", "--model", model, "--manifest", manifest, "--sample", "30%")
        # 2D predictions: the demo model's own, written as PNGs.
        import shutil
        shutil.copytree(DEMO, os.path.join(root, "pred2d"))
        pred2d, _ = tt.write_prediction_manifest(model, os.path.join(root, "pred2d", "manifest.csv"),
                                                 os.path.join(root, "pred2d"))
        cls.inputs["pred2d"] = pred2d
        cls.submit("pred2d", "--manifest", pred2d, "--num-classes", "3")
        # 400 rows of predictions for --until-ci (stops) and a --until-ci it cannot reach.
        rng = np.random.default_rng(48)
        big = os.path.join(root, "big")
        os.makedirs(big)
        rows = ["id,mask,prediction"]
        from PIL import Image
        for i in range(400):
            ref = tt.blob_mask(rng, 12, 12, 2)
            pred = ref.copy() if i % 9 else np.zeros_like(ref)
            pred[rng.random(ref.shape) < 0.05] = 1
            Image.fromarray(ref).save(os.path.join(big, f"r{i}.png"))
            Image.fromarray(pred).save(os.path.join(big, f"p{i}.png"))
            rows.append(f"c{i},r{i}.png,p{i}.png")
        big_manifest = tt.write_manifest(big, rows)
        cls.inputs["big"] = big_manifest
        cls.submit("stopped", "--manifest", big_manifest, "--num-classes", "2", "--until-ci", "0.06",
                   "--min-rows", "40", "--shard-size", "4")
        cls.submit("not_reached", "--manifest", big_manifest, "--num-classes", "2", "--until-ci", "0.0001",
                   "--min-rows", "10", "--shard-size", "8")
        # 3D predictions with the header's spacing (zooms x, y, z = 0.8, 0.8, 2.0), lesion metrics too.
        vol = os.path.join(root, "vol")
        os.makedirs(vol)
        rows = []
        for i in range(6):
            ref = tpred.random_volume(rng, (14, 12, 10), 3)
            ref[2:6, 2:6, 2:5] = 1  # Every volume holds class 1.
            pred = tpred.perturb(rng, ref, 3)
            zooms = (0.8, 0.8, 2.0) if i < 4 else (1.0, 1.0, 1.5)
            mp, pp = os.path.join(vol, f"r{i}.nii.gz"), os.path.join(vol, f"p{i}.nii.gz")
            tpred.save(mp, ref, zooms, np.uint8)
            tpred.save(pp, pred, zooms, np.uint8)
            rows.append([f"v{i}", mp, pp])
        vol_manifest = tpred.write_manifest(os.path.join(vol, "m.csv"), rows)
        cls.inputs["pred3d"] = vol_manifest
        cls.submit("pred3d", "--manifest", vol_manifest, "--num-classes", "3", "--metrics", "dice,hd95")
        cls.submit("lesion", "--manifest", vol_manifest, "--num-classes", "3", "--metrics", "dice,lesion")
        # A volume model with a sliding window.
        vm = os.path.join(root, "vm")
        os.makedirs(vm)
        vm_manifest, _ = tvol.VolumeModelTest.make_set(None, vm, rng, n=4)
        import torch
        torch.manual_seed(7)
        net_path = os.path.join(vm, "net3d.pt")
        torch.jit.script(tvol.Net3D().eval()).save(net_path)
        cls.inputs["volume"] = (net_path, vm_manifest)
        cls.submit("volume", "--model", net_path, "--manifest", vm_manifest, "--sliding-window", "8,6,7",
                   "--overlap", "0.25", "--sw-batch-size", "2", "--intensity", "zscore", "--metrics", "dice,hd95")
        # COCO instances from a results file.
        inst = os.path.join(root, "inst")
        os.makedirs(inst)
        images, cats, gts, dts = tcj.merged_case(np.random.default_rng(301), 2)
        tc.write_case(inst, np.random.default_rng(302), images, cats, gts, dts)
        tcj.write_images(inst, images)
        cls.inputs["instance"] = (os.path.join(inst, "gt.json"), os.path.join(inst, "results.json"))
        cls.submit("instance", "--coco", os.path.join(inst, "gt.json"), "--images", inst, "--coco-results",
                   os.path.join(inst, "results.json"), "--max-failed-fraction", "1")
        # Panoptic.
        pan = os.path.join(root, "pan")
        tpan.write_set(pan, np.random.default_rng(303), 4, [(1, True), (2, True), (3, False)])
        cls.inputs["panoptic"] = pan
        cls.submit("panoptic", "--coco-panoptic", os.path.join(pan, "gt.json"), "--panoptic-dir",
                   os.path.join(pan, "gt"), "--panoptic-predictions", os.path.join(pan, "pred.json"),
                   "--panoptic-predictions-dir", os.path.join(pan, "pred"), "--max-failed-fraction", "1")
        # A referring set (a prompt per row) through a Python model, with Pr@t and a threshold sweep.
        refer = os.path.join(root, "refer")
        refer_manifest, _ = tpy.write_referring_set(refer, np.random.default_rng(304))
        prompt_model = os.path.join(tt.SRC, "examples", "python-model", "prompt_model.py")
        cls.inputs["referring"] = (prompt_model, refer_manifest)
        cls.submit("referring", "--model", prompt_model, "--python", PY, "--manifest", refer_manifest,
                   "--iou-thresholds", "0.5,0.7,0.9", "--thresholds", "0.3,0.5,0.7", "--empty-score", "one")

    def test_rows_are_stated_as_report_json_counts_them(self):
        for kind, r in self.reports.items():
            with self.subTest(kind=kind):
                check_rows_statements(self, r, kind)

    def test_inputs_with_their_hashes_and_nothing_else(self):
        model, manifest = os.path.join(DEMO, "model.pt"), os.path.join(DEMO, "manifest.csv")
        check_inputs(self, self.reports["model"], "model", model=model, manifest=manifest)
        check_inputs(self, self.reports["pred2d"], "pred2d", manifest=self.inputs["pred2d"])
        check_inputs(self, self.reports["pred3d"], "pred3d", manifest=self.inputs["pred3d"])
        net, vm_manifest = self.inputs["volume"]
        check_inputs(self, self.reports["volume"], "volume", model=net, manifest=vm_manifest)
        gt, results = self.inputs["instance"]
        r = self.reports["instance"]
        check_inputs(self, r, "instance", annotations=gt, results=results)
        self.assertEqual(r.json["provenance"]["annotations_sha256"], tt.sha256_file(gt))
        self.assertEqual(r.json["provenance"]["results_sha256"], tt.sha256_file(results))
        for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat)):
            self.assertIn("Predictions: the manifest's prediction column", self.reports["pred2d"].md_flat)
            self.assertNotIn("Predictions:", text, name)

    def test_sampled_and_stopped_jobs_say_why_rows_were_not_evaluated(self):
        r = self.reports["sampled"]
        self.assertEqual((r.json["images_evaluated"], r.json["images_not_evaluated"]), (15, 33))
        for text in (r.md_flat, r.html_flat):
            self.assertRegex(text, r"33 not evaluated \(sampled: 15 of 48 rows \(--sample 30% --order random:\d+\)\)")
        self.assertIn("uniform random sample without replacement", r.json["dice_mean_ci95_method"])
        r = self.reports["stopped"]
        n = r.json["images_evaluated"]
        self.assertTrue(40 <= n < 400, n)
        self.assertTrue(r.json["until_ci"]["reached"])
        self.assertIn("--until-ci 0.06 reached: widest foreground Dice half-width", r.json["until_ci"]["note"])
        for text in (r.md_flat, r.html_flat):
            self.assertIn("Until CI: --until-ci 0.06 reached", text)
            self.assertRegex(text, r"until ci \W*--until-ci 0.06 --min-rows \d+")  # The settings table's row.
            self.assertRegex(text, rf"{400 - n} not evaluated \(sampled: {n} of 400 rows \(--until-ci 0.06 reached; "
                                   r"--order random:\d+\)\)")
        lo, hi = r.json["classes"][1]["dice_mean_ci95"]
        self.assertLessEqual((hi - lo) / 2, 0.06 + 1e-12)
        # Every row evaluated without reaching the width: said in the report and in status.
        r = self.reports["not_reached"]
        self.assertEqual(r.json["images_evaluated"], 400)
        self.assertFalse(r.json["until_ci"]["reached"])
        note = r.json["until_ci"]["note"]
        self.assertTrue(note.startswith("--until-ci 0.0001 not reached: every row was evaluated"), note)
        self.assertIn("Until CI: " + note, r.md_flat)
        # One interval rule: the note quotes the table's widest foreground half-width, over every row.
        for key in ("not_reached", "stopped"):
            j = self.reports[key].json
            halves = [((c["dice_mean_ci95"][1] - c["dice_mean_ci95"][0]) / 2, c["class"]) for c in j["classes"]
                      if c["in_foreground_mean"] and c["dice_mean_ci95"] is not None]
            widest, k = max(halves)
            self.assertIn(f"widest foreground Dice half-width {widest:.4g} (class {k})", j["until_ci"]["note"], key)
            self.assertIn(f"{j['images_evaluated'] + j['images_failed']} rows", j["until_ci"]["note"], key)
        status = self.cluster.cli("status", self.jobs["not_reached"]).stdout
        self.assertIn("--until-ci 0.0001 not reached", status)

    def test_volume_jobs_report_their_spacing_and_how_predictions_were_made(self):
        for kind in ("pred3d", "lesion"):
            j = self.reports[kind].json
            self.assertIsNone(j["spacing"], kind)
            self.assertEqual(j["spacing_source"], "header")
            # NIfTI stores zooms as float32: the distances used those values, and the report says so.
            self.assertEqual(sorted((tuple(s["spacing"]), s["rows"]) for s in j["spacings"]),
                             [(f32(1.5, 1.0, 1.0), 2), (f32(2.0, 0.8, 0.8), 4)], kind)
            for key in ("channels_last", "decode", "input_size", "precision"):
                self.assertNotIn(key, j, (kind, key))
            text = self.reports[kind].md_flat
            self.assertIn("Spacing: each volume's header (z,y,x): ", text, kind)
            self.assertIn("2,0.8,0.8 in 4 volumes", text, kind)
            self.assertNotIn("spacing 1,1", text, kind)
        r = self.reports["volume"]
        j = r.json
        self.assertEqual(j["sliding_window"], [8, 6, 7])
        self.assertEqual((j["overlap"], j["sw_batch_size"], j["intensity"]), (0.25, 2, "zscore"))
        self.assertIsNone(j["spacing"])
        self.assertEqual(sorted((tuple(s["spacing"]), s["rows"]) for s in j["spacings"]),
                         [(f32(1.0, 1.0, 1.0), 2), (f32(2.5, 1.1, 0.9), 2)])
        for key in ("channels_last", "decode", "input_size"):
            self.assertNotIn(key, j, key)
        for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat)):
            self.assertIn("sliding window | 8,6,7 (z,y,x), overlap 0.25, 2 windows a batch"
                          if name == "summary.md" else "sliding window 8,6,7 (z,y,x), overlap 0.25, 2 windows a batch",
                          text, name)
            self.assertIn("intensity | zscore" if name == "summary.md" else "intensity zscore", text, name)
            for setting in ("channels last", "JPEG decoding", "input size"):
                self.assertNotIn(setting, text, (name, setting))
        self.assertIn("channels last", self.reports["model"].md)
        # 2D model jobs keep theirs.
        self.assertIn("channels_last", self.reports["model"].json)
        self.assertNotIn("sliding_window", self.reports["model"].json)

    def test_lesion_reports_leave_background_out_and_span_zero_to_one(self):
        r = self.reports["lesion"]
        background = r.json["classes"][0]
        values = [k for k in background if k.startswith("lesion_") and k.endswith(("_mean", "_global"))]
        self.assertGreater(len(values), 6)
        for key in values:
            self.assertIsNone(background[key], key)
        # Its own table, foreground rows only.
        table = r.md[r.md.index("## Lesions"):]
        table = table[:table.index("\n\n", table.index("|"))]
        self.assertNotIn("background", table)
        self.assertIn("| 1 |", table)
        self.assertNotRegex(r.html, r'aria-label="per-image lesion_\w+ histogram, class 0')
        for m in ("lesion_dice", "lesion_f1"):
            m_html = re.search(r'aria-label="per-image ' + m + r' histogram, class 1".*?</svg>', r.html, re.S)
            self.assertIsNotNone(m_html, m)
            self.assertRegex(m_html.group(0), r">1(\.0+)?</text>", m)  # The axis ends at 1.
        # The class table stays narrow: no lesion columns in it.
        first = r.md[r.md.index("| class |"):].splitlines()[0]
        self.assertNotIn("lesion", first)

    def test_instance_reports_name_categories_and_show_curves_whole(self):
        r = self.reports["instance"]
        with open(self.inputs["instance"][0]) as f:
            cats = {c["id"]: c["name"] for c in json.load(f)["categories"]}
        for cid, name in cats.items():
            self.assertIn(f"{cid} {name}", r.md_flat)
            self.assertIn(f"{cid} {name}", r.html_flat)
        # No thumbnail legend where there are no thumbnails.
        if "<figure" not in r.html:
            self.assertNotIn("prediction only (false positive)", r.html)
        # PR curves: the title on two lines (AP50 and AP75 both whole); 0.5 drawn over 0.75, dashed.
        self.assertIn("AP50", r.html)
        self.assertIn("AP75", r.html)
        self.assertRegex(r.html, r"stroke-dasharray")
        # The terminal summary (Job.summary, what `tally run` prints) has the per-category AP table.
        summary = self.status(self.jobs["instance"])["summary"]
        for cid, name in cats.items():
            self.assertIn(f"{cid} {name}", summary)

    def test_panoptic_reports_name_their_files(self):
        r = self.reports["panoptic"]
        pan = self.inputs["panoptic"]
        for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat)):
            self.assertIn(f"Reference: {os.path.join(pan, 'gt.json')} (PNGs in {os.path.join(pan, 'gt')}; sha256 "
                          f"{tt.sha256_file(os.path.join(pan, 'gt.json'))})", text, name)
            self.assertIn(f"Predictions: {os.path.join(pan, 'pred.json')}", text, name)
            self.assertNotIn("Model:", text, name)

    def test_referring_reports_show_pr_at_t_and_the_sweep_everywhere(self):
        r = self.reports["referring"]
        fg = r.json["classes"][1]
        summary = self.status(self.jobs["referring"])["summary"]
        for t in ("0.5", "0.7", "0.9"):
            value = "%.4f" % fg["iou_ge_" + t]
            for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat), ("CLI", flat(summary))):
                self.assertIn("Pr@" + t, text, (name, t))
                self.assertIn(value, text, (name, t))
        best = r.json["best_threshold"]
        for name, text in (("summary.md", r.md_flat), ("report.html", r.html_flat), ("CLI", flat(summary))):
            self.assertIn("threshold", text.lower(), name)
            for row in r.json["thresholds"]:
                self.assertIn("%.4f" % row["dice_mean"], text, (name, row["threshold"]))
        self.assertIn(best, [row["threshold"] for row in r.json["thresholds"]])

    def test_three_throughputs_each_named(self):
        r = self.reports["model"]
        t = r.json["throughput"]
        self.assertEqual(set(t), {"since_submission_rows_per_second", "since_submission_seconds",
                                  "since_first_lease_rows_per_second", "since_first_lease_seconds",
                                  "workers_rows_per_second"})
        self.assertTrue(tt.same(t["since_submission_rows_per_second"], r.json["images_per_second"], 1e-9))
        rows = r.json["images_evaluated"] + r.json["images_failed"]
        self.assertTrue(tt.same(t["since_first_lease_rows_per_second"] * t["since_first_lease_seconds"], rows, 1e-6))
        for text in (r.md_flat, r.html_flat):
            self.assertIn("rows/s from submission to the last result", text)
            self.assertIn("rows/s from the first row leased", text)
            self.assertIn("rows/s summed over the workers' own rates while evaluating", text)

    def test_interval_statements_match_the_interval_kind(self):
        for kind, r in self.reports.items():
            if r.json.get("panoptic") or kind == "instance":
                continue
            with self.subTest(kind=kind):
                method = r.json["dice_mean_ci95_method"]
                self.assertEqual(r.json["dice_mean_ci95_min_rows"], 10)
                if r.json.get("sampled"):
                    self.assertIn("uniform random sample", method)
                else:
                    self.assertIn("the images these rows are drawn from", method)
                for c in r.json["classes"]:
                    if c["images"] < 10:  # No interval: null (docs/reports.md), not a pair of nulls.
                        self.assertIsNone(c["dice_mean_ci95"], (kind, c["class"]))
                        continue
                    lo, hi = c["dice_mean_ci95"]
                    if c.get("dice_mean") is not None and kind != "stopped":
                        self.assertLessEqual(lo, c["dice_mean"])
                        self.assertGreaterEqual(hi, c["dice_mean"])
                    elif c.get("dice_mean") is not None:
                        # The betting interval rejects every mean its wealth ever reached 1/alpha for as the
                        # rows came (metrics/bounded_mean.h), so it need not hold the final sample mean; a
                        # stopped job's rows depend on timing, and one CI run had the mean 0.005 below lo.
                        # It is near it.
                        width = hi - lo
                        self.assertLessEqual(lo, hi)
                        self.assertLessEqual(lo - width, c["dice_mean"])
                        self.assertGreaterEqual(hi + width, c["dice_mean"])


class EndedEarlyTest(unittest.TestCase):
    def test_partial_and_cancelled_reports_say_what_is_missing(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker(env={"TALLY_TEST_THROTTLE_MS": "150"})
        manifest = os.path.join(DEMO, "manifest.csv")
        model = os.path.join(DEMO, "model.pt")
        job = c.submit(model, manifest, "--shard-size", "4")
        c.wait_for_progress(job, 0.2)
        # A report of a running job without --partial says how to get one.
        p = c.cli("report", job, "--out", os.path.join(root, "nope"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--partial", p.stderr)
        out = os.path.join(root, "partial")
        c.cli("report", job, "--partial", "--out", out)
        r = Reports(out)
        check_rows_statements(self, r, "partial")
        self.assertIn("(the job is still running: a partial report)", r.md_flat)
        # Manifest order: the first rows are no random sample: no interval, and the reason given.
        self.assertIn("not a random sample", r.json["dice_mean_ci95_method"])
        for cl in r.json["classes"]:
            self.assertIsNone(cl["dice_mean_ci95"])
        c.cli("cancel", job)
        c.wait(job)
        out = os.path.join(root, "cancelled")
        c.fetch(job, out)
        r = Reports(out)
        self.assertEqual(r.json["state"], "cancelled")
        check_rows_statements(self, r, "cancelled")
        self.assertIn("(the job was cancelled before them)", r.md_flat)


class ErrorsAndClientTest(unittest.TestCase):
    def test_python_model_without_numpy_names_interpreter_cause_and_log(self):
        root = tt.tmpdir(self)
        # An interpreter without site-packages: numpy is not importable from it.
        bare = os.path.join(root, "bare-python")
        tt.write_text(bare, '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
        os.chmod(bare, 0o755)
        model = os.path.join(tt.SRC, "examples", "python-model", "prompt_model.py")
        manifest, _ = tpy.write_referring_set(os.path.join(root, "refer"), np.random.default_rng(5), n_images=2)
        p = tt.tally_run(model, manifest, os.path.join(root, "out"), "--python", bare, check=False)
        self.assertNotEqual(p.returncode, 0)
        text = p.stdout + p.stderr
        self.assertIn(f"interpreter '{bare}'", text)
        self.assertIn("No module named 'numpy'", text)
        log = re.search(r"its whole output is in the worker's log \(([^)]+)\)", text)
        self.assertIsNotNone(log, text)
        self.assertTrue(os.path.exists(log.group(1)), log.group(1))

    def test_usage_errors_exit_2_before_anything_starts(self):
        root = tt.tmpdir(self)
        out = os.path.join(root, "out")
        manifest = os.path.join(DEMO, "manifest.csv")
        for flags, what in ((["--sample", "0"], "--sample"), (["--until-ci", "2"], "--until-ci"),
                            (["--order", "shuffled"], "--order"), (["--batch-size", "-3"], "batch")):
            p = tt.tally("run", "--model", os.path.join(DEMO, "model.pt"), "--manifest", manifest, "--out", out,
                         *flags, check=False)
            self.assertEqual(p.returncode, 2, (flags, p.stderr))
            self.assertIn(what, p.stderr, flags)
            self.assertNotIn("coordinator at", p.stderr + p.stdout, flags)  # Nothing was started.
            self.assertFalse(os.path.exists(os.path.join(out, ".tally")), flags)

    def test_wait_rides_through_a_tallyd_restart(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker(env={"TALLY_TEST_THROTTLE_MS": "40"})
        job = c.submit(os.path.join(DEMO, "model.pt"), os.path.join(DEMO, "manifest.csv"), "--shard-size", "4")
        waiter = subprocess.Popen([os.path.join(tt.BIN, "tally"), "wait", job, "--server", c.address, "--timeout",
                                   "240"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        c.tallyd.kill()
        c.tallyd.wait()
        time.sleep(2.0)
        c.start_tallyd()
        out, err = waiter.communicate(timeout=300)
        self.assertEqual(waiter.returncode, 0, err)
        self.assertEqual(c.wait(job)["state"], "succeeded")

    def test_wait_and_watch_started_while_tallyd_is_down_wait_for_it(self):
        root = tt.tmpdir(self)
        c = tt.Cluster(self, os.path.join(root, "c"))
        c.start_worker()
        job = c.submit(os.path.join(DEMO, "model.pt"), os.path.join(DEMO, "manifest.csv"))
        self.assertEqual(c.wait(job)["state"], "succeeded")
        c.tallyd.kill()
        c.tallyd.wait()
        waiters = [subprocess.Popen([os.path.join(tt.BIN, "tally"), verb, job, "--server", c.address, "--timeout",
                                     "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for verb in ("wait", "watch")]
        time.sleep(3.0)
        self.assertTrue(all(w.poll() is None for w in waiters))  # Still waiting, not "connection refused".
        c.start_tallyd()
        for verb, w in zip(("wait", "watch"), waiters):
            out, err = w.communicate(timeout=120)
            self.assertEqual(w.returncode, 0, (verb, err))
            self.assertIn("waiting for tallyd", err, verb)
        # A job with a failed row: watch exits 3 and says which row failed and why, not just a count.
        broken = os.path.join(root, "broken.csv")
        tt.write_text(broken, "id,image,mask\n" + "".join(
            f"case_{i:03d},{DEMO}/images/case_{i:03d}.png,{DEMO}/masks/case_{i:03d}.png\n" for i in range(2)) +
            "missing,/nonexistent/missing.png,/nonexistent/missing_mask.png\n")
        failing = c.submit(os.path.join(DEMO, "model.pt"), broken)
        p = tt.tally("watch", failing, "--server", c.address, "--timeout", "120", check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("/nonexistent/missing.png", p.stdout + p.stderr)
        self.assertIn("1 of 3 rows failed", p.stderr)
        # With --timeout and no tallyd at all: the timeout's exit code, after the timeout.
        c.tallyd.kill()
        c.tallyd.wait()
        p = tt.tally("wait", job, "--server", c.address, "--timeout", "2", check=False)
        self.assertEqual(p.returncode, 6, p.stderr)

    def test_folders_whose_masks_carry_a_suffix_say_which_before_anything_starts(self):
        root = tt.tmpdir(self)
        images, masks = os.path.join(root, "images"), os.path.join(root, "masks")
        os.makedirs(images)
        os.makedirs(masks)
        rng = np.random.default_rng(5)
        from PIL import Image
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(os.path.join(images, f"{i:03d}.png"))
            Image.fromarray(np.zeros((8, 8), np.uint8)).save(os.path.join(masks, f"{i:03d}_mask.png"))
        with open(os.path.join(images, "notes.txt"), "w") as f:
            f.write("x")
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(os.path.join(masks, "000.png"))  # One pairs as it is.
        model = os.path.join(DEMO, "model.pt")
        out = os.path.join(root, "out")
        base = ["run", "--model", model, "--images", images, "--masks", masks, "--out", out]
        p = tt.tally(*base, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)  # 1 of 6 pairs: nothing started.
        self.assertIn("the masks look like NAME_mask.png: add --mask-suffix _mask", p.stderr)
        self.assertIn("notes.txt", p.stderr)  # The file that is no image is named.
        self.assertIn("nothing was started", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, ".tally", "tallyd.log")))
        p = tt.tally(*base, "--mask-suffix", "_seg", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("ends in '_seg'", p.stderr)
        self.assertIn("use --mask-suffix _mask", p.stderr)
        p = tt.tally(*base, "--mask-suffix", "_mask", check=False)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_a_compressed_shard_in_random_order_is_a_usage_error_before_anything_starts(self):
        import tarfile
        root = tt.tmpdir(self)
        shard = os.path.join(root, "s.tar.gz")
        with tarfile.open(shard, "w:gz") as t:
            t.add(os.path.join(DEMO, "manifest.csv"), arcname="a.txt")
        out = os.path.join(root, "out")
        p = tt.tally("run", "--model", os.path.join(DEMO, "model.pt"), "--shards", shard, "--order", "random",
                     "--out", out, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("is compressed", p.stderr)
        self.assertNotIn("coordinator at", p.stderr)

    def test_the_rows_chosen_and_the_window_are_recorded_and_a_rerun_draws_the_same_rows(self):
        root = tt.tmpdir(self)
        manifest = os.path.join(DEMO, "manifest.csv")
        model = os.path.join(DEMO, "model.pt")
        first = os.path.join(root, "first")
        tt.tally("run", "--model", model, "--manifest", manifest, "--out", first, "--sample", "12", "--window", "40,400",
                 "--speculate-after", "off")
        j = tt.read_report(first)
        seed = j["order_seed"]
        self.assertRegex(seed, r"^\d+$")
        self.assertEqual((j["order"], j["sample"], j["window"], j["speculate_after"]),
                         ("random", {"rows": 12, "seed": seed}, [40, 400], "off"))
        self.assertIn(f"--order random:{seed}", j["sampled"])
        # The demo's images are 8-bit PNG: the window did not apply, and the report says so.
        # (The demo set holds a few JPEGs too: the formats are counted as the seed drew them.)
        window = [w for w in j["warnings"] if "--window 40,400 applies to 16-bit TIFF and grey DICOM images only: 12 "
                  "evaluated" in w]
        self.assertEqual(len(window), 1, j["warnings"])
        counts = dict((f, int(n)) for f, n in re.findall(r"(PNG|JPEG) \((\d+)\)", window[0]))
        self.assertEqual(sum(counts.values()), 12, window[0])
        self.assertIn("PNG", counts)
        with open(os.path.join(first, "summary.md")) as f:
            md = f.read()
        with open(os.path.join(first, "report.html")) as f:
            html = f.read()
        for text in (f"random, seed {seed} (--order random:{seed})", f"--sample 12, drawn with the order",
                     f"seed {seed}", "40,400 (16-bit TIFF and grey DICOM)"):
            self.assertIn(text, md)
            self.assertIn(text, html)
        again = os.path.join(root, "again")
        tt.tally("run", "--model", model, "--manifest", manifest, "--out", again, "--sample", "12", "--order",
                 f"random:{seed}")
        ids = lambda d: sorted({r["id"] for r in tt.read_per_image(d)})
        self.assertEqual(ids(first), ids(again))


if __name__ == "__main__":
    unittest.main()
