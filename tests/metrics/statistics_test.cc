// The Wilcoxon signed-rank p-value that tally compare reports, hand-worked.
#include "metrics/statistics.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(WilcoxonTest, HandWorkedWithTiesAndZeros) {
  // Non-zero differences 0.1, -0.2, 0.3, 0.3, 0.5, -0.05 (the 0 is dropped): ranks of |d| 2, 3, 4.5,
  // 4.5, 6, 1; W+ = 17; mean 6*7/4 = 10.5; variance 6*7*13/24 - (2^3 - 2)/48 = 22.625;
  // z = 6.5 / sqrt(22.625); p = erfc(z / sqrt 2) (scipy: 0.17177277759571152).
  const double p = WilcoxonSignedRankP({0.1, -0.2, 0.3, 0.3, 0.0, 0.5, -0.05});
  EXPECT_NEAR(p, std::erfc(6.5 / std::sqrt(22.625) / std::sqrt(2.0)), 1e-15);
  EXPECT_NEAR(p, 0.17177277759571152, 1e-12);
  EXPECT_TRUE(std::isnan(WilcoxonSignedRankP({0.0, 0.0})));
  // Symmetric differences: no evidence either way.
  EXPECT_DOUBLE_EQ(WilcoxonSignedRankP({1, -1, 2, -2}), 1.0);
}

}  // namespace
}  // namespace tally
