// The 3D surface distances with the GPU doing the voxel work (metrics/gpu/surface3d_kernel.h)
// against the CPU's ClassSurfaceMetrics3D, bit for bit: 240 random volumes as the prediction tests
// make them (balls, one-voxel lines and plates of 2-4 labels, touching the border; predictions equal,
// shifted, empty, noisy or unrelated; ignored slabs; empty references; anisotropic spacing), and a
// large volume whose far queries fill several chunks. ctest runs them twice: as they are, and with
// TALLY_SURFACE_MAX_BOX=1 (every query not on the other surface goes to the separable transform, on
// both sides). Skipped where no CUDA device is present.
#include "metrics/gpu/surface3d_kernel.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/label_counts.h"
#include "metrics/surface_distance.h"
#include "tests/metrics/prediction_kinds.h"

namespace tally {
namespace {

struct Volume {
  int d, h, w;
  std::vector<uint16_t> v;
  uint16_t& at(int z, int y, int x) { return v[(static_cast<size_t>(z) * h + y) * w + x]; }
};

Volume RandomVolume(std::mt19937& rng, int d, int h, int w, int labels) {
  Volume m{d, h, w, std::vector<uint16_t>(static_cast<size_t>(d) * h * w, 0)};
  std::uniform_real_distribution<double> u(0, 1);
  const int shapes = static_cast<int>(rng() % 5);
  for (int s = 0; s < shapes; ++s) {
    const uint16_t c = static_cast<uint16_t>(1 + rng() % (labels - 1));
    const int kind = static_cast<int>(rng() % 3);
    const double cz = u(rng) * (d + 3) - 2, cy = u(rng) * (h + 3) - 2, cx = u(rng) * (w + 3) - 2;
    const double r = 1 + u(rng) * std::max(1.0, std::min({d, h, w}) / 2.5 - 1);
    for (int z = 0; z < d; ++z) {
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const bool in = kind == 0   ? (z - cz) * (z - cz) + (y - cy) * (y - cy) + (x - cx) * (x - cx) <= r * r
                          : kind == 1 ? std::abs(y - cy) < 0.6 && std::abs(z - cz) < 0.6
                                      : std::abs(z - cz) < 0.6 && std::abs(x - cx) < 4 && std::abs(y - cy) < 5;
          if (in) m.at(z, y, x) = c;
        }
      }
    }
  }
  return m;
}

void ExpectSameBits(const std::vector<SurfaceValues>& cpu, const std::vector<SurfaceValues>& gpu, int trial) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t c = 0; c < cpu.size(); ++c) {
    for (auto field : {&SurfaceValues::hd, &SurfaceValues::hd95, &SurfaceValues::assd, &SurfaceValues::nsd}) {
      const double a = cpu[c].*field, b = gpu[c].*field;
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0)
          << "case " << trial << " class " << c << ": cpu " << a << " gpu " << b;
    }
  }
}

bool DevicePresent(std::string* why) {
  std::vector<uint16_t> one(8, 0);
  std::vector<SurfaceValues> out;
  *why = ClassSurfaceMetrics3DOnDevice(one.data(), one.data(), 2, 2, 2, 1, kIgnoredPixel, SurfaceOptions3D{}, &out, 0);
  return why->empty();
}

