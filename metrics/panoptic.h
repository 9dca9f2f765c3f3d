// Panoptic quality (Kirillov et al., "Panoptic Segmentation", CVPR 2019) as panopticapi's
// pq_compute defines it, split like COCOeval here: each image is evaluated on its own
// (EvaluatePanopticImage, on a worker) and the per-image records summed in a fixed order
// (SummarizePanoptic, on the coordinator).
//
// Definitions (panopticapi/evaluation.py):
//   Segment ids per pixel (a PNG's R + 256 G + 256^2 B); id 0 is void. The reference's segments
//   come with a category, `iscrowd` and an `area` (the JSON's, not recounted); a prediction's
//   areas are its pixel counts.
//   A reference segment (not crowd) and a predicted one of the same category match when
//   IoU = |G n P| / (|P| + area(G) - |G n P| - |void n P|) > 0.5; each match adds 1 to its
//   category's TP and its IoU to the category's IoU sum. Unmatched reference segments not crowd are
//   FN. An unmatched predicted segment is FP unless more than half of it lies on void or on its
//   category's crowd region (the last crowd segment listed for the category).
//   Per category with TP + FP + FN > 0: PQ = IoU sum / (TP + FP/2 + FN/2), SQ = IoU sum / TP (0
//   without TP), RQ = TP / (TP + FP/2 + FN/2); overall, things and stuff: the means over those
//   categories, in the order the reference file lists them.
//   Sums run in a fixed order: images in the order given, matches within an image by (reference
//   id, predicted id): panopticapi's order on one process (on several it sums per process first,
//   so its last digits vary with the machine's core count; Tally's do not).
#ifndef TALLY_METRICS_PANOPTIC_H_
#define TALLY_METRICS_PANOPTIC_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

struct PanopticSegment {
  uint32_t id = 0;
  int64_t category_id = 0;
  bool iscrowd = false;
  double area = 0;  // Reference segments: the JSON's `area`. Ignored for predictions.
};

struct PanopticCategory {
  int64_t id = 0;
  bool isthing = true;
};

// One image: its matches in order and its FP/FN per category.
struct PanopticImageStats {
  std::vector<std::pair<int64_t, double>> matches;  // (category, IoU), in (reference id, predicted id) order.
  std::map<int64_t, int64_t> fp, fn;
};

// `reference` and `prediction`: segment ids of `pixels` pixels. Errors (naming the segment): a
// predicted id in the map but not in `predicted_segments` or the reverse, a predicted segment of a
// category not in `categories`.
absl::StatusOr<PanopticImageStats> EvaluatePanopticImage(const uint32_t* reference, const uint32_t* prediction,
                                                         size_t pixels,
                                                         const std::vector<PanopticSegment>& reference_segments,
                                                         const std::vector<PanopticSegment>& predicted_segments,
                                                         const std::vector<PanopticCategory>& categories);

struct PqValues {
  double pq = 0, sq = 0, rq = 0;
  int n = 0;  // Categories counted (TP + FP + FN > 0). With none, pq, sq and rq are NaN.
};
struct PanopticCategoryResult {
  int64_t category_id = 0;
  double pq = 0, sq = 0, rq = 0;  // 0 where TP + FP + FN = 0.
  double iou_sum = 0;
  int64_t tp = 0, fp = 0, fn = 0;
};
struct PanopticSummary {
  PqValues all, things, stuff;
  std::vector<PanopticCategoryResult> per_category;  // In `categories` order.
};
// `images` in the job's order.
PanopticSummary SummarizePanoptic(const std::vector<const PanopticImageStats*>& images,
                                  const std::vector<PanopticCategory>& categories);

}  // namespace tally

#endif  // TALLY_METRICS_PANOPTIC_H_
