// Dataset-level aggregation of per-image results. Results may come in any order and be split over
// several aggregators joined with Merge: every number is the same, to the bit, whatever the order,
// the split, the number of workers or the shard size (sums are exact, ExactSum; the interval reads
// the rows in an order fixed by the rows alone; percentiles sort). So tallyd keeps a job's aggregate up to date as
// its rows arrive, and the end of the job only reads it out.
//
// Per class and selected metric:
//   <m>_mean       mean over images, NaN skipped, +/-inf skipped and counted in <m>_inf_count: the
//                  exact sum of the values rounded once, divided by their count;
//   <m>_global     count metrics only: the metric of the counts summed over the dataset (micro);
//   <m>_median/p95 surface metrics only: percentiles across images (linear interpolation), NaN
//                  skipped, inf kept (an image with an empty mask is infinitely far off);
//   lesion_<m>_global lesion metrics: the metric of the lesion counts and sums pooled over images
//                  (lesion_dice: all Dice over all counted lesions and false positives);
//   dice_mean_ci95 the betting interval of the mean over images (metrics/bounded_mean.h: valid at any
//                  number of images and for skewed sets, none below kMinIntervalRows), read in an
//                  order of the rows alone, never their values: AggregateOptions::interval says
//                  which. kRows (a finished job's every row): the rows as independent draws of the
//                  images they stand for, ordered by their row key (RowKey of the id), so that the
//                  interval depends on the set of rows, not on their order, split or merge. kSample
//                  (--sample, --until-ci, a random-order job's rows so far): a uniform random sample
//                  without replacement of the manifest, in the order it was drawn (positions),
//                  finite-population corrected. kNone (a manifest-order job's rows so far, which no
//                  random process chose): no interval. At most about kMaxIntervalRows rows enter it: for
//                  kRows those whose key lies below IntervalSample::HashKeyLimit of the job's rows
//                  (a uniform subsample fixed by the rows), for kSample the first positions (a
//                  random sample itself).
// With empty_score kOne, an image whose prediction and reference of a class are both empty scores 1
// for that class's dice and iou (LISA/ReLA) instead of NaN (nnU-Net/MONAI). iou_ge[t]: the share of
// images with IoU >= t among those whose IoU is defined (ReLA's Pr@t). Threshold sweep: per
// threshold of JobSpec.thresholds, dice and iou of the foreground class (class 1) from each image's
// counts at that threshold.
// foreground_<m>_mean: mean of the per-class <m>_mean over foreground classes (class 0 is
// background unless include_background), NaN class means skipped.
#ifndef TALLY_METRICS_AGGREGATOR_H_
#define TALLY_METRICS_AGGREGATOR_H_

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "metrics/bounded_mean.h"
#include "metrics/exact_sum.h"
#include "metrics/overlap.h"
#include "metrics/statistics.h"
#include "proto/tally.pb.h"

namespace tally {

// What the Dice interval stands for (see dice_mean_ci95 above).
enum class IntervalKind { kRows, kSample, kNone };

struct AggregateOptions {
  int num_classes = 0;
  std::vector<Metric> metrics;  // Canonical order (ParseMetricNames).
  bool include_background = false;
  IntervalKind interval = IntervalKind::kRows;
  // The manifest's rows: kSample's rows are a uniform random sample of them; kRows keeps a
  // subsample of its row keys by their number (IntervalSample::HashKeyLimit).
  double population_rows = 0;
  EmptyScore empty_score = EmptyScore::kNaN;
  std::vector<double> iou_thresholds;
  std::vector<double> thresholds;  // Results carry counts at each (ImageResult.thresholds).
};

struct ThresholdAggregate {
  double threshold = 0;
  double dice_mean = 0, dice_global = 0, iou_mean = 0, iou_global = 0;
};

struct MetricAggregate {
  double mean = 0;
  int64_t count = 0;      // Finite values that entered the mean.
  int64_t inf_count = 0;
  double global = 0;      // Count and lesion metrics.
  double median = 0;      // Surface metrics.
  double p95 = 0;
};

// Per-image distributions in the reports: this many equal bins.
inline constexpr int kHistogramBins = 20;

// One metric's per-image values of one class, binned: over [0, 1] for count metrics and the lesion
// metrics in [0, 1] (dice, sensitivity, precision, f1), over [0, max] of the finite values for
// surface distances and lesion counts and HD95 (infinities are in inf_count).
struct Histogram {
  double max = 1;
  std::array<int64_t, kHistogramBins> bins{};
};

struct ClassAggregate {
  int class_id = 0;
  ConfusionCounts counts;
  std::array<MetricAggregate, kNumMetrics> metrics;
  double dice_ci_low = 0;
  double dice_ci_high = 0;
  int64_t dice_zero_images = 0;                // Images whose Dice is exactly 0.
  std::vector<std::pair<double, int64_t>> worst;  // Up to 10 lowest (dice, index), ascending.
  std::vector<double> iou_ge;                  // Per AggregateOptions::iou_thresholds; NaN: no image.
  int64_t reference_images = 0;  // Images whose reference mask holds the class (tp + fn > 0).
  int64_t predicted_images = 0;  // Images where the model predicts it (tp + fp > 0).
  // In the foreground means: a foreground class (or region) present in at least one reference
  // mask. The same classes for every metric (docs/metrics.md "Aggregation").
  bool in_foreground_mean = false;
  std::array<Histogram, kNumMetrics> histograms;  // Of the selected metrics.
};

struct Aggregate {
  std::vector<ClassAggregate> classes;
  std::array<double, kNumMetrics> foreground_mean{};
  int64_t images = 0;
  std::vector<ThresholdAggregate> thresholds;  // Per AggregateOptions::thresholds.
  int best_threshold = -1;                     // Index of the highest dice_mean (first on ties); -1: none.
};

class Aggregator {
 public:
  explicit Aggregator(AggregateOptions options);

