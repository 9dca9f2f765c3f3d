"""GPU checks, skipped where no NVIDIA GPU is visible or the build has no CUDA: a worker on cuda:0
counts the same as on CPU, the out-of-memory path loses nothing, and two GPUs give the same
report as one."""
import csv
import os
import shutil
import subprocess
import unittest

import numpy as np

import tallytest as tt


def visible_gpus():
    if shutil.which("nvidia-smi") is None:
        return 0
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in p.stdout.splitlines() if line.startswith("GPU "))


GPUS = visible_gpus()


def diff_rows(a, b):
    """(rows that differ, pixels that differ in tp) between two per_image.csv row lists."""
    rows, pixels = 0, 0
    for x, y in zip(a, b):
        if x != y:
            rows += 1
            pixels += abs(int(x["tp"]) - int(y["tp"]))
    return rows, pixels


@unittest.skipIf(GPUS == 0, "no NVIDIA GPU visible")
class GpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-gpu-")
        rng = np.random.default_rng(99)
        cls.manifest = tt.write_dataset(os.path.join(cls.root, "data"), rng, 64, [(96, 128), (96, 128), (61, 77)],
                                        classes=3, jpeg_every=5)
        # These jobs are far too short to repay a layout trial: the tests of the trial run it all
        # the same (a trial cost of 0 s); test_a_short_job_skips_the_layout_trial takes it away.
        os.environ["TALLY_TEST_TRIAL_COST_SECONDS"] = "0"

    @classmethod
    def tearDownClass(cls):
        os.environ.pop("TALLY_TEST_TRIAL_COST_SECONDS", None)
        shutil.rmtree(cls.root, True)

    def test_a_short_job_skips_the_layout_trial(self):
        # With its real cost estimate, a 64-row job of a small network cannot repay the trial: the
        # contiguous layout stays, the report says why, the results are --channels-last off's.
        del os.environ["TALLY_TEST_TRIAL_COST_SECONDS"]
        try:
            short = self.run_on("layout-skipped", "conv3.pt", "--gpus", "0", "--worker-flags=--cache-dir=none")
        finally:
            os.environ["TALLY_TEST_TRIAL_COST_SECONDS"] = "0"
        report = tt.read_report(short)
        self.assertEqual(report["channels_last"], "off", report["channels_last_trial"])
        self.assertRegex(report["channels_last_trial"],
                         r"^skipped: 64 rows at [0-9.]+ ms a row \(batch .*\) could save at most [0-9.]+ s at 30%, "
                         r"less than the trial's [0-9.]+ s \(the other layout's first pass: 2 s at least, or twice "
                         r"the first batch's [0-9.]+ s; 7 passes\)$")
        fixed = self.run_on("layout-skipped-fixed", "conv3.pt", "--gpus", "0", "--channels-last", "off")
        self.assertTrue(tt.same_files(short, fixed))

    def run_on(self, name, model, *extra):
        out = os.path.join(self.root, name)
        p = tt.tally_run(tt.fixture(model), self.manifest, out, "--metrics", "all", "--count-logit-ties", *extra,
                         check=False)
        if p.returncode != 0 and "CPU-only LibTorch" in p.stderr:
            self.skipTest("this build has no CUDA support")
        self.assertEqual(p.returncode, 0, p.stderr)
        return out

    def test_nonfinite_counts_and_throwing_rows_equal_cpu(self):
        # The fused kernel counts NaN logits per image; the CPU path uses torch ops: same numbers.
        data = os.path.join(self.root, "marked")
        os.makedirs(data, exist_ok=True)
        from PIL import Image
        rows = ["image,mask"]
        for i in range(12):
            img = np.zeros((24, 40, 3), np.uint8)
            img[:, :20, 0] = 220
            img[0, 0, 1] = 255 if i in (3, 8) else 40
            Image.fromarray(img).save(os.path.join(data, f"{i}.png"))
            rows.append(f"{i}.png,mask.png")
        Image.fromarray((np.arange(24 * 40).reshape(24, 40) % 2).astype(np.uint8)).save(os.path.join(data, "mask.png"))
        tt.write_manifest(data, rows, "m.csv")
        for model in ("nan_on_mark.pt", "raises_on_mark.pt"):
            outs = {}
            for device, flags in (("cpu", ["--workers", "1"]), ("gpu", ["--gpus", "0"])):
                out = os.path.join(self.root, f"{model}-{device}")
                p = tt.tally_run(tt.fixture(model), os.path.join(data, "m.csv"), out, "--nonfinite", "warn",
                                 "--batch-size", "4", *flags, check=False)
                if p.returncode != 0 and "CPU-only LibTorch" in p.stderr:
                    self.skipTest("this build has no CUDA support")
                self.assertEqual(p.returncode, 0, p.stderr)
                outs[device] = out
            self.assertTrue(tt.same_files(outs["cpu"], outs["gpu"]), model)
            report = tt.read_report(outs["gpu"])
            if model == "nan_on_mark.pt":
                self.assertEqual((report["nonfinite_images"], report["nonfinite_values"]), (2, 2 * 24 * 40 * 2))
            else:
                self.assertEqual(sorted(f["index"] for f in report["failures"]), [3, 8])

    def test_cuda_counts_equal_cpu_counts(self):
        cpu = self.run_on("cpu_three", "three_class.pt", "--workers", "1")
        gpu = self.run_on("gpu_three", "three_class.pt", "--gpus", "0")
        with open(os.path.join(cpu, "per_image.csv"), "rb") as a, open(os.path.join(gpu, "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        report = tt.read_report(gpu)
        self.assertEqual(report["workers"][0]["device"], "cuda:0")
        self.assertTrue(report["workers"][0]["gpu_name"])
        self.assertGreater(report["workers"][0]["peak_memory_bytes"], 0)

    def test_cuda_vs_cpu_on_a_real_convolutional_model(self):
        cpu = self.run_on("cpu_conv", "conv3.pt", "--workers", "1")
        gpu = self.run_on("gpu_conv", "conv3.pt", "--gpus", "0")
        a, b = tt.read_per_image(cpu), tt.read_per_image(gpu)
        total = sum(int(r["tp"]) + int(r["fp"]) + int(r["fn"]) + int(r["tn"]) for r in a if r["class"] == "0")
        rows, pixels = diff_rows(a, b)
        ties = [w["logit_ties"] for w in tt.read_report(gpu)["workers"]] + \
               [w["logit_ties"] for w in tt.read_report(cpu)["workers"]]
        print(f"\nconv3 cpu vs cuda:0: {rows} of {len(a)} rows differ, {pixels} pixels of {total}; "
              f"logit ties gpu/cpu {ties}")
        # TF32/cuDNN and CPU convolutions round differently: a pixel may flip only where the two
        # best logits are within rounding of each other. Allow one in a hundred thousand.
        self.assertLessEqual(pixels, max(1, total // 100000))

    def test_an_exported_package_scores_like_its_torchscript(self):
        # tally export of the TorchScript fixture (torch 2.6+ in python3, else skipped), then the
        # package through the C++ runner: the TorchScript file's scores within rounding, 1 and 2
        # workers identical, 45 rows in batches of 8 (a padded last batch where the export fixed the
        # batch size), and rows of another size failed with the reason instead of read out of bounds.
        py = shutil.which("python3") or "python3"
        v = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
        major_minor = tuple(int(x) for x in v.stdout.strip().split("+")[0].split(".")[:2]) if v.returncode == 0 else (0, 0)
        if major_minor < (2, 6):
            self.skipTest("python3 has no torch 2.6 or newer (tally export)")
        root = os.path.join(self.root, "package")
        rng = np.random.default_rng(7)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 45, [(96, 128)], classes=3)
        package = os.path.join(root, "conv3.pt2")
        p = tt.tally("export", "--model", tt.fixture("conv3.pt"), "--input-size", "96x128", "--batch-size", "8",
                     "--out", package, "--python", py, check=False, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(package))
        outs = {}
        for name, model, extra in (("ts", tt.fixture("conv3.pt"), ["--gpus", "0"]), ("pt2", package, ["--gpus", "0"]),
                                   ("pt2_2w", package, ["--gpus", "0,0"])):
            outs[name] = os.path.join(root, name)
            tt.tally_run(model, manifest, outs[name], "--batch-size", "8", *extra)
        self.assertTrue(tt.same_files(outs["pt2"], outs["pt2_2w"]))
        a, b = tt.read_per_image(outs["ts"]), tt.read_per_image(outs["pt2"])
        self.assertEqual(len(a), len(b))
        total = sum(int(r["tp"]) + int(r["fp"]) + int(r["fn"]) + int(r["tn"]) for r in a if r["class"] == "0")
        rows, pixels = diff_rows(a, b)
        self.assertLessEqual(pixels, max(1, total // 100000))
        mixed = tt.write_dataset(os.path.join(root, "mixed"), rng, 6, [(96, 128), (64, 64)], classes=3)
        out = os.path.join(root, "mixed_out")
        p = tt.tally_run(package, mixed, out, "--batch-size", "8", "--gpus", "0", check=False)
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 3)
        self.assertEqual(sorted(f["index"] for f in report["failures"]), [1, 3, 5])  # The 64x64 rows.
        self.assertTrue(all("was exported for inputs" in f["reason"] for f in report["failures"]), report["failures"])
        p = tt.tally_run(package, manifest, os.path.join(root, "bf16"), "--precision", "bf16", "--gpus", "0", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("was exported with --precision fp32", p.stderr)

    def test_a_compiled_job_saves_its_precompiled_modules_and_the_next_loads_them(self):
        # --compile where python3's torch precompiles (2.10+; the default there): the first job
        # compiles the model's module ahead of its call and saves it, the second loads it (no
        # tracing), and a damaged artifact is refused by its digest and compiled again; all three
        # score every row alike.
        py = shutil.which("python3") or "python3"
        v = subprocess.run([py, "-c", "import torch; print(hasattr(torch.compiler, 'load_compiled_function'))"],
                           capture_output=True, text=True)
        if v.stdout.strip() != "True":
            self.skipTest("python3's torch cannot precompile (torch.compiler.load_compiled_function)")
        root = os.path.join(self.root, "precompiled")
        os.makedirs(root, exist_ok=True)
        model = os.path.join(root, "convnet.py")
        with open(model, "w") as f:
            f.write("""
import numpy as np, torch

class Net(torch.nn.Module):
    # Forty elementwise steps: forty kernels eager, one fused compiled, so the trial keeps compiled.
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 3, 3, padding=1)
    def forward(self, x):
        y = self.c2(torch.relu(self.c1(x)))
        for _ in range(40):
            y = y * 0.999 + 0.001
        return y

class Model:
    num_classes = 3
    def __init__(self, devices, options):
        torch.manual_seed(0)
        self.device = torch.device(devices[0])
        self.net = Net().to(self.device).eval()
    def predict(self, images, rows):
        x = torch.from_numpy(np.stack(images)).to(self.device).permute(0, 3, 1, 2).float() / 255
        return self.net(x)
""")
        rng = np.random.default_rng(11)
        manifest = tt.write_dataset(os.path.join(root, "data"), rng, 20, [(64, 80)], classes=3)
        cache = os.path.join(root, "cache")  # The workers' cache folder: $XDG_CACHE_HOME/tally.
        saved_env = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "TALLY_PRECOMPILE")}
        os.environ["XDG_CACHE_HOME"] = cache
        os.environ.pop("TALLY_PRECOMPILE", None)  # The default: precompiling on.
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in saved_env.items()])
        outs, compiles = [], []
        for k in range(3):
            if k == 2:  # Damage the saved artifact: one byte of its payload.
                folder = os.path.join(cache, "tally", "inductor", "tally-precompiled")
                saved = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".bin")]
                self.assertEqual(len(saved), 2, saved)  # Batches of 8 and the last one of 4.
                for path in saved:
                    with open(path, "r+b") as f:
                        f.seek(os.path.getsize(path) - 10)
                        b = f.read(1)
                        f.seek(-1, 1)
                        f.write(bytes([b[0] ^ 0xFF]))
            outs.append(os.path.join(root, "o%d" % k))
            tt.tally_run(model, manifest, outs[-1], "--compile", "--python", py, "--gpus", "0", "--batch-size", "8")
            compiles.append(tt.read_report(outs[-1])["compile"])
        self.assertEqual(compiles[0]["precompiled"], "saved", compiles[0])
        self.assertEqual(compiles[1]["precompiled"], "loaded", compiles[1])
        self.assertEqual(compiles[2]["precompiled"], "saved", compiles[2])
        self.assertIn("differ from the digest saved with them", compiles[2]["note"])
        self.assertEqual([c["ran"] for c in compiles], ["compiled"] * 3, compiles)
        self.assertTrue(tt.same_files(outs[0], outs[1]))
        self.assertTrue(tt.same_files(outs[0], outs[2]))

    def test_surface_metrics_on_the_gpu_equal_the_cpus(self):
        # The same predictions scored three ways: surface metrics on the device (the default on a
        # GPU worker), on the worker's CPUs (TALLY_CPU_SURFACE=1), and by a prediction job over the
        # label maps the GPU run saved (CPU workers, no model). Every value equal, to the digit;
        # three classes, ignored pixels, two image sizes, and anisotropic spacing.
        for name, flags in (("iso", []), ("aniso", ["--spacing", "0.7,1.3", "--nsd-tolerance", "2"])):
            saved = os.path.join(self.root, f"saved-{name}")
            device = self.run_on(f"surface-gpu-{name}", "conv3.pt", "--gpus", "0", "--save-predictions", saved, *flags)
            os.environ["TALLY_CPU_SURFACE"] = "1"
            try:
                host = self.run_on(f"surface-cpu-{name}", "conv3.pt", "--gpus", "0", *flags)
            finally:
                del os.environ["TALLY_CPU_SURFACE"]
            with open(os.path.join(device, "per_image.csv"), "rb") as a, \
                    open(os.path.join(host, "per_image.csv"), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
            pairs = os.path.join(self.root, f"pairs-{name}.csv")
            data = os.path.dirname(self.manifest)
            with open(self.manifest) as f, open(pairs, "w") as out:
                out.write("id,mask,prediction\n")
                for row in list(csv.DictReader(f)):
                    out.write(f"{row['id']},{os.path.join(data, row['mask'])},{os.path.join(saved, row['id'])}.png\n")
            scored = os.path.join(self.root, f"surface-scored-{name}")
            tt.tally("run", "--manifest", pairs, "--out", scored, "--workers", "2", "--metrics", "all",
                     "--num-classes", "3", "--max-failed-fraction", "1", *flags)
            keys = ("hd", "hd95", "assd", "nsd")
            a = {(r["index"], r["class"]): tuple(r[k] for k in keys) for r in tt.read_per_image(device)}
            b = {(r["index"], r["class"]): tuple(r[k] for k in keys) for r in tt.read_per_image(scored)}
            self.assertEqual(a, b, name)
            finite = sum(1 for v in a.values() if v[0] not in ("", "nan", "inf", "NaN"))
            self.assertGreater(finite, 20, name)

    def test_jpeg_decoding_on_the_gpu(self):
        # --decode gpu: every kind of JPEG (4:2:0, 4:4:4, gray, progressive: the hardware engines
        # take the first two, nvJPEG's CUDA decoder the others) and PNG rows evaluate; the results
        # are the same with one worker or two on the GPU and whatever the batch size; pixels differ
        # from libjpeg-turbo's, so the scores may differ from --decode cpu a little, not much.
        from PIL import Image
        data = os.path.join(self.root, "jpeg-kinds")
        os.makedirs(data, exist_ok=True)
        rng = np.random.default_rng(3)
        rows = ["id,image,mask"]
        for i in range(40):
            h, w = ((96, 128), (61, 77))[i % 2]
            mask = tt.blob_mask(rng, h, w, 3, ignore=(i % 4 == 1))
            base = np.where(mask[..., None] == 1, [200, 60, 40], np.where(mask[..., None] == 2, [40, 60, 200], [90, 90, 90]))
            img = Image.fromarray(np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8))
            kind = i % 5
            name = f"k{i:03d}." + ("png" if kind == 4 else "jpg")
            if kind == 0:
                img.save(os.path.join(data, name), quality=90)
            elif kind == 1:
                img.save(os.path.join(data, name), quality=95, subsampling=0)
            elif kind == 2:
                img.convert("L").save(os.path.join(data, name), quality=90)
            elif kind == 3:
                img.save(os.path.join(data, name), quality=85, progressive=True)
            else:
                img.save(os.path.join(data, name))
            Image.fromarray(mask).save(os.path.join(data, f"m{i:03d}.png"))
            rows.append(f"r{i},{name},m{i:03d}.png")
        manifest = tt.write_manifest(data, rows, "m.csv")
        outs = {}
        for label, flags in (("cpu", ["--decode", "cpu"]), ("gpu", ["--decode", "gpu"]),
                             ("gpu-b3", ["--decode", "gpu", "--batch-size", "3"])):
            out = os.path.join(self.root, f"decode-{label}")
            p = tt.tally_run(tt.fixture("conv3.pt"), manifest, out, "--gpus", "0", "--metrics", "dice,iou",
                             "--batch-size", "4", *flags, check=False)
            if p.returncode != 0 and "CPU-only LibTorch" in p.stderr:
                self.skipTest("this build has no CUDA support")
            if p.returncode != 0 and "without nvJPEG" in p.stdout + p.stderr:
                self.skipTest("this build has no nvJPEG")
            self.assertEqual(p.returncode, 0, p.stderr)
            report = tt.read_report(out)
            self.assertEqual((report["images_evaluated"], report["images_failed"]), (40, 0), label)
            self.assertEqual(report["decode"], label[:3])
            outs[label] = out
        self.assertTrue(tt.same_files(outs["gpu"], outs["gpu-b3"]))
        # Two workers on the one GPU, shards of 6 rows: the same per-row results.
        cluster = tt.Cluster(self, os.path.join(self.root, "decode-cluster"))
        for _ in range(2):
            cluster.start_worker(device="cuda:0")
        job = cluster.submit(tt.fixture("conv3.pt"), manifest, "--metrics", "dice,iou", "--batch-size", "4",
                             "--shard-size", "8", "--decode", "gpu")
        self.assertEqual(cluster.wait(job)["state"], "succeeded")
        two = os.path.join(self.root, "decode-gpu-two")
        cluster.fetch(job, two)
        self.assertTrue(tt.same_files(outs["gpu"], two))
        # Against the CPU decoder: PNG rows equal; JPEG rows close.
        cpu = {(r["index"], r["class"]): float(r["dice"] or "nan") for r in tt.read_per_image(outs["cpu"])}
        gpu = {(r["index"], r["class"]): float(r["dice"] or "nan") for r in tt.read_per_image(outs["gpu"])}
        self.assertEqual(cpu.keys(), gpu.keys())
        for (index, c), d in cpu.items():
            g = gpu[(index, c)]
            if int(index) % 5 == 4:
                self.assertTrue(d == g or (d != d and g != g), (index, c, d, g))
            elif d == d:
                self.assertLess(abs(d - g), 0.05, (index, c, d, g))

    def test_decode_auto_decodes_every_row_with_the_jobs_choice(self):
        # A fast model and one decode thread: the CPU cannot keep up, so auto picks the GPU on the
        # first batch; rows decoded on the CPU before the answer are decoded again, so the results
        # equal --decode gpu's to the byte.
        manifest = os.path.join(self.root, "jpeg-auto.csv")
        data = os.path.join(self.root, "jpeg-auto")
        tt.write_dataset(data, np.random.default_rng(21), 48, [(256, 256)], classes=3, jpeg_every=1)
        manifest = os.path.join(data, "manifest.csv")
        outs = {}
        for label in ("auto", "gpu"):
            out = os.path.join(self.root, f"decode-{label}-fast")
            p = tt.tally_run(tt.fixture("conv3.pt"), manifest, out, "--gpus", "0", "--metrics", "dice",
                             "--batch-size", "8", "--worker-threads", "1", "--decode", label, check=False)
            if p.returncode != 0 and ("CPU-only LibTorch" in p.stderr or "without nvJPEG" in p.stdout + p.stderr):
                self.skipTest("this build has no CUDA or no nvJPEG")
            self.assertEqual(p.returncode, 0, p.stderr)
            outs[label] = out
        report = tt.read_report(outs["auto"])
        self.assertEqual((report["decode_mode"], report["decode"]), ("auto", "gpu"), report["decode_trial"])
        self.assertIn("CPU decoders", report["decode_trial"])
        self.assertTrue(tt.same_files(outs["auto"], outs["gpu"]))

    def test_channels_last_auto_resolves_and_a_loaded_model_serves_the_next_job(self):
        # Default --channels-last auto on a GPU: the trial's choice is in the report, and the
        # results equal a run with that layout given explicitly.
        auto = self.run_on("layout-auto", "conv3.pt", "--gpus", "0")
        report = tt.read_report(auto)
        self.assertIn(report["channels_last"], ("on", "off"))
        self.assertIn("ms channels-last", report["channels_last_trial"])
        fixed = self.run_on("layout-fixed", "conv3.pt", "--gpus", "0", "--channels-last", report["channels_last"])
        self.assertTrue(tt.same_files(auto, fixed))
        # A long-running worker keeps the model for the next job with the same file: no reload.
        root = tt.tmpdir(self)
        cluster = tt.Cluster(self, root)
        cluster.start_worker(device="cuda:0")
        cluster.wait_registered(1)
        outs = []
        for k in range(2):
            job = cluster.submit(tt.fixture("conv3.pt"), self.manifest, "--metrics", "all")
            self.assertEqual(cluster.wait(job)["state"], "succeeded")
            outs.append(os.path.join(root, f"out{k}"))
            cluster.fetch(job, outs[-1])
        log = cluster.log("worker-0.log")
        self.assertEqual(log.count("loading model"), 1, log)
        self.assertIn("reusing it", log)
        with open(os.path.join(outs[0], "per_image.csv"), "rb") as a, \
                open(os.path.join(outs[1], "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_a_layout_trial_is_kept_for_the_next_process(self):
        # The second `tally run` of the same model on this GPU takes the first one's trial from the
        # worker's cache folder instead of running it again: same layout, same bytes. So does a
        # retrained checkpoint of the same network.
        cache = os.path.join(tt.tmpdir(self), "cache")
        outs = [self.run_on(f"kept-{k}", "conv3.pt", "--gpus", "0", f"--worker-flags=--cache-dir={cache}")
                for k in range(2)]
        first, second = (tt.read_report(o) for o in outs)
        self.assertIn("ms channels-last", first["channels_last_trial"])
        self.assertNotIn("kept from an earlier trial", first["channels_last_trial"])
        self.assertIn("kept from an earlier trial", second["channels_last_trial"])
        self.assertTrue(second["channels_last_trial"].startswith(first["channels_last_trial"]))
        self.assertEqual(first["channels_last"], second["channels_last"])
        self.assertTrue(tt.same_files(outs[0], outs[1]))
        self.assertEqual(len(os.listdir(os.path.join(cache, "layout-trials"))), 1)
        # A retrained checkpoint of the network (other weights, other SHA-256) takes the same trial:
        # layout speed is the network's. Another network has a trial of its own; --cache-dir none
        # keeps nothing.
        retrained = tt.read_report(self.run_on("kept-retrained", "conv3_retrained.pt", "--gpus", "0",
                                               f"--worker-flags=--cache-dir={cache}"))
        self.assertIn("kept from an earlier trial", retrained["channels_last_trial"])
        self.assertEqual(retrained["channels_last"], first["channels_last"])
        self.assertEqual(len(os.listdir(os.path.join(cache, "layout-trials"))), 1)
        self.run_on("kept-other", "three_class.pt", "--gpus", "0", f"--worker-flags=--cache-dir={cache}")
        self.assertEqual(len(os.listdir(os.path.join(cache, "layout-trials"))), 2)
        none = self.run_on("kept-none", "conv3.pt", "--gpus", "0", "--worker-flags=--cache-dir=none")
        self.assertNotIn("kept from an earlier trial", tt.read_report(none)["channels_last_trial"])

    def test_a_trial_beside_the_evaluation_gives_the_fixed_layouts_results(self):
        # The trial beside the evaluation on CUDA: layout_marks.pt predicts the other class when run
        # channels-last. With the answer forced each way (TALLY_TEST_LAYOUT_TRIAL), the held rows
        # are delivered or evaluated again on the adopted copy (and its launch thread): the report
        # equals the fixed layout's (one GPU), with every GPU's worker running a trial of its own
        # too. A real trial (conv3, fresh cache) equals its answer's layout.
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(7), 160, [(64, 96)], classes=2)
        flags = ("--metrics", "all", "--batch-size", "8", "--shard-size", "16", "--worker-flags=--cache-dir=none")

        def run(name, model, *extra, env=None, gpus="0"):
            out = os.path.join(root, name)
            saved = dict(os.environ)
            os.environ.update(env or {})
            try:
                p = tt.tally_run(tt.fixture(model), manifest, out, "--gpus", gpus, *flags, *extra, check=False)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            if p.returncode != 0 and "CPU-only LibTorch" in p.stderr:
                self.skipTest("this build has no CUDA support")
            self.assertEqual(p.returncode, 0, p.stderr)
            return out

        fixed = {layout: run(f"fixed-{layout}", "layout_marks.pt", "--channels-last", layout) for layout in ("on", "off")}
        self.assertFalse(tt.same_files(fixed["on"], fixed["off"]))
        for gpus in ("0", "all") if GPUS >= 2 else ("0",):
            # "inline": as where the GPU has no room for the copy, the trial on the batcher instead.
            for answer, how in (("on", "0.3"), ("off", "0.3"), ("on", "inline")):
                out = run(f"beside-{answer}-{how}-{gpus}", "layout_marks.pt",
                          env={"TALLY_TEST_LAYOUT_TRIAL": f"{answer}:{how}"}, gpus=gpus)
                report = tt.read_report(out)
                self.assertEqual(report["channels_last"], answer)
                self.assertEqual("the trial beside the evaluation" in report["channels_last_trial"], how != "inline")
                self.assertTrue(tt.same_files(out, fixed[answer]), (answer, how, gpus))
            real = run(f"beside-real-{gpus}", "conv3.pt", gpus=gpus)
            report = tt.read_report(real)
            self.assertIn("the trial beside the evaluation", report["channels_last_trial"])
            fixed_real = run(f"real-fixed-{gpus}", "conv3.pt", "--channels-last", report["channels_last"])
            self.assertTrue(tt.same_files(real, fixed_real), gpus)

    def test_the_first_batch_is_its_own_warm_up(self):
        # With the JIT optimiser off (the default) a fresh GPU worker runs no extra passes before
        # its first batch, and warms the device up while it reads the model: the first batch's own
        # pass takes what start-up is left. Results must equal those of a worker that warmed up
        # with two passes over the first batch and no device warm-up (the old way).
        fresh = self.run_on("warm-default", "conv3.pt", "--gpus", "0", "--channels-last", "off")
        old = self.run_on("warm-passes", "conv3.pt", "--gpus", "0", "--channels-last", "off",
                          "--worker-flags=--warmup_batches=2,--warm_up_device=false")
        self.assertTrue(tt.same_files(fresh, old))
        with open(os.path.join(fresh, ".tally", "worker-0.log")) as f:
            log = f.read()
        self.assertIn("the device's warm-up beside it", log)
        self.assertNotIn("passes", log)
        with open(os.path.join(old, ".tally", "worker-0.log")) as f:
            log = f.read()
        self.assertIn("rows): 2 passes", log)
        self.assertNotIn("the device's warm-up beside it", log)
        self.assertGreater(tt.read_report(fresh)["workers"][0]["images_per_second"], 0)

    def test_out_of_memory_halves_the_batch_and_loses_nothing(self):
        root = tt.tmpdir(self)
        manifest = tt.write_dataset(os.path.join(root, "data"), np.random.default_rng(4), 48, [(512, 512)], classes=3)
        ref = os.path.join(root, "ref")
        tt.tally_run(tt.fixture("conv3.pt"), manifest, ref, "--gpus", "0", "--batch-size", "2", "--metrics", "dice")
        out = os.path.join(root, "oom")
        tt.tally_run(tt.fixture("conv3.pt"), manifest, out, "--gpus", "0", "--batch-size", "48", "--metrics", "dice",
                     "--worker-flags=--gpu-memory-limit-gib=1.0")
        report = tt.read_report(out)
        self.assertEqual(report["images_evaluated"], 48)
        self.assertGreater(report["workers"][0]["oom_retries"], 0)
        self.assertLess(report["workers"][0]["batch_size"], 48)
        a = {(r["index"], r["class"]): r["tp"] for r in tt.read_per_image(ref)}
        b = {(r["index"], r["class"]): r["tp"] for r in tt.read_per_image(out)}
        self.assertEqual(a.keys(), b.keys())

    def test_precision_channels_last_and_auto_batch_run(self):
        out = self.run_on("bf16", "conv3.pt", "--gpus", "0", "--precision", "bf16", "--channels-last",
                          "--batch-size", "auto", "--max-memory", "4")
        w = tt.read_report(out)["workers"][0]
        self.assertGreaterEqual(w["batch_size"], 1)
        self.assertEqual(tt.read_report(out)["images_evaluated"], 64)

    def test_estimate_peak_memory_against_torch(self):
        # tally estimate's per-batch peak against torch's own measurement of the same work on the
        # same GPU (upload uint8, scale to float, forward, argmax), done in this process.
        import json
        import torch
        from PIL import Image
        if not torch.cuda.is_available():
            self.skipTest("this Python's torch has no CUDA")
        data = os.path.join(self.root, "est")
        os.makedirs(data, exist_ok=True)
        rng = np.random.default_rng(4)
        rows = ["id,image,mask"]
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (512, 512, 3), dtype=np.uint8)).save(os.path.join(data, f"i{i}.png"))
            Image.fromarray(rng.integers(0, 3, (512, 512), dtype=np.uint8)).save(os.path.join(data, f"m{i}.png"))
            rows.append(f"r{i},i{i}.png,m{i}.png")
        tt.write_manifest(data, rows)
        model = tt.fixture("conv3.pt")
        p = tt.tally("estimate", "--model", model, "--manifest", os.path.join(data, "manifest.csv"), "--gpus", "0",
                     "--max-batch", "32", "--json", check=False)
        if p.returncode != 0 and "CPU-only LibTorch" in p.stderr:
            self.skipTest("this build has no CUDA support")
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        self.assertEqual(r["image_size"], [512, 512])
        self.assertEqual([t["batch_size"] for t in r["trials"]], [1, 2, 4, 8, 16, 32])
        total = torch.cuda.get_device_properties(0).total_memory
        self.assertEqual(r["memory_total_bytes"], total)
        self.assertEqual(r["memory_budget_bytes"], int(0.9 * total))
        net = torch.jit.load(model).cuda().eval()
        # The estimate keeps as many batches in flight as a worker's staging slots (3 by default),
        # each holding its input, logits and labels until its results are read: so does this.
        depth = 3
        for t in r["trials"]:
            b = t["batch_size"]
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(0)
            # As the worker runs TorchScript by default (--jit_optimize off): op by op, no fusion.
            held = []
            with torch.no_grad(), torch.jit.optimized_execution(False):
                for _ in range(depth):
                    x = torch.randint(0, 255, (b, 512, 512, 3), dtype=torch.uint8, device="cuda")
                    xf = x.permute(0, 3, 1, 2).float().div(255)
                    logits = net(xf)
                    held.append((x, xf, logits, logits.argmax(1)))
                torch.cuda.synchronize()
            ref = torch.cuda.max_memory_reserved(0)
            del held, x, xf, logits
            print(f"batch {b}: tally {t['peak_memory_bytes'] / 2**20:.1f} MiB, torch {ref / 2**20:.1f} MiB")
            self.assertTrue(t["fits"])
            if ref > 64 << 20:
                self.assertGreater(t["peak_memory_bytes"], 0.5 * ref)
                self.assertLess(t["peak_memory_bytes"], 2.5 * ref)
        peaks = [t["peak_memory_bytes"] for t in r["trials"]]
        self.assertGreater(peaks[-1], 4 * peaks[2])  # Per batch size, not cumulative nor fixed.

    def test_metrics_show_the_workers_gpu_memory(self):
        import re
        import urllib.request
        c = tt.Cluster(self, os.path.join(self.root, "metrics"), tallyd_args=["--metrics-listen", "127.0.0.1:0"])
        c.start_worker(device="cuda:0", name="gpu0")
        c.wait_registered(1)
        job = c.submit(tt.fixture("conv3.pt"), self.manifest)
        self.assertEqual(c.wait(job)["state"], "succeeded")
        url = re.search(r"metrics on (http://\S+/metrics)", c.log("tallyd.log")).group(1)
        import time
        time.sleep(1.5)  # A heartbeat after the job.
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        def sample(name):
            m = re.search(r"^" + name + r"\{[^}]*worker=\"gpu0\"[^}]*\} (\S+)$", text, re.M)
            self.assertIsNotNone(m, name + " missing:\n" + text)
            return float(m.group(1))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits",
                              "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                             capture_output=True, text=True).stdout.split(",")
        total_mib, used_mib = float(smi[0]), float(smi[1])
        print("metrics: total", sample("tally_worker_gpu_memory_total_bytes") / 2**20, "MiB, used",
              sample("tally_worker_gpu_memory_used_bytes") / 2**20, "MiB; nvidia-smi", total_mib, used_mib)
        # cudaMemGetInfo's total is the memory CUDA may use: nvidia-smi's total less the driver's reserve.
        self.assertLessEqual(sample("tally_worker_gpu_memory_total_bytes") / 2**20, total_mib + 1)
        self.assertGreater(sample("tally_worker_gpu_memory_total_bytes") / 2**20, 0.9 * total_mib)
        self.assertGreater(sample("tally_worker_gpu_memory_used_bytes"), 0)
        self.assertGreater(sample("tally_worker_gpu_memory_peak_bytes"), 0)
        self.assertLessEqual(sample("tally_worker_gpu_memory_peak_bytes"), sample("tally_worker_gpu_memory_used_bytes"))

    @unittest.skipIf(GPUS < 2, "needs two GPUs")
    def test_all_gpus_give_the_same_report_as_one(self):
        one = self.run_on("one_gpu", "conv3.pt", "--gpus", "0", "--shard-size", "32", "--batch-size", "8")
        many = self.run_on("all_gpus", "conv3.pt", "--gpus", "all", "--shard-size", "8", "--batch-size", "8")
        with open(os.path.join(one, "per_image.csv"), "rb") as a, open(os.path.join(many, "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(len(tt.read_report(many)["workers"]), GPUS)


if __name__ == "__main__":
    unittest.main()
