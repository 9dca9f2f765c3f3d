// The GPU calibration counts (metrics/gpu/calibration_kernel.cu) against the CPU's CountCalibration, to
// the integer: on probabilities given, drawn to crowd the fine histogram's ends (0 and 1), with NaN,
// exact bin edges, ignored pixels, labels out of range and more classes than a warp; and on logits
// (the kernel's softmax and argmax, a single logit's probability), counted on the CPU from the
// probabilities and labels the kernel computed, which equal an independent softmax and argmax here to
// float rounding. Skipped without a GPU.
#include <algorithm>
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
  CalibrationInput in;
  in.probs = probs.data();
  in.pred = pred.data();
  in.ref = ref.data();
  in.n = n;
  in.k = k;
  in.hw = hw;
  const std::string error = CalibrationOnDeviceSync(in, grows.data(), gfine.data(), fine_images);
  if (error == "no CUDA device") GTEST_SKIP() << error;
  ASSERT_EQ(error, "");
  EXPECT_EQ(grows, rows) << "n " << n << " k " << k << " hw " << hw;
  EXPECT_EQ(gfine, fine) << "n " << n << " k " << k << " hw " << hw;
}

// Logits (channels = k, or one for k = 2), with ties, NaN and infinities among them.
void ExpectSameFromLogits(uint64_t seed, int n, int channels, int64_t hw) {
  const int k = channels == 1 ? 2 : channels;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 3);
  std::vector<float> logits(static_cast<size_t>(n) * channels * hw);
  for (float& l : logits) {
    const uint64_t r = rng() % 1000;
    l = r == 0 ? std::nanf("") : r == 1 ? INFINITY : r < 20 ? 1.5f : g(rng);
  }
  std::vector<float> one;
  if (channels == 1) {
    for (float l : logits) one.push_back(1.0f / (1.0f + std::exp(-l)));
  }
  std::vector<int16_t> ref(static_cast<size_t>(n) * hw);
  for (int16_t& r : ref) r = static_cast<int16_t>(static_cast<int>(rng() % (k + 2)) - 1);
  CalibrationInput in;
  in.logits = logits.data();
  in.channels = channels;
  in.one = channels == 1 ? one.data() : nullptr;
  in.ref = ref.data();
  in.n = n;
  in.k = k;
  in.hw = hw;
  std::vector<int64_t> grows(static_cast<size_t>(n) * CalibrationRowSize(k)), gfine(CalibrationFineSize(k));
  std::vector<float> probs(static_cast<size_t>(n) * k * hw);
  std::vector<int16_t> pred(ref.size());
  const std::string error = CalibrationOnDeviceSync(in, grows.data(), gfine.data(), -1, probs.data(), pred.data());
  if (error == "no CUDA device") GTEST_SKIP() << error;
  ASSERT_EQ(error, "");
  // The kernel's probabilities and labels against a softmax and argmax written here.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t x = 0; x < hw; ++x) {
      const auto logit = [&](int c) { return logits[(i * channels + c) * hw + x]; };
      int label = 0;
      if (channels == 1) {
        label = logit(0) > 0 ? 1 : 0;
      } else {
        for (int c = 1; c < channels && !std::isnan(logit(label)); ++c) {
          if (logit(c) > logit(label) || std::isnan(logit(c))) label = c;
        }
      }
      ASSERT_EQ(pred[i * hw + x], label) << "image " << i << " pixel " << x;
      double m = -INFINITY, sum = 0;
      for (int c = 0; c < channels; ++c) m = std::max<double>(m, logit(c));
      for (int c = 0; c < channels; ++c) sum += std::exp(static_cast<double>(logit(c)) - m);
      for (int c = 0; c < k; ++c) {
        const double want = channels == 1 ? (c == 1 ? one[i * hw + x] : 1.0 - one[i * hw + x])
                                          : std::exp(static_cast<double>(logit(c)) - m) / sum;
        const float got = probs[(i * k + c) * hw + x];
        const bool nan_row = std::isnan(want);
        if (nan_row || std::isnan(got)) {
          EXPECT_TRUE(nan_row && std::isnan(got)) << "image " << i << " pixel " << x << " class " << c;
        } else {
          EXPECT_NEAR(got, want, 1e-6) << "image " << i << " pixel " << x << " class " << c;
        }
      }
    }
  }
  std::vector<int64_t> rows(grows.size(), 0), fine(gfine.size(), 0);
  CountCalibration(probs.data(), ref.data(), pred.data(), n, k, hw, rows.data(), fine.data());
  EXPECT_EQ(grows, rows) << "n " << n << " channels " << channels << " hw " << hw;
  EXPECT_EQ(gfine, fine) << "n " << n << " channels " << channels << " hw " << hw;
}

TEST(CalibrationKernelTest, EqualsTheCpuCount) {
  ExpectSame(1, 3, 2, 1000);
  ExpectSame(2, 2, 3, 8192 + 77);  // Blocks of 8192 pixels and a ragged tail.
  ExpectSame(3, 1, 21, 50000);
  ExpectSame(4, 5, 40, 333);
  ExpectSame(5, 1, 1, 1);
  ExpectSame(6, 5, 2, 4000, 2);  // A store's padded batch: the last 3 images in no fine histogram.
}

TEST(CalibrationKernelTest, FromLogitsEqualsTheCpuCountOfTheKernelsProbabilities) {
  ExpectSameFromLogits(11, 3, 2, 8192 + 77);
  ExpectSameFromLogits(12, 2, 1, 5000);  // A single logit.
  ExpectSameFromLogits(13, 1, 21, 20000);
  ExpectSameFromLogits(14, 2, 3, 1);
}

}  // namespace
}  // namespace tally
