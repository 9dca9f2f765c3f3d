"""tally merge: a set evaluated as several jobs gives, merged, exactly the report one job over the
whole set gives (aggregates, bootstrap interval, per-image rows)."""
import json
import os
import unittest

import numpy as np

import tallytest as tt

# Fields that describe the run rather than the results.
RUN_FIELDS = {"job_id", "name", "manifest", "created_unix", "finished_unix", "wall_seconds", "images_per_second",
              "workers", "state", "shard_size"}


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
        flags = ["--batch-size", "4", "--metrics", "all"]
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
        # Jobs with different settings do not merge.
        other = c.submit(tt.fixture("three_class.pt"), parts[0], "--batch-size", "4", "--metrics", "dice")
        c.wait(other)
        p = c.cli("merge", part_ids[0], other, "--out", os.path.join(root, "bad"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("their metrics differ", p.stderr)
        # The temporary folders are gone once the reports are sent.
        self.assertEqual(os.listdir(os.path.join(c.state, "merged")), [])


if __name__ == "__main__":
    unittest.main()
