// Overlap metrics of one class in one image, from its confusion counts (the Dice/IoU family).
//
// Definitions (TP, FP, FN, TN: pixels or voxels of the class predicted and in the reference, predicted
// only, in the reference only, in neither; ignored reference pixels are in none of them):
//   dice        = 2TP / (2TP + FP + FN)        NaN when TP + FP + FN = 0 (nnU-Net v2; MONAI's
//   iou         = TP / (TP + FP + FN)          DiceMetric(ignore_empty=True) and MeanIoU agree)
//   precision   = TP / (TP + FP)               NaN when the denominator is 0 (MONAI's
//   recall      = TP / (TP + FN)               ConfusionMatrixMetric: ppv, tpr, tnr, acc)
//   specificity = TN / (TN + FP)
//   accuracy    = (TP + TN) / (TP + TN + FP + FN)
// Every value is one division of two doubles holding exact integer counts (< 2^53), so the result is
// the correctly rounded quotient: the same bits as numpy's and torchmetrics' float64 formulas.
// EmptyScore::kOne (LISA/ReLA's referring-segmentation convention) scores dice and iou 1 instead of
// NaN where prediction and reference are both empty. docs/metrics.md "Metrics" compares the conventions.
#ifndef TALLY_METRICS_OVERLAP_H_
#define TALLY_METRICS_OVERLAP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "metrics/catalogue.h"

namespace tally {

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

// What dice and iou of a class are for an image where prediction and reference are both empty.
enum class EmptyScore { kNaN, kOne };
absl::string_view EmptyScoreName(EmptyScore e);  // nan | one
absl::StatusOr<EmptyScore> ParseEmptyScore(absl::string_view name);

// Value of count metric `m` on one image under an empty-score convention: with kOne, dice and iou
// are 1 where prediction and reference are both empty.
double CountMetricWithEmpty(Metric m, const ConfusionCounts& c, EmptyScore empty);

}  // namespace tally

#endif  // TALLY_METRICS_OVERLAP_H_
