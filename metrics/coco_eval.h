// COCO's instance-segmentation metrics (pycocotools' COCOeval, iouType 'segm', default parameters),
// split the way Tally runs them: each image is evaluated on its own (EvaluateCocoImage, on a
// worker), the per-image records are accumulated over every image in image-id order
// (AccumulateCoco, on the coordinator), and the 12 summary numbers and per-category AP read off
// (SummarizeCoco). The result does not depend on how the images were split or in which order their
// records arrived.
//
// Definitions (COCOeval's, to the last bit):
//   Parameters: IoU thresholds numpy.linspace(0.5, 0.95, 10) (the 9th is 0.8999999999999999),
//   recall thresholds numpy.linspace(0, 1, 101), area ranges all [0, 1e10], small [0, 1024],
//   medium [1024, 9216], large [9216, 1e10] (bounds inclusive, on the reference's `area` field and
//   the detection's pixel area), maxDets 1, 10, 100.
//   Per image and category: detections sorted by score, best first (ties keep their input order),
//   the first 100 kept; references not crowd and inside the area range first, the others after
//   (stable). At each threshold t, each detection in turn takes the reference with the highest IoU
//   >= min(t, 1 - 1e-10) among those not yet taken (crowd references may be taken again), looking
//   at ignored references only when no regular one matched. A detection matched to an ignored
//   reference, or unmatched with its area outside the range, is ignored.
//   Accumulation per category, area range and maxDets m: the first m detections of every image,
//   concatenated in image-id order and sorted by score (stable); true and false positives summed;
//   recall = TP / (references not ignored); precision = TP / (TP + FP + 2^-52), made non-increasing
//   from the right; at each recall threshold r, the precision at the first point with recall >= r
//   (0 past the last). -1 where the category has no reference not ignored in that range.
//   Summary: the mean of the entries > -1 (numpy's summation order: pairwise within blocks of 8192
//   values, the blocks added in turn), -1 when there are none.
//   AP per category: the same mean over that category's precision (all areas, 100 detections).
#ifndef TALLY_METRICS_COCO_EVAL_H_
#define TALLY_METRICS_COCO_EVAL_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tally {

struct CocoParams {
  std::vector<double> iou_thresholds;                    // T = 10
  std::vector<double> recall_thresholds;                 // R = 101
  std::vector<std::array<double, 2>> area_ranges;        // A = 4: all, small, medium, large
  std::vector<int> max_dets;                             // M = 3: 1, 10, 100
};
const CocoParams& CocoDefaultParams();

struct CocoReference {
  int64_t id = 0;
  double area = 0;  // The annotation's `area` field (not its pixel count).
  bool crowd = false;
};
struct CocoDetection {
  int64_t id = 0;
  double score = 0;
  double area = 0;  // Pixels of its mask.
};

// What becomes of a detection at one IoU threshold.
enum class CocoOutcome : uint8_t { kFalsePositive = 0, kTruePositive = 1, kIgnored = 2 };

// One image and category, evaluated at every area range.
struct CocoImageEval {
  int64_t image_id = 0;
  int64_t category_id = 0;
  std::vector<double> scores;  // The detections kept, best first.
  // outcome[(a * T + t) * D + d] for area range a, threshold t, detection d (D = scores.size()).
  std::vector<CocoOutcome> outcome;
  std::vector<int64_t> positives;  // Per area range: references not ignored.
  // References and detections as given (before the maxDets cut): for per-image reports.
  int64_t references = 0;
  int64_t detections = 0;
  // For pictures of the matching (report thumbnails), at the first threshold (IoU 0.5) and all
  // areas: each kept detection's index as given, and the reference it matched (index as given;
  // -1: none).
  std::vector<int64_t> kept;
  std::vector<int64_t> matched;
};

// `iou(d, g)`: the IoU of detections[d] with references[g] (indices as given). Called only for
// the detections kept.
CocoImageEval EvaluateCocoImage(int64_t image_id, int64_t category_id, const std::vector<CocoReference>& references,
                                const std::vector<CocoDetection>& detections,
                                const std::function<double(size_t d, size_t g)>& iou,
                                const CocoParams& params = CocoDefaultParams());

// COCOeval.eval: precision [T][R][K][A][M] and recall [T][K][A][M], row-major, -1 where undefined.
struct CocoAccumulated {
  std::vector<int64_t> category_ids;  // K, ascending.
  std::vector<double> precision;
  std::vector<double> recall;
  size_t T = 0, R = 0, K = 0, A = 0, M = 0;
  double Precision(size_t t, size_t r, size_t k, size_t a, size_t m) const {
    return precision[(((t * R + r) * K + k) * A + a) * M + m];
  }
  double Recall(size_t t, size_t k, size_t a, size_t m) const { return recall[((t * K + k) * A + a) * M + m]; }
};

// `evals`: every image and category record, in any order (at most one per image and category).
// `category_ids`: the categories of the reference set (COCOeval's catIds), each counted even
// where no image has it.
CocoAccumulated AccumulateCoco(const std::vector<const CocoImageEval*>& evals, std::vector<int64_t> category_ids,
                               const CocoParams& params = CocoDefaultParams());

// The 12 numbers, in COCOeval.stats order.
constexpr const char* kCocoStatNames[12] = {"AP", "AP50", "AP75", "APs", "APm", "APl",
                                            "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"};
std::array<double, 12> SummarizeCoco(const CocoAccumulated& acc, const CocoParams& params = CocoDefaultParams());
// AP of category index k (all areas, 100 detections): -1 where undefined.
double CocoCategoryAp(const CocoAccumulated& acc, size_t k);

// numpy.mean of `values` in numpy's summation order (exposed for the tests).
double NumpyMean(const std::vector<double>& values);

}  // namespace tally

#endif  // TALLY_METRICS_COCO_EVAL_H_
