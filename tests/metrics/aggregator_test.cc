#include "metrics/aggregator.h"
#include "metrics/bounded_mean.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <limits>
#include <tuple>

#include "gtest/gtest.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::ImageResult Image(int64_t index, std::vector<std::array<int64_t, 4>> counts, std::vector<double> hd95) {
  v1::ImageResult r;
  r.set_index(index);
  for (size_t c = 0; c < counts.size(); ++c) {
    v1::ClassResult* cr = r.add_classes();
    cr->set_tp(counts[c][0]);
    cr->set_fp(counts[c][1]);
    cr->set_fn(counts[c][2]);
    cr->set_tn(counts[c][3]);
    cr->set_hd95(hd95[c]);
    cr->set_hd(kNaN);
    cr->set_assd(kNaN);
    cr->set_nsd(kNaN);
  }
  return r;
}

// Three images, two classes, worked by hand:
//   class 1: image 0 TP2 FP1 FN1 (dice 4/6), image 1 empty/empty (NaN), image 2 TP1 FP3 FN0 (dice 2/5)
//   hd95 of class 1: 2, NaN, inf.
class AggregatorTest : public ::testing::Test {
 protected:
  Aggregate Run(bool include_background) {
    AggregateOptions o;
    o.num_classes = 2;
    o.metrics = {Metric::kDice, Metric::kIou, Metric::kHd95};
    o.include_background = include_background;
    Aggregator agg(o);
    agg.Add(Image(0, {{6, 1, 1, 2}, {2, 1, 1, 6}}, {1.0, 2.0}));
    agg.Add(Image(1, {{10, 0, 0, 0}, {0, 0, 0, 10}}, {0.0, kNaN}));
    agg.Add(Image(2, {{6, 0, 3, 1}, {1, 3, 0, 6}}, {3.0, kInf}));
    return agg.Finish();
  }
};

TEST_F(AggregatorTest, MeansSkipNanAndGlobalsUseSummedCounts) {
  Aggregate a = Run(false);
  ASSERT_EQ(a.classes.size(), 2u);
  const ClassAggregate& c1 = a.classes[1];
  const auto& dice = c1.metrics[static_cast<int>(Metric::kDice)];
  EXPECT_DOUBLE_EQ(dice.mean, (4.0 / 6.0 + 2.0 / 5.0) / 2.0);
  EXPECT_EQ(dice.count, 2);
  EXPECT_DOUBLE_EQ(dice.global, 6.0 / 11.0);  // 2*3 / (2*3 + 4 + 1)
  const auto& iou = c1.metrics[static_cast<int>(Metric::kIou)];
  EXPECT_DOUBLE_EQ(iou.mean, (2.0 / 4.0 + 1.0 / 4.0) / 2.0);
  EXPECT_DOUBLE_EQ(iou.global, 3.0 / 8.0);
  EXPECT_EQ(c1.counts.tp, 3);
  EXPECT_EQ(c1.counts.fp, 4);
  EXPECT_EQ(c1.counts.fn, 1);
  EXPECT_EQ(c1.counts.tn, 22);
}

