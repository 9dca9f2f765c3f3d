// Lesion-wise metrics of one class (or region) of a 2D image or a 3D volume: the BraTS 2023 rules
// (github.com/rachitsaluja/BraTS-2023-Metrics, eval.py get_LesionWiseScores /
// get_LesionWiseResults), or one-to-one matching at an IoU threshold as panoptica's
// NaiveThresholdMatching does.
//
// Lesions are connected components (metrics/connected_components.h) of the class's mask, with
// `connectivity` (0: full, 26 in 3D as BraTS's cc3d call, 8 in 2D).
//
// Dilation matching (BraTS, `iou_threshold` 0):
//   1. The reference mask is dilated `dilation` times with scipy's generate_binary_structure(rank,
//      2) (the 18-neighbourhood in 3D, the 8-neighbourhood in 2D); reference voxels lying in one
//      component of that dilation form one reference lesion (nearby lesions merge). `dilation` 0:
//      the reference's own components.
//   2. Each reference lesion is dilated again the same way; every predicted component with a voxel
//      in that dilation belongs to it (a component may belong to several lesions). Its Dice and
//      HD95 are those of the lesion against the union of its components; none: Dice 0, HD95 inf.
//   3. A predicted component belonging to no reference lesion (small ones included) is a false
//      positive lesion: Dice 0, HD95 `max_hd95`.
// IoU matching (`iou_threshold` > 0): reference lesions are the reference's components (no
// merging); (reference, prediction) pairs with IoU >= the threshold are matched greedily, highest
// IoU first (ties: lower reference, then lower prediction number), each lesion and component at
// most once; a matched lesion's Dice and HD95 are against its component; the rest as above.
//
// A reference lesion whose volume (voxels x the product of the spacing) is <= `min_volume` is left
// out (BraTS: 50 mm^3; 2 for BraTS-MET); its components are no false positives. HD95 is Tally's
// hd95 (metrics/surface_distance.h: MONAI's edges, numpy's percentile) with the image's spacing, an
// infinite one counted as `max_hd95` (BraTS: 374, about the diagonal of a 240x240x155 mm volume).
// BraTS's own HD95 is DeepMind's surfel-weighted robust Hausdorff: values differ slightly, Dice
// and counts do not. Per image, as BraTS:
//   lesion_dice = sum of counted lesions' Dice / (counted lesions + false positives), 0/0 -> 1;
//   lesion_hd95 = (sum of their HD95 + max_hd95 x false positives) / (same), 0/0 -> 0;
//   tp, fn: counted lesions with / without a component; fp: false positive components.
#ifndef TALLY_METRICS_LESION_H_
#define TALLY_METRICS_LESION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tally {

struct LesionOptions {
  int connectivity = 0;        // 0: full (26 / 8); 3D 6, 18, 26; 2D 4, 8.
  int dilation = 3;            // BraTS-GLI, -SSA, -PED: 3; -MEN, -MET: 1.
  double iou_threshold = 0;    // > 0: IoU matching instead of dilation.
  double min_volume = 50;      // In spacing units cubed (squared in 2D).
  double max_hd95 = 374;
  double spacing_z = 1, spacing_y = 1, spacing_x = 1;
  // >= 0: what the components may take beyond the voxels' own buffers (kLesionBytesPerComponent
  // each, both maps'); more fails with RESOURCE_EXHAUSTED once they are counted, before the per-
  // lesion work. -1: no limit.
  int64_t max_component_bytes = -1;
};

// What one component costs once counted: its size and box in each map's table, its record, its
// row in the result and the bookkeeping of matching (an upper bound).
inline constexpr int64_t kLesionBytesPerComponent = 256;

enum class LesionKind { kTruePositive, kFalseNegative, kFalsePositive, kSmall };
const char* LesionKindName(LesionKind k);  // tp | fn | fp | small

// One lesion: a reference lesion (number >= 1) or a false-positive component (number 0).
struct LesionRecord {
  LesionKind kind = LesionKind::kTruePositive;
  int32_t lesion = 0;      // Reference lesion number, in order of its first voxel; 0 for fp.
  int32_t component = 0;   // fp: the predicted component's number; else 0.
  int64_t voxels = 0;      // The lesion's (fp: the component's) voxels.
  double volume = 0;       // voxels x spacing product.
  int32_t matched = 0;     // Predicted components matched to it.
  int64_t matched_voxels = 0;
  double dice = 0;
  double hd95 = 0;         // Infinite when nothing matched (the summary counts max_hd95).
};

struct LesionSummary {
  int64_t lesions = 0;  // Counted reference lesions (tp + fn).
  int64_t tp = 0, fn = 0, fp = 0;
  int64_t small = 0;    // Reference lesions at or below min_volume.
  // Over counted lesions, in lesion order (an infinite HD95 as max_hd95); hd95_sum then adds
  // max_hd95 x fp, the false positives' share.
  double dice_sum = 0, hd95_sum = 0;
};

// Lesions of one class: `pred` and `ref` are depth x height x width masks (nonzero = inside; depth 1
// for 2D). Fills `summary` and, when not null, `records` (reference lesions by number, then false
// positives by component). INVALID_ARGUMENT for a connectivity the dimension lacks.
absl::Status ComputeLesions(const uint8_t* pred, const uint8_t* ref, int depth, int height, int width,
                            const LesionOptions& options, LesionSummary* summary, std::vector<LesionRecord>* records);

// lesion_dice and lesion_hd95 (the formulas above) from the counted lesions, the false positives and
// the summary's sums: one image's, or the sums of several images (the aggregator's pooled values).
double LesionDice(int64_t lesions, int64_t fp, double dice_sum);
double LesionHd95(int64_t lesions, int64_t fp, double hd95_sum);
inline double LesionDice(const LesionSummary& s) { return LesionDice(s.lesions, s.fp, s.dice_sum); }
inline double LesionHd95(const LesionSummary& s) { return LesionHd95(s.lesions, s.fp, s.hd95_sum); }

}  // namespace tally

#endif  // TALLY_METRICS_LESION_H_
