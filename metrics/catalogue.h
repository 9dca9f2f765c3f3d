// The metric catalogue: every per-image metric Tally reports, its name, and the canonical order of
// per_image.csv's columns and report.json's fields. Each family's definition and reference is in
// its own file: overlap.h (dice, iou, precision, recall, specificity, accuracy from confusion
// counts), surface_distance.h (hd, hd95, assd, nsd). docs/metrics.md "Metrics" has the full table and the
// comparison with MONAI, nnU-Net and torchmetrics.
#ifndef TALLY_METRICS_CATALOGUE_H_
#define TALLY_METRICS_CATALOGUE_H_

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  // Lesion-wise (metrics/lesion.h), per class: BraTS's lesion-wise Dice and HD95, and detection of
  // reference lesions (sensitivity tp/(tp+fn), precision tp/(tp+fp), F1, and the counts).
  kLesionDice,
  kLesionHd95,
  kLesionSensitivity,
  kLesionPrecision,
  kLesionF1,
  kLesionTp,
  kLesionFp,
  kLesionFn,
};
inline constexpr int kNumMetrics = 18;
inline constexpr std::array<Metric, kNumMetrics> kAllMetrics = {
    Metric::kDice,        Metric::kIou,      Metric::kPrecision, Metric::kRecall, Metric::kSpecificity,
    Metric::kAccuracy,    Metric::kHd,       Metric::kHd95,      Metric::kAssd,   Metric::kNsd,
    Metric::kLesionDice,  Metric::kLesionHd95, Metric::kLesionSensitivity, Metric::kLesionPrecision,
    Metric::kLesionF1,    Metric::kLesionTp, Metric::kLesionFp,  Metric::kLesionFn};

absl::string_view MetricName(Metric m);
// Metrics computed from the four confusion counts (as opposed to surface distances).
bool IsCountMetric(Metric m);
// Lesion-wise metrics: per-image values from the lesions of each class (ClassResult's lesion_*).
bool IsLesionMetric(Metric m);
inline bool IsSurfaceMetric(Metric m) { return !IsCountMetric(m) && !IsLesionMetric(m); }

// The default selection: dice,iou,precision,recall,hd95.
std::vector<Metric> DefaultMetrics();

// Parses a comma list of metric names (or "all": every per-pixel metric; "lesion": every lesion_
// metric). The result is in canonical order, without
// duplicates, and always contains dice and iou (per_image.csv always has those columns).
absl::StatusOr<std::vector<Metric>> ParseMetricList(absl::string_view list);
// Same, for names already split (JobSpec.metrics); an empty list means the default.
absl::StatusOr<std::vector<Metric>> ParseMetricNames(const std::vector<std::string>& names);
bool AnySurfaceMetric(const std::vector<Metric>& metrics);
// "calibration" in a metric list: not a per-class metric but the report's calibration section
// (metrics/calibration.h); the list's per-class metrics are the default where it names no other.
inline constexpr char kCalibrationMetric[] = "calibration";
bool IsCalibrationName(const std::string& name);
bool WantsCalibration(const std::vector<std::string>& names);
bool AnyLesionMetric(const std::vector<Metric>& metrics);

}  // namespace tally

#endif  // TALLY_METRICS_CATALOGUE_H_