TEST_F(AggregatorTest, InfinityIsSkippedAndCounted) {
  Aggregate a = Run(false);
  const auto& hd95 = a.classes[1].metrics[static_cast<int>(Metric::kHd95)];
  EXPECT_DOUBLE_EQ(hd95.mean, 2.0);
  EXPECT_EQ(hd95.inf_count, 1);
  EXPECT_EQ(hd95.median, kInf);  // Median of {2, inf}: inf is kept for percentiles.
  const auto& hd95_bg = a.classes[0].metrics[static_cast<int>(Metric::kHd95)];
  EXPECT_DOUBLE_EQ(hd95_bg.mean, 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(hd95_bg.median, 1.0);
  EXPECT_DOUBLE_EQ(hd95_bg.p95, 2.8);  // numpy.percentile([0, 1, 3], 95) = 1 + 2 * 0.9
}

TEST_F(AggregatorTest, ForegroundMeansAndWorstCases) {
  Aggregate a = Run(false);
  const int d = static_cast<int>(Metric::kDice);
  EXPECT_DOUBLE_EQ(a.foreground_mean[d], a.classes[1].metrics[d].mean);
  ASSERT_EQ(a.classes[1].worst.size(), 2u);
  EXPECT_EQ(a.classes[1].worst[0].second, 2);
  EXPECT_DOUBLE_EQ(a.classes[1].worst[0].first, 0.4);
  Aggregate with_bg = Run(true);
  EXPECT_DOUBLE_EQ(with_bg.foreground_mean[d], (a.classes[0].metrics[d].mean + a.classes[1].metrics[d].mean) / 2);
}

TEST_F(AggregatorTest, NoDiceIntervalBelowTenRows) {
  Aggregate a = Run(false);  // Two images with a Dice for class 1.
  EXPECT_TRUE(std::isnan(a.classes[1].dice_ci_low));
  EXPECT_TRUE(std::isnan(a.classes[1].dice_ci_high));
}

// The interval kinds of aggregator.h: kRows reads the values by row key, kSample by position with the
// manifest as the population, kNone gives none.
TEST(AggregatorIntervalTest, EachKindReadsTheValuesAsDocumented) {
  std::vector<v1::ImageResult> rows;
  std::vector<double> dice;
  for (int i = 0; i < 40; ++i) {
    v1::ImageResult r;
    r.set_index(i);
    const int tp = 5 + (i * 7) % 11, fp = (i * 3) % 5, fn = (i * 5) % 4;
    v1::ClassResult* c = r.add_classes();
    c->set_tn(100);
    c = r.add_classes();
    c->set_tp(tp);
    c->set_fp(fp);
    c->set_fn(fn);
    c->set_tn(100 - tp - fp - fn);
    dice.push_back(2.0 * tp / (2.0 * tp + fp + fn));
    rows.push_back(r);
  }
  AggregateOptions o;
  o.num_classes = 2;
  o.metrics = {Metric::kDice};
  // kRows: in row-key order.
  Aggregator by_key(o);
  std::vector<std::pair<uint64_t, double>> keyed;
  for (int i = 0; i < 40; ++i) {
    const uint64_t key = RowKey("case" + std::to_string(i));
    by_key.Add(rows[i], key);
    keyed.emplace_back(key, dice[i]);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<double> in_key_order;
  for (const auto& e : keyed) in_key_order.push_back(e.second);
  const Aggregate a = by_key.Finish();
  EXPECT_EQ(a.classes[1].dice_ci_low, BettingMeanCi95(in_key_order).first);
  EXPECT_EQ(a.classes[1].dice_ci_high, BettingMeanCi95(in_key_order).second);
  // kSample: positions given (here the reverse of the indices), population 100 rows.
  o.interval = IntervalKind::kSample;
  o.population_rows = 100;
  Aggregator sample(o);
  for (int i = 0; i < 40; ++i) sample.Add(rows[i], static_cast<uint64_t>(39 - i));
  const std::vector<double> drawn(dice.rbegin(), dice.rend());
  const Aggregate b = sample.Finish();
  EXPECT_EQ(b.classes[1].dice_ci_low, BettingMeanCi95(drawn, 100).first);
  EXPECT_EQ(b.classes[1].dice_ci_high, BettingMeanCi95(drawn, 100).second);
  o.interval = IntervalKind::kNone;
  Aggregator none(o);
  for (const auto& r : rows) none.Add(r);
  EXPECT_TRUE(std::isnan(none.Finish().classes[1].dice_ci_low));
}

TEST(AggregatorConventions, EmptyScoreIouSharesAndThresholdSweep) {
  AggregateOptions o;
  o.num_classes = 2;
  o.metrics = {Metric::kDice, Metric::kIou};
  o.empty_score = EmptyScore::kOne;
  o.iou_thresholds = {0.5, 0.9};
  o.thresholds = {0.3, 0.7};
  Aggregator agg(o);
  // Image 0: class 1 tp 3 fp 1 fn 0 (iou 0.75); image 1: class 1 empty on both sides (1 under kOne).
  v1::ImageResult a = Image(0, {{{10, 0, 1, 3}}, {{3, 1, 0, 10}}}, {kNaN, kNaN});
  v1::ImageResult b = Image(1, {{{14, 0, 0, 0}}, {{0, 0, 0, 14}}}, {kNaN, kNaN});
  // Sweep counts: at 0.3 image 0 has tp 4 fp 2 fn 0, image 1 fp 2; at 0.7 image 0 tp 1 fn 3, image 1 empty.
  for (auto [r, t03, t07] : {std::tuple{&a, std::array<int64_t, 4>{4, 2, 0, 8}, std::array<int64_t, 4>{1, 0, 3, 10}},
                             std::tuple{&b, std::array<int64_t, 4>{0, 2, 0, 12}, std::array<int64_t, 4>{0, 0, 0, 14}}}) {
    for (const auto& c : {t03, t07}) {
      v1::ThresholdCounts* tc = r->add_thresholds();
      tc->set_tp(c[0]);
      tc->set_fp(c[1]);
      tc->set_fn(c[2]);
      tc->set_tn(c[3]);
    }
  }
  agg.Add(a);
  agg.Add(b);
  EXPECT_DOUBLE_EQ(Aggregator::ImageMetric(b, 1, Metric::kDice, EmptyScore::kOne), 1.0);
  EXPECT_TRUE(std::isnan(Aggregator::ImageMetric(b, 1, Metric::kDice, EmptyScore::kNaN)));
  Aggregate out = agg.Finish();
  const ClassAggregate& c1 = out.classes[1];
  EXPECT_DOUBLE_EQ(c1.metrics[static_cast<int>(Metric::kIou)].mean, (0.75 + 1.0) / 2);
  ASSERT_EQ(c1.iou_ge.size(), 2u);
  EXPECT_DOUBLE_EQ(c1.iou_ge[0], 1.0);  // 0.75 and 1 are >= 0.5
  EXPECT_DOUBLE_EQ(c1.iou_ge[1], 0.5);  // only the empty pair's 1 is >= 0.9
  ASSERT_EQ(out.thresholds.size(), 2u);
  // 0.3: dice 8/10 and 0 (tp 0, fp 2); global 2*4 / (2*4 + 4).
  EXPECT_DOUBLE_EQ(out.thresholds[0].dice_mean, (0.8 + 0.0) / 2);
  EXPECT_DOUBLE_EQ(out.thresholds[0].dice_global, 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(out.thresholds[0].iou_global, 4.0 / 8.0);
  // 0.7: dice 2/5 and 1 (empty pair); the best threshold by dice_mean.
  EXPECT_DOUBLE_EQ(out.thresholds[1].dice_mean, (0.4 + 1.0) / 2);
  EXPECT_EQ(out.best_threshold, 1);
}

TEST(AggregatorForeground, ClassesAbsentFromEveryReferenceLeaveEveryMean) {
  AggregateOptions o;
  o.num_classes = 3;
  o.metrics = {Metric::kDice, Metric::kIou, Metric::kHd95};
  Aggregator agg(o);
  agg.Add(Image(0, {{6, 1, 1, 2}, {2, 1, 1, 6}, {0, 2, 0, 8}}, {1.0, 2.0, kInf}));
  agg.Add(Image(1, {{6, 0, 3, 1}, {1, 3, 0, 6}, {0, 0, 0, 10}}, {3.0, 4.0, kNaN}));
  const Aggregate a = agg.Finish();
  EXPECT_EQ(a.classes[2].reference_images, 0);
  EXPECT_EQ(a.classes[2].predicted_images, 1);
  EXPECT_EQ(a.classes[1].reference_images, 2);
  EXPECT_EQ(a.classes[1].predicted_images, 2);
  EXPECT_FALSE(a.classes[0].in_foreground_mean);
  EXPECT_TRUE(a.classes[1].in_foreground_mean);
  EXPECT_FALSE(a.classes[2].in_foreground_mean);
  const int d = static_cast<int>(Metric::kDice);
  EXPECT_DOUBLE_EQ(a.classes[2].metrics[d].mean, 0.0);
  EXPECT_DOUBLE_EQ(a.foreground_mean[d], (4.0 / 6.0 + 2.0 / 5.0) / 2.0);
  EXPECT_DOUBLE_EQ(a.foreground_mean[static_cast<int>(Metric::kHd95)], 3.0);
}


// Random results (3 classes, counts, surface distances with NaN and inf, a threshold sweep): the
// aggregate of the rows in index order equals, to the bit, that of the same rows shuffled and
// split over three aggregators merged (what tallyd keeps as rows arrive from several workers).
TEST(AggregatorOrderTest, AnyOrderAndSplitGiveTheAggregateOfIndexOrder) {
  std::mt19937_64 rng(3);
  std::vector<v1::ImageResult> rows;
  for (int i = 0; i < 2000; ++i) {
    v1::ImageResult r;
    r.set_index(i);
    for (int c = 0; c < 3; ++c) {
      v1::ClassResult* cr = r.add_classes();
      const int64_t tp = rng() % 50, fp = rng() % 20, fn = rng() % 20;
      cr->set_tp(c == 2 && i % 7 == 0 ? 0 : tp);
      cr->set_fp(fp);
      cr->set_fn(c == 2 && i % 7 == 0 ? 0 : fn);
      cr->set_tn(1000);
      const double u = static_cast<double>(rng() % 100000) / 777.0;
      cr->set_hd95(i % 11 == 0 ? kInf : i % 13 == 0 ? kNaN : u);
      cr->set_hd(u + 1);
      cr->set_assd(u / 3);
      cr->set_nsd(static_cast<double>(rng() % 1000) / 999.0);
    }
    v1::ThresholdCounts* t = r.add_thresholds();
    t->set_tp(rng() % 10);
    t->set_fp(rng() % 10);
    t->set_fn(rng() % 10);
    rows.push_back(r);
  }
  AggregateOptions o;
  o.num_classes = 3;
  o.metrics = {Metric::kDice, Metric::kIou, Metric::kPrecision, Metric::kHd, Metric::kHd95, Metric::kAssd,
               Metric::kNsd};
  o.iou_thresholds = {0.5, 0.9};
  o.thresholds = {0.5};
  Aggregator in_order(o);
  for (const auto& r : rows) in_order.Add(r, RowKey("row" + std::to_string(r.index())));
  const Aggregate want = in_order.Finish();
  std::shuffle(rows.begin(), rows.end(), rng);
  std::vector<Aggregator> parts(3, Aggregator(o));
  for (size_t i = 0; i < rows.size(); ++i) parts[rng() % 3].Add(rows[i], RowKey("row" + std::to_string(rows[i].index())));
  parts[1].Merge(parts[2]);
  parts[0].Merge(parts[1]);
  const Aggregate got = parts[0].Finish();
  ASSERT_EQ(got.classes.size(), want.classes.size());
  EXPECT_EQ(got.images, want.images);
  for (size_t c = 0; c < want.classes.size(); ++c) {
    const ClassAggregate& a = want.classes[c];
    const ClassAggregate& b = got.classes[c];
    for (Metric m : o.metrics) {
      const int k = static_cast<int>(m);
      EXPECT_EQ(std::memcmp(&a.metrics[k], &b.metrics[k], sizeof(MetricAggregate)), 0) << "class " << c << " " << k;
      EXPECT_EQ(a.histograms[k].bins, b.histograms[k].bins);
      EXPECT_EQ(a.histograms[k].max, b.histograms[k].max);
    }
    EXPECT_EQ(a.dice_ci_low, b.dice_ci_low);
    EXPECT_EQ(a.dice_ci_high, b.dice_ci_high);
    EXPECT_EQ(a.worst, b.worst);
    EXPECT_EQ(a.iou_ge, b.iou_ge);
    EXPECT_EQ(a.dice_zero_images, b.dice_zero_images);
  }
  EXPECT_EQ(got.thresholds[0].dice_mean, want.thresholds[0].dice_mean);
  EXPECT_EQ(got.foreground_mean, want.foreground_mean);
  // The interval is the betting interval of the rows' Dice values in row-key order.
  std::vector<std::pair<uint64_t, double>> keyed;
  std::vector<double> dice;
  for (const auto& r : rows) {
    const double d = Aggregator::ImageMetric(r, 1, Metric::kDice);
    if (std::isnan(d)) continue;
    dice.push_back(d);
    keyed.emplace_back(RowKey("row" + std::to_string(r.index())), d);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<double> by_key;
  for (const auto& e : keyed) by_key.push_back(e.second);
  const std::pair<double, double> ci = BettingMeanCi95(by_key);
  EXPECT_EQ(want.classes[1].dice_ci_low, ci.first);
  EXPECT_EQ(want.classes[1].dice_ci_high, ci.second);
  // The mean is the exact mean: sum the Dice values as exact fractions of their common
  // denominators would; here a long double sum sorted ascending agrees to the double.
  std::sort(dice.begin(), dice.end());
  long double sum = 0;
  for (double d : dice) sum += d;
  EXPECT_NEAR(want.classes[1].metrics[static_cast<int>(Metric::kDice)].mean, static_cast<double>(sum / dice.size()),
              1e-15);
}

}  // namespace
}  // namespace tally
