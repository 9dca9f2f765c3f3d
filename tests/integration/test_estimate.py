"""`tally estimate`: the manifest's row counts and image sizes against what the test wrote, the
trial batch sizes asked for, the prediction recomputed from the printed figures, both model
backends, and the usage errors. On a GPU (test_gpu.py) the peak memory is checked against torch's
own measurement."""
import json
import os
import unittest

import numpy as np
from PIL import Image

import tallytest as tt

PY = "/usr/bin/python3"


def dataset(root, small, large, malformed=0):
    """`small` rows of 32x48 images then `large` of 64x40 (more pixels), and `malformed` rows
    with a missing column. Returns the manifest path."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(3)
    rows = ["id,image,mask"]
    for i in range(small + large):
        h, w = (32, 48) if i < small else (64, 40)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(os.path.join(root, f"i{i}.png"))
        Image.fromarray(rng.integers(0, 3, (h, w), dtype=np.uint8)).save(os.path.join(root, f"m{i}.png"))
        rows.append(f"r{i},i{i}.png,m{i}.png")
    rows += [f"bad{i},only-an-image.png" for i in range(malformed)]
    return tt.write_manifest(root, rows)


def estimate(*args, check=True):
    return tt.tally("estimate", *args, check=check)


class EstimateTest(unittest.TestCase):
    def check_prediction(self, r):
        """The prediction follows from the figures printed beside it."""
        decode_rate = r["decode_threads"] / r["decode_seconds_per_row"]
        at = [t for t in r["trials"] if t["batch_size"] == r["prediction_batch_size"]][0]
        self.assertEqual(r["prediction_images_per_worker"], at["images_per_second"])
        model_rate = r["workers"] * at["images_per_second"]
        self.assertAlmostEqual(r["predicted_images_per_second"], min(decode_rate, model_rate), delta=1e-6 * model_rate)
        self.assertEqual(r["limited_by"], "decoding" if decode_rate < model_rate else "model")
        rows = r["rows"] - r["rows_with_errors"]
        self.assertGreaterEqual(r["startup_seconds"], r["model_load_seconds"])
        self.assertAlmostEqual(r["predicted_seconds"], rows / r["predicted_images_per_second"] + r["startup_seconds"],
                               delta=1e-6 * r["predicted_seconds"])

    def test_torchscript_on_cpu(self):
        root = tt.tmpdir(self)
        manifest = dataset(os.path.join(root, "d"), 30, 10, malformed=2)
        p = estimate("--model", tt.fixture("three_class.pt"), "--manifest", manifest, "--max-batch", "8", "--workers",
                     "2", "--worker-threads", "1", "--json")
        r = json.loads(p.stdout)
        self.assertEqual(r["rows"], 42)
        self.assertEqual(r["rows_with_errors"], 2)
        self.assertEqual(r["sampled_rows"], 32)  # Of the 40 well-formed rows.
        self.assertEqual(r["decode_failures"], 0)
        # 32 sampled of 30 small + 10 large: at least two large ones, the larger image.
        self.assertEqual(r["image_size"], [64, 40])
        sizes = {(s["height"], s["width"]): s["count"] for s in r["sample_sizes"]}
        self.assertEqual(sum(sizes.values()), 32)
        self.assertGreaterEqual(sizes[(64, 40)], 2)
        self.assertGreaterEqual(sizes[(32, 48)], 22)
        self.assertEqual([t["batch_size"] for t in r["trials"]], [1, 2, 4, 8])
        for t in r["trials"]:
            self.assertTrue(t["fits"])
            self.assertEqual(t["peak_memory_bytes"], 0)  # No device memory on CPU.
            self.assertGreater(t["images_per_second"], 0)
        self.assertEqual(r["batch_size"], 8)
        self.assertEqual(r["images_per_second"], r["trials"][-1]["images_per_second"])
        self.assertEqual(r["workers"], 2)
        self.assertEqual(r["decode_threads"], 2)
        self.assertEqual(r["device"], "cpu")
        self.assertEqual(r["prediction_batch_size"], 8)  # The CPU workers' default batch.
        self.check_prediction(r)

        # The text form says the same.
        p = estimate("--model", tt.fixture("three_class.pt"), "--manifest", manifest, "--max-batch", "2")
        self.assertIn("42 rows (2 malformed)", p.stdout)
        self.assertIn("64x40, the largest of 32 sampled rows", p.stdout)
        self.assertRegex(p.stdout, r"\n\s+2\s+-\s+[0-9.]+\s+fits\n")
        self.assertIn("batch size 2: the largest tried that fits", p.stdout)
        self.assertIn("predicted 40 rows on 1 worker(s) at batch size 2", p.stdout)

        # The job's batch size sets the prediction's.
        r = json.loads(estimate("--model", tt.fixture("three_class.pt"), "--manifest", manifest, "--max-batch", "8",
                                "--batch-size", "4", "--json").stdout)
        self.assertEqual(r["prediction_batch_size"], 4)
        self.assertEqual(r["batch_size"], 8)
        self.check_prediction(r)

    def test_python_model(self):
        root = tt.tmpdir(self)
        manifest = dataset(os.path.join(root, "d"), 6, 0)
        model = tt.write_text(
            os.path.join(root, "wrap.py"),
            "import numpy as np, torch\n"
            "class Model:\n"
            "    def __init__(self, devices, options):\n"
            "        self.net = torch.jit.load(options['pt']).eval()\n"
            "    def predict(self, images, rows):\n"
            "        assert all('id' in r for r in rows)\n"
            "        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous().float() / 255\n"
            "        return list(self.net(x))\n")
        p = estimate("--model", model, "--python", PY, "--model-option", f"pt={tt.fixture('three_class.pt')}",
                     "--manifest", manifest, "--max-batch", "4", "--json")
        r = json.loads(p.stdout)
        self.assertEqual(r["rows"], 6)
        self.assertEqual(r["sampled_rows"], 6)
        self.assertEqual(r["image_size"], [32, 48])
        self.assertEqual([t["batch_size"] for t in r["trials"]], [1, 2, 4])
        self.assertTrue(all(t["images_per_second"] > 0 for t in r["trials"]))
        self.check_prediction(r)

    def test_errors(self):
        root = tt.tmpdir(self)
        manifest = dataset(os.path.join(root, "d"), 2, 0)
        p = estimate("--manifest", manifest, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("needs --model", p.stderr)
        missing = os.path.join(root, "nope.pt")
        p = estimate("--model", missing, "--manifest", manifest, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(missing, p.stderr)
        p = estimate("--model", tt.fixture("three_class.pt"), "--manifest", os.path.join(root, "none.csv"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("none.csv", p.stderr)
        # Every sampled row unreadable: said, with the first reason.
        bad = os.path.join(root, "bad.csv")
        with open(bad, "w") as f:
            f.write("id,image,mask\na,gone.png,gone_mask.png\n")
        p = estimate("--model", tt.fixture("three_class.pt"), "--manifest", bad, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("none of the 1 sampled rows could be read", p.stderr)
        self.assertIn("gone.png", p.stderr)
        p = estimate("--model", tt.fixture("three_class.pt"), "--manifest", manifest, "--gpus-per-worker", "2",
                     check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--gpus-per-worker goes with --gpus", p.stderr)


if __name__ == "__main__":
    unittest.main()
