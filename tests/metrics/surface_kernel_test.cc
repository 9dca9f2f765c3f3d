// The GPU surface metrics (metrics/gpu/surface_kernel.cu) against the CPU's ClassSurfaceMetrics, to the
// bit, on label maps drawn to exercise what matters: near and far predictions, classes missing
// from one map or both, ignored reference pixels, images of one row or column, anisotropic spacing,
// noise (edges everywhere) and more classes than the kernels hold column gaps for at once. Built
// only with the CUDA kernels; skipped when no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "metrics/surface_distance.h"
#include "gtest/gtest.h"
#include "metrics/gpu/surface_kernel.h"

namespace tally {
namespace {

constexpr uint16_t kIgnore = 0xFFFF;  // PrepareMask's kIgnoredPixel; -1 as int16 on the device.

struct Maps {
  int n = 0, h = 0, w = 0, k = 0;
  std::vector<uint16_t> pred, ref;  // n x h x w.
};

// Filled ellipses of random classes on class 0; the prediction is the reference's shapes moved,
// grown or shrunk, with some dropped and some invented, plus optional noise and ignored regions.
Maps Draw(uint64_t seed, int n, int h, int w, int k, double noise, bool ignore, double shift) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Maps m{n, h, w, k, std::vector<uint16_t>(static_cast<size_t>(n) * h * w, 0),
         std::vector<uint16_t>(static_cast<size_t>(n) * h * w, 0)};
  auto ellipse = [&](std::vector<uint16_t>* map, int img, double cy, double cx, double ry, double rx, uint16_t label) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const double dy = (y - cy) / ry, dx = (x - cx) / rx;
        if (dy * dy + dx * dx <= 1) (*map)[(static_cast<size_t>(img) * h + y) * w + x] = label;
      }
    }
  };
  for (int img = 0; img < n; ++img) {
    const int shapes = 1 + static_cast<int>(u(rng) * 5);
    for (int s = 0; s < shapes; ++s) {
      const double cy = u(rng) * h, cx = u(rng) * w;
      const double ry = 1 + u(rng) * h / 4, rx = 1 + u(rng) * w / 4;
      const uint16_t label = static_cast<uint16_t>(1 + (k > 1 ? rng() % (k - 1) : 0));
      ellipse(&m.ref, img, cy, cx, ry, rx, label);
      if (u(rng) < 0.15) continue;  // Missed by the prediction.
      const double g = 0.8 + 0.4 * u(rng);
      ellipse(&m.pred, img, cy + shift * (u(rng) - 0.5) * h, cx + shift * (u(rng) - 0.5) * w, ry * g, rx * g, label);
    }
    if (u(rng) < 0.3) {  // An invented shape, far from anything.
      ellipse(&m.pred, img, u(rng) * h, u(rng) * w, 1 + u(rng) * 3, 1 + u(rng) * 3,
              static_cast<uint16_t>(rng() % k));
    }
    const size_t base = static_cast<size_t>(img) * h * w;
    for (size_t p = 0; p < static_cast<size_t>(h) * w; ++p) {
      if (u(rng) < noise) m.pred[base + p] = static_cast<uint16_t>(rng() % k);
      if (u(rng) < noise) m.ref[base + p] = static_cast<uint16_t>(rng() % k);
    }
    if (ignore && h > 4 && w > 4) {
      const int y0 = static_cast<int>(u(rng) * h / 2), x0 = static_cast<int>(u(rng) * w / 2);
      for (int y = y0; y < y0 + h / 4; ++y) {
        for (int x = x0; x < x0 + w / 3; ++x) m.ref[base + static_cast<size_t>(y) * w + x] = kIgnore;
      }
    }
  }
  return m;
}

std::string Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return absl::StrCat(v, " (0x", absl::Hex(b), ")");
}

// Runs both and compares every value's bits; returns how many (image, class) pairs had finite values.
int ExpectSame(const Maps& m, const SurfaceOptions& o) {
  std::vector<int16_t> pred(m.pred.begin(), m.pred.end()), ref(m.ref.begin(), m.ref.end());
  std::vector<double> gpu(static_cast<size_t>(m.n) * m.k * 4);
  const std::string error = SurfaceOnDeviceSync(pred.data(), ref.data(), m.n, m.h, m.w, m.k, o, gpu.data(), nullptr);
  if (!error.empty()) {
    ADD_FAILURE() << error;
    return -1;
  }
  int finite = 0;
  const size_t hw = static_cast<size_t>(m.h) * m.w;
  for (int img = 0; img < m.n; ++img) {
    std::vector<SurfaceValues> cpu;
    ClassSurfaceMetrics(m.pred.data() + img * hw, m.ref.data() + img * hw, m.h, m.w, m.k, kIgnore, o, &cpu);
    for (int c = 0; c < m.k; ++c) {
      const double want[4] = {cpu[c].hd, cpu[c].hd95, cpu[c].assd, cpu[c].nsd};
      const double* got = gpu.data() + (static_cast<size_t>(img) * m.k + c) * 4;
      for (int v = 0; v < 4; ++v) {
        EXPECT_EQ(std::memcmp(&want[v], &got[v], sizeof(double)), 0)
            << "image " << img << " class " << c << " value " << v << " (hd, hd95, assd, nsd): CPU " << Bits(want[v])
            << ", GPU " << Bits(got[v]) << "; " << m.h << "x" << m.w << ", K = " << m.k;
      }
      finite += std::isfinite(want[0]);
    }
  }
  return finite;
}

class SurfaceKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int16_t z = 0;
    double out[4];
    if (SurfaceOnDeviceSync(&z, &z, 1, 1, 1, 1, SurfaceOptions(), out, nullptr) == "no CUDA device") {
      GTEST_SKIP() << "no CUDA device visible";
    }
  }
};

TEST_F(SurfaceKernelTest, BinaryShapesNearAndFar) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    EXPECT_GT(ExpectSame(Draw(seed, 6, 97, 131, 2, 0, false, 0.05), SurfaceOptions()), 0);
    EXPECT_GT(ExpectSame(Draw(seed + 10, 4, 120, 90, 2, 0, false, 0.8), SurfaceOptions()), 0);  // Far off.
  }
}

TEST_F(SurfaceKernelTest, ManyClassesIgnoredPixelsAndNoise) {
  EXPECT_GT(ExpectSame(Draw(21, 5, 64, 80, 7, 0.01, true, 0.1), SurfaceOptions()), 0);
  EXPECT_GT(ExpectSame(Draw(22, 3, 50, 50, 4, 0.3, true, 0.1), SurfaceOptions()), 0);  // Edges nearly everywhere.
}

TEST_F(SurfaceKernelTest, AnisotropicSpacingAndTolerance) {
  SurfaceOptions o;
  o.spacing_y = 0.7;
  o.spacing_x = 1.3;
  o.nsd_tolerance = 2.0;
  EXPECT_GT(ExpectSame(Draw(31, 6, 90, 70, 3, 0.002, true, 0.2), o), 0);
  o.spacing_y = 2.5;
  o.spacing_x = 0.3;
  o.nsd_tolerance = 0.5;
  EXPECT_GT(ExpectSame(Draw(32, 6, 70, 90, 3, 0, false, 0.5), o), 0);
}

TEST_F(SurfaceKernelTest, DegenerateImages) {
  ExpectSame(Draw(41, 3, 1, 200, 3, 0.05, false, 0.3), SurfaceOptions());  // One row.
  ExpectSame(Draw(42, 3, 200, 1, 3, 0.05, false, 0.3), SurfaceOptions());  // One column.
  Maps empty{2, 8, 8, 3, std::vector<uint16_t>(128, 0), std::vector<uint16_t>(128, 0)};
  ExpectSame(empty, SurfaceOptions());  // Class 0 everywhere; 1 and 2 absent from both: NaN.
  Maps ignored{1, 8, 8, 2, std::vector<uint16_t>(64, 1), std::vector<uint16_t>(64, kIgnore)};
  ExpectSame(ignored, SurfaceOptions());  // Nothing scored.
  Maps one_sided{1, 16, 16, 2, std::vector<uint16_t>(256, 0), std::vector<uint16_t>(256, 0)};
  one_sided.pred[5 * 16 + 5] = 1;  // Class 1 only in the prediction: inf, inf, inf, 0.
  ExpectSame(one_sided, SurfaceOptions());
}

TEST_F(SurfaceKernelTest, DeviceTimeOfABatch) {
  // Not an assertion on time: prints what a batch of 32 realistic 512 x 512 pairs costs the device.
  const Maps m = Draw(61, 32, 512, 512, 2, 0, false, 0.02);
  std::vector<int16_t> pred(m.pred.begin(), m.pred.end()), ref(m.ref.begin(), m.ref.end());
  std::vector<double> out(static_cast<size_t>(m.n) * m.k * 4);
  double ms = 0, best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    ASSERT_EQ(SurfaceOnDeviceSync(pred.data(), ref.data(), m.n, m.h, m.w, m.k, SurfaceOptions(), out.data(), &ms),
              "");
    best = std::min(best, ms);
  }
  std::printf("surface kernels, 32 x 512 x 512, 2 classes: %.3f ms (best of 5)\n", best);
}

TEST_F(SurfaceKernelTest, RealisticSizeAndMoreClassesThanOneChunk) {
  EXPECT_GT(ExpectSame(Draw(51, 8, 512, 512, 2, 0, false, 0.02), SurfaceOptions()), 0);
  // 4 images of 1024 x 1024: 16 MiB of column gaps per class, so 40 classes take three chunks.
  EXPECT_GT(ExpectSame(Draw(52, 4, 1024, 1024, 40, 0.0005, true, 0.05), SurfaceOptions()), 0);
}

}  // namespace
}  // namespace tally
