"""report.html is one self-contained file that renders: headless Chromium turns it into a PNG of the
expected size with real content on it."""
import os
import re
import shutil
import subprocess
import unittest

import numpy as np
from PIL import Image

import tallytest as tt

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1200, 6000


class ReportHtmlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.root = tempfile.mkdtemp(prefix="tally-html-")
        cls.out = os.path.join(cls.root, "out")
        demo = os.path.join(tt.SRC, "examples", "demo")
        tt.tally_run(os.path.join(demo, "model.pt"), os.path.join(demo, "manifest.csv"), cls.out, "--workers", "2",
                     "--metrics", "all")
        with open(os.path.join(cls.out, "report.html")) as f:
            cls.html = f.read()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

    def test_self_contained(self):
        self.assertNotIn("<script", self.html.lower())
        self.assertNotIn("<link", self.html.lower())
        external = [u for u in re.findall(r"(?:src|href)=\"([^\"]+)\"", self.html)
                    if not u.startswith("data:image/jpeg;base64,")]
        self.assertEqual(external, [])
        self.assertNotRegex(self.html, r"url\(\s*['\"]?https?:")
        # The pieces the issue asks for.
        self.assertIn('aria-label="mean Dice per class"', self.html)
        self.assertEqual(self.html.count('aria-label="per-image Dice histogram'), 3)
        # A histogram per selected metric and class (--metrics all: 10 metrics, 3 classes).
        self.assertEqual(self.html.count('aria-label="per-image '), 30)
        self.assertIn('aria-label="per-image hd95 histogram, class 1"', self.html)
        self.assertIn("Provenance: Tally", self.html)
        # The per-class table scrolls inside its box instead of widening the page.
        self.assertIn('<div class="table-wrap"><table>', self.html)
        self.assertIn("Worst images by Dice", self.html)
        self.assertIn("class=\"ci\"", self.html)
        # Thumbnails of the five worst rows of each foreground class, with a legend.
        self.assertEqual(len(re.findall(r'<figure data-index="\d+" data-class="[12]"><img src="data:image/jpeg;base64,',
                                        self.html)), 10)
        self.assertIn("prediction only (false positive)", self.html)
        # The job's parameters, in their own table.
        self.assertIn("<h2>Parameters</h2>", self.html)
        self.assertRegex(self.html, r"<td class=\"l\">metrics</td><td class=\"l\">dice,iou,precision,recall,"
                                    r"specificity,accuracy,hd,hd95,assd,nsd</td>")

    @unittest.skipIf(CHROMIUM is None, "chromium is not installed (scripts/install-deps.sh installs it)")
    def test_renders_in_headless_chromium(self):
        png = os.path.join(self.root, "report.png")
        profile = os.path.join(self.root, "chromium-profile")
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
               f"--screenshot={png}", "file://" + os.path.join(self.out, "report.html")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertTrue(os.path.exists(png), p.stderr[-2000:])
        img = Image.open(png).convert("RGB")
        self.assertEqual(img.size, (WIDTH, HEIGHT))
        pixels = np.asarray(img).reshape(-1, 3)
        non_white = np.mean(np.any(pixels < 245, axis=1))
        self.assertGreater(non_white, 0.02, "the page rendered (almost) blank")
        # The bars are drawn in the report's blue (#3b6fd4): the chart rendered, not just text.
        blue = np.sum(np.all(np.abs(pixels.astype(int) - [0x3b, 0x6f, 0xd4]) < 12, axis=1))
        self.assertGreater(blue, 2000)
        # The worst-image thumbnails rendered: their overlay's true positives are green-dominant
        # (0.7 * #00c800 over darkened grey), far more pixels than the legend's swatch.
        p = pixels.astype(int)
        green = np.sum((p[:, 1] > p[:, 0] + 60) & (p[:, 1] > p[:, 2] + 60))
        self.assertGreater(green, 1500)
        keep = os.environ.get("TALLY_KEEP_RENDER")
        if keep:
            shutil.copy(png, keep)


if __name__ == "__main__":
    unittest.main()