TEST(Surface3DKernelTest, RandomVolumesEqualTheCpuBitForBit) {
  std::string why;
  if (!DevicePresent(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(20261126);
  const double spacings[] = {0.5, 0.8, 1.0, 2.5, 3.0};
  for (int trial = 0; trial < 240; ++trial) {
    const int d = 6 + rng() % 20, h = 6 + rng() % 20, w = 6 + rng() % 20, labels = 2 + rng() % 3;
    Volume ref = RandomVolume(rng, d, h, w, labels);
    Volume pred = ref;
    switch (rng() % 5) {
      case 0: break;
      case 1: {  // Shifted along one axis.
        const int s = static_cast<int>(rng() % 7) - 3;
        for (int z = 0; z < d; ++z)
          for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) pred.at(z, y, x) = ref.at(z, y, (x - s + w) % w);
        break;
      }
      case 2: std::fill(pred.v.begin(), pred.v.end(), 0); break;
      case 3:
        for (auto& v : pred.v) {
          if (rng() % 20 == 0) v = static_cast<uint16_t>(rng() % labels);
        }
        break;
      default: pred = RandomVolume(rng, d, h, w, labels);
    }
    if (trial % 7 == 3) {
      const int y = static_cast<int>(rng() % h);
      for (int z = 0; z < d; ++z)
        for (int x = 0; x < w; ++x) ref.at(z, y, x) = kIgnoredPixel;
    }
    if (trial % 11 == 5) std::fill(ref.v.begin(), ref.v.end(), 0);
    const SurfaceOptions3D o = trial % 3 == 0 ? SurfaceOptions3D{1, 1, 1, 1.0}
                                              : SurfaceOptions3D{spacings[rng() % 5], spacings[rng() % 5],
                                                                 spacings[rng() % 5], 1.5};
    std::vector<SurfaceValues> cpu, gpu;
    ClassSurfaceMetrics3D(pred.v.data(), ref.v.data(), d, h, w, labels, kIgnoredPixel, o, &cpu);
    ASSERT_EQ(ClassSurfaceMetrics3DOnDevice(pred.v.data(), ref.v.data(), d, h, w, labels, kIgnoredPixel, o, &gpu, 0,
                                            1 + trial % 3),
              "");
    ExpectSameBits(cpu, gpu, trial);
  }
}

TEST(Surface3DKernelTest, LargeVolumeWithFarQueriesEqualsTheCpu) {
  std::string why;
  if (!DevicePresent(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(9);
  const int d = 60, h = 90, w = 80;
  Volume ref{d, h, w, std::vector<uint16_t>(static_cast<size_t>(d) * h * w, 0)}, pred = ref;
  for (int z = 0; z < d; ++z) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        if (z > 3 && z < 40 && y > 5 && y < 50 && x > 4 && x < 70) ref.at(z, y, x) = 1;
        if (z > 30 && z < 58 && y > 60 && y < 88 && x > 10 && x < 75) pred.at(z, y, x) = 1;
        if (ref.at(z, y, x) && rng() % 4 == 0) pred.at(z, y, x) = 2;
        if ((x + y + z) % 17 == 0 && z < 20) ref.at(z, y, x) = 2;
      }
    }
  }
  const SurfaceOptions3D o{2.5, 0.8, 0.8, 2.0};
  std::vector<SurfaceValues> cpu, gpu;
  ClassSurfaceMetrics3D(pred.v.data(), ref.v.data(), d, h, w, 3, kIgnoredPixel, o, &cpu, 4);
  ASSERT_EQ(ClassSurfaceMetrics3DOnDevice(pred.v.data(), ref.v.data(), d, h, w, 3, kIgnoredPixel, o, &gpu, 0, 4), "");
  EXPECT_GT(cpu[1].hd, 20.0);
  ExpectSameBits(cpu, gpu, -1);
}

// The kinds of prediction models make (smooth, speckled, fragmented, a class empty on one side, a
// class filling the volume), at two sizes and spacings.
TEST(Surface3DKernelTest, EveryKindOfPredictionEqualsTheCpu) {
  std::string why;
  if (!DevicePresent(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(452);
  int trial = 0;
  for (test::PredictionKind kind : test::kPredictionKinds) {
    for (const int size : {24, 56}) {
      const int labels = 5, d = size / 2, h = size + 8, w = size;
      const test::LabelVolume ref = test::OrganVolume(rng, d, h, w, labels);
      const test::LabelVolume pred = test::PredictionOf(rng, ref, labels, kind);
      const SurfaceOptions3D o = size == 24 ? SurfaceOptions3D{1, 1, 1, 1} : SurfaceOptions3D{2.5, 0.8, 0.8, 2};
      std::vector<SurfaceValues> cpu, gpu;
      ClassSurfaceMetrics3D(pred.v.data(), ref.v.data(), d, h, w, labels, kIgnoredPixel, o, &cpu, 2);
      ASSERT_EQ(ClassSurfaceMetrics3DOnDevice(pred.v.data(), ref.v.data(), d, h, w, labels, kIgnoredPixel, o, &gpu, 0,
                                              4),
                "")
          << test::KindName(kind);
      SCOPED_TRACE(test::KindName(kind));
      ExpectSameBits(cpu, gpu, trial++);
    }
  }
}

}  // namespace
}  // namespace tally
