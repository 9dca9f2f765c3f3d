// Per-image, per-class segmentation metrics from confusion counts, and the metric catalogue.
//
// Conventions (README "Metrics" has the full table and the comparison with MONAI, nnU-Net and
// torchmetrics):
//   dice = 2TP / (2TP + FP + FN), iou = TP / (TP + FP + FN): NaN only when TP + FP + FN = 0
//   (nnU-Net v2); precision = TP / (TP + FP), recall = TP / (TP + FN),
//   specificity = TN / (TN + FP), accuracy = (TP + TN) / (TP + TN + FP + FN): NaN when the
//   denominator is 0 (MONAI).
#ifndef TALLY_COMMON_METRICS_H_
#define TALLY_COMMON_METRICS_H_

#include <array>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

// Canonical order: the order of per_image.csv columns and report.json fields.
enum class Metric : int {
  kDice = 0,
  kIou,
  kPrecision,
  kRecall,
  kSpecificity,
  kAccuracy,
  kHd,
  kHd95,
  kAssd,
  kNsd,
};
inline constexpr int kNumMetrics = 10;
inline constexpr std::array<Metric, kNumMetrics> kAllMetrics = {
    Metric::kDice,        Metric::kIou,      Metric::kPrecision, Metric::kRecall, Metric::kSpecificity,
    Metric::kAccuracy,    Metric::kHd,       Metric::kHd95,      Metric::kAssd,   Metric::kNsd};

absl::string_view MetricName(Metric m);
// Metrics computed from the four confusion counts (as opposed to surface distances).
bool IsCountMetric(Metric m);
inline bool IsSurfaceMetric(Metric m) { return !IsCountMetric(m); }

// The default selection: dice,iou,precision,recall,hd95.
std::vector<Metric> DefaultMetrics();

// Parses a comma list of metric names (or "all"). The result is in canonical order, without
// duplicates, and always contains dice and iou (per_image.csv always has those columns).
absl::StatusOr<std::vector<Metric>> ParseMetricList(absl::string_view list);
// Same, for names already split (JobSpec.metrics); an empty list means the default.
absl::StatusOr<std::vector<Metric>> ParseMetricNames(const std::vector<std::string>& names);
bool AnySurfaceMetric(const std::vector<Metric>& metrics);

struct ConfusionCounts {
  int64_t tp = 0;
  int64_t fp = 0;
  int64_t fn = 0;
  int64_t tn = 0;
  ConfusionCounts& operator+=(const ConfusionCounts& o) {
    tp += o.tp;
    fp += o.fp;
    fn += o.fn;
    tn += o.tn;
    return *this;
  }
};

double Dice(const ConfusionCounts& c);
double Iou(const ConfusionCounts& c);
// Value of a count metric (IsCountMetric(m) must hold).
double CountMetric(Metric m, const ConfusionCounts& c);

// Surface distances of one class in one image (see surface_distance.h).
struct SurfaceValues {
  double hd = 0;
  double hd95 = 0;
  double assd = 0;
  double nsd = 0;
};
double SurfaceMetric(Metric m, const SurfaceValues& s);

}  // namespace tally

#endif  // TALLY_COMMON_METRICS_H_
