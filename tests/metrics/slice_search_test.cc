// The failing-slice search's statistics (metrics/slice_search.h): Student's t against scipy's values
// (written here), Benjamini-Hochberg and quantile bins worked by hand, and a search with one planted
// slice. tests/integration/test_slices.py checks the whole search against scipy on a real report.
#include "metrics/slice_search.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(SliceSearchTest, StudentTMatchesScipy) {
  // scipy.stats.t.cdf(t, df).
  const struct { double t, df, cdf; } cases[] = {
      {2.0, 10, 0.9633059826146297}, {-1.5, 3.5, 0.10890909350767256}, {0.3, 1, 0.5927735790777423},
      {-8, 2.2, 0.00574530594835289}, {1.96, 1e6, 0.9750019662073651}, {-40, 30, 6.863022597203181e-28}};
  for (const auto& c : cases) EXPECT_NEAR(StudentTCdf(c.t, c.df) / c.cdf, 1.0, 1e-10) << c.t << " " << c.df;
  EXPECT_NEAR(StudentTQuantile(0.975, 7.3), 2.345066736150929, 1e-9);  // scipy.stats.t.ppf
  EXPECT_TRUE(std::isnan(StudentTCdf(1, 0)));
}

TEST(SliceSearchTest, BenjaminiHochbergByHand) {
  // m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.04, 0.04, 0.5 (0.02 * 4 / 2 = 0.04, made monotone).
  const std::vector<double> adjusted = BenjaminiHochberg({0.03, 0.5, 0.01, 0.02});
  const std::vector<double> want = {0.04, 0.5, 0.04, 0.04};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(adjusted[i], want[i], 1e-15) << i;
  EXPECT_EQ(BenjaminiHochberg({0.9, 0.95})[1], 0.95);
}

TEST(SliceSearchTest, QuantileBinsPutInnerEdgesLow) {
  // numpy.quantile([5, 1, 3, 2, 4, 9, 7], [0, 0.5, 1]) = 1, 4, 9.
  const std::vector<std::string> bins = QuantileBins({"5", "1", "3", "2", "4", "9", "7", "x", ""}, 2);
  EXPECT_EQ(bins[0], "q2 [4, 9]");
  EXPECT_EQ(bins[1], "q1 [1, 4]");
  EXPECT_EQ(bins[4], "q1 [1, 4]");  // On the inner edge: the lower bin.
  EXPECT_EQ(bins[5], "q2 [4, 9]");
  EXPECT_EQ(bins[7], "");  // Not a number: no bin.
  EXPECT_EQ(bins[8], "");
}

TEST(SliceSearchTest, FindsThePlantedSliceAndFoldsItsParts) {
  // 240 rows: site A/B/C (80 each), scanner X/Y alternating. Site C scores 0.5, the rest 0.9, with
  // a little spread so variances are not zero.
  std::vector<double> values;
  SliceAttribute site{"site", {}}, scanner{"scanner", {}};
  for (int i = 0; i < 240; ++i) {
    site.values.push_back(std::string(1, "ABC"[i / 80]));
    scanner.values.push_back(i % 2 ? "X" : "Y");
    values.push_back((i / 80 == 2 ? 0.5 : 0.9) + 0.01 * (i % 7));
  }
  values[5] = std::nan("");  // Left out.
  const SliceSearch s = FindSlices(values, {site, scanner}, SliceOptions{});
  EXPECT_EQ(s.rows, 239);
  EXPECT_EQ(s.candidates, 5 + 6);  // 3 + 2 values, 3 x 2 pairs.
  EXPECT_EQ(s.tested, 11);
  ASSERT_EQ(s.slices.size(), 1u);
  const Slice& c = s.slices[0];
  EXPECT_EQ(c.name, "site=C");
  EXPECT_EQ(c.rows, 80);
  EXPECT_EQ(c.test, "welch");
  EXPECT_LT(c.effect, -0.39);
  EXPECT_EQ(c.folded, (std::vector<std::string>{"site=C & scanner=X", "site=C & scanner=Y"}));
  EXPECT_EQ(c.worst_rows.size(), 5u);
  EXPECT_EQ(c.worst_rows[0], 161);  // i % 7 == 0 first: 161, 168, ...
}

}  // namespace
}  // namespace tally