  // Adds one evaluated image, in any order; failed rows are not added. Per-image metric values
  // are computed here from the counts and surface values.
  // `order_key`: where the row comes in the interval's order: kRows, its row key (RowKey of its id,
  // so that merged parts give the whole job's interval; by default RowKey("#<index>")); kSample,
  // its position in the job's order (by default its index).
  void Add(const v1::ImageResult& result, std::optional<uint64_t> order_key = std::nullopt);
  // Adds what `other` (built with the same options) was given: as if its rows had been added here.
  void Merge(const Aggregator& other);
  Aggregate Finish() const;
  int64_t images() const { return images_; }

  // Per-image value of a metric for class `c` of `result` (NaN if not computable).
  static double ImageMetric(const v1::ImageResult& result, int c, Metric m, EmptyScore empty = EmptyScore::kNaN);

 private:
  struct PerClass {
    ConfusionCounts counts;
    std::vector<ExactSum> sum;  // Per selected metric (options_.metrics order).
    std::array<int64_t, kNumMetrics> count{};
    std::array<int64_t, kNumMetrics> inf_count{};
    std::array<std::vector<double>, kNumMetrics> values;  // Kept for surface metrics (percentiles).
    IntervalSample dice_interval;  // The Dice values with their order keys.
    int64_t dice_zero = 0;
    std::vector<std::pair<double, int64_t>> worst;         // A max-heap of the 10 lowest (dice, index).
    int64_t iou_defined = 0;
    std::vector<int64_t> iou_ge;
    int64_t reference_images = 0;
    int64_t predicted_images = 0;
    int64_t lesion_rows = 0;                              // Rows scored lesion by lesion for this class.
    int64_t lesion_tp = 0, lesion_fn = 0, lesion_fp = 0;  // Lesion metrics' pooled values.
    ExactSum lesion_dice_sum, lesion_hd95_sum;
    std::array<std::array<int64_t, kHistogramBins>, kNumMetrics> unit_bins{};  // Values in [0, 1] (UnitRange).
  };
  // One metric value of an image into its class (Add's per-metric part).
  void AddValue(PerClass* pc, size_t metric_slot, Metric m, double v, int64_t index, uint64_t order_key);
  // One class's aggregate from its sums and values (Finish's per-class part).
  ClassAggregate FinishClass(int c) const;
  // Its Dice interval and worst rows.
  void FinishDice(int c, ClassAggregate* ca) const;
  void FinishThresholds(Aggregate* out) const;

  struct PerThreshold {
    ConfusionCounts counts;
    ExactSum dice_sum, iou_sum;
    int64_t dice_n = 0, iou_n = 0;
  };
  std::vector<PerThreshold> thresholds_;

  AggregateOptions options_;
  std::vector<PerClass> classes_;
  int64_t images_ = 0;
};

}  // namespace tally

#endif  // TALLY_METRICS_AGGREGATOR_H_
