// The GPU calibration counts (metrics/gpu/calibration_kernel.cu) against the CPU's CountCalibration, to
// the integer, on probabilities drawn to crowd the fine histogram's ends (0 and 1), with NaN, exact
// bin edges, ignored pixels, labels out of range and more classes than a warp. Skipped without a GPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/calibration.h"
#include "metrics/gpu/calibration_kernel.h"

namespace tally {
namespace {

void ExpectSame(uint64_t seed, int n, int k, int64_t hw, int64_t fine_images = -1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> probs(static_cast<size_t>(n) * k * hw);
  for (float& p : probs) {
    const float r = u(rng);
    p = r < 0.3f ? 0.f : r < 0.5f ? 1.f : r < 0.52f ? std::nanf("") : r < 0.55f ? 1.f / 15 * (rng() % 16) : u(rng);
  }
  std::vector<int16_t> ref(static_cast<size_t>(n) * hw), pred(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = static_cast<int16_t>(static_cast<int>(rng() % (k + 2)) - 1);  // -1 (ignored) .. k (out of range).
    pred[i] = static_cast<int16_t>(rng() % k);
  }
  std::vector<int64_t> rows(static_cast<size_t>(n) * CalibrationRowSize(k), 0), fine(CalibrationFineSize(k), 0);
  CountCalibration(probs.data(), ref.data(), pred.data(), n, k, hw, rows.data(), fine.data(), fine_images);
  std::vector<int64_t> grows(rows.size(), -1), gfine(fine.size(), -1);
  const std::string error =
      CalibrationOnDeviceSync(probs.data(), ref.data(), pred.data(), n, k, hw, grows.data(), gfine.data(), fine_images);
  if (error == "no CUDA device") GTEST_SKIP() << error;
  ASSERT_EQ(error, "");
  EXPECT_EQ(grows, rows) << "n " << n << " k " << k << " hw " << hw;
  EXPECT_EQ(gfine, fine) << "n " << n << " k " << k << " hw " << hw;
}

TEST(CalibrationKernelTest, EqualsTheCpuCount) {
  ExpectSame(1, 3, 2, 1000);
  ExpectSame(2, 2, 3, 8192 + 77);  // Blocks of 8192 pixels and a ragged tail.
  ExpectSame(3, 1, 21, 50000);
  ExpectSame(4, 5, 40, 333);
  ExpectSame(5, 1, 1, 1);
  ExpectSame(6, 5, 2, 4000, 2);  // A store's padded batch: the last 3 images in no fine histogram.
}

}  // namespace
}  // namespace tally
