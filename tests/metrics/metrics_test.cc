#include "metrics/overlap.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tally {
namespace {

// Hand-worked: TP=3, FP=1, FN=2, TN=10.
TEST(MetricsTest, CountMetricsHandWorked) {
  ConfusionCounts c{3, 1, 2, 10};
  EXPECT_DOUBLE_EQ(Dice(c), 6.0 / 9.0);
  EXPECT_DOUBLE_EQ(Iou(c), 3.0 / 6.0);
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kPrecision, c), 0.75);
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kRecall, c), 0.6);
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kSpecificity, c), 10.0 / 11.0);
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kAccuracy, c), 13.0 / 16.0);
}

// nnU-Net: NaN only when reference and prediction are both empty.
TEST(MetricsTest, EmptyReferenceAndPrediction) {
  ConfusionCounts c{0, 0, 0, 25};
  EXPECT_TRUE(std::isnan(Dice(c)));
  EXPECT_TRUE(std::isnan(Iou(c)));
  EXPECT_TRUE(std::isnan(CountMetric(Metric::kPrecision, c)));
  EXPECT_TRUE(std::isnan(CountMetric(Metric::kRecall, c)));
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kSpecificity, c), 1.0);
  EXPECT_DOUBLE_EQ(CountMetric(Metric::kAccuracy, c), 1.0);
}

TEST(MetricsTest, EmptyReferenceNonEmptyPredictionIsZero) {
  ConfusionCounts c{0, 4, 0, 21};
  EXPECT_EQ(Dice(c), 0.0);
  EXPECT_EQ(Iou(c), 0.0);
  EXPECT_EQ(CountMetric(Metric::kPrecision, c), 0.0);
  EXPECT_TRUE(std::isnan(CountMetric(Metric::kRecall, c)));  // TP + FN = 0 (MONAI)
}

TEST(MetricsTest, AllDenominatorsZero) {
  ConfusionCounts c{0, 0, 0, 0};
  EXPECT_TRUE(std::isnan(CountMetric(Metric::kSpecificity, c)));
  EXPECT_TRUE(std::isnan(CountMetric(Metric::kAccuracy, c)));
}

TEST(MetricsTest, ParseListIsCanonicalAndAlwaysHasDiceIou) {
  auto m = ParseMetricList("hd95, precision");
  ASSERT_TRUE(m.ok());
  std::vector<Metric> want = {Metric::kDice, Metric::kIou, Metric::kPrecision, Metric::kHd95};
  EXPECT_EQ(*m, want);
  auto all = ParseMetricList("all");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 10u);  // Every per-pixel metric; lesion metrics by "lesion".
  EXPECT_FALSE(AnyLesionMetric(*all));
  auto lesion = ParseMetricList("lesion");
  ASSERT_TRUE(lesion.ok());
  EXPECT_EQ(lesion->size(), 10u);  // dice, iou and the 8 lesion metrics.
  EXPECT_EQ(lesion->at(2), Metric::kLesionDice);
  EXPECT_EQ(MetricName(lesion->back()), "lesion_fn");
  EXPECT_EQ(ParseMetricList("all,lesion")->size(), static_cast<size_t>(kNumMetrics));
  auto bad = ParseMetricList("dice,hausdorff");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hausdorff"), absl::string_view::npos);
  auto def = ParseMetricNames({});
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->size(), 5u);
  EXPECT_EQ(def->back(), Metric::kHd95);
}

}  // namespace
}  // namespace tally
