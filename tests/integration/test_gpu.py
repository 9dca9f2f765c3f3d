"""GPU checks, skipped where no NVIDIA GPU is visible or the build has no CUDA: a worker on cuda:0
counts the same as on CPU, the out-of-memory path loses nothing, and two GPUs give the same
report as one."""
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

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

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
        with open(os.path.join(data, "m.csv"), "w") as f:
            f.write("\n".join(rows) + "\n")
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

    @unittest.skipIf(GPUS < 2, "needs two GPUs")
    def test_all_gpus_give_the_same_report_as_one(self):
        one = self.run_on("one_gpu", "conv3.pt", "--gpus", "0", "--shard-size", "32", "--batch-size", "8")
        many = self.run_on("all_gpus", "conv3.pt", "--gpus", "all", "--shard-size", "8", "--batch-size", "8")
        with open(os.path.join(one, "per_image.csv"), "rb") as a, open(os.path.join(many, "per_image.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(len(tt.read_report(many)["workers"]), GPUS)


if __name__ == "__main__":
    unittest.main()
