// Confusion counts of a predicted label map (2D or 3D) against a reference, on the CPU: what
// prediction jobs (no model) count instead of the GPU kernel. Reference pixels equal to
// kIgnoredPixel (common/image_io.h) leave every count, as in the model path.
#ifndef TALLY_COMMON_LABEL_COUNTS_H_
#define TALLY_COMMON_LABEL_COUNTS_H_

#include <cstdint>
#include <vector>

#include "common/metrics.h"

namespace tally {

// Per class in [0, num_classes): labels of either map at or above num_classes (other than an
// ignored reference pixel) must not occur; the caller checks (LabelsBelow).
void CountClasses(const uint16_t* pred, const uint16_t* ref, int64_t n, int num_classes,
                  std::vector<ConfusionCounts>* out);

// Per region, each a sorted list of labels: a pixel is in the region when its label is one of
// them (nnU-Net's region_or_label_to_mask), in the prediction and in the reference alike.
void CountRegions(const uint16_t* pred, const uint16_t* ref, int64_t n, const std::vector<std::vector<int>>& regions,
                  std::vector<ConfusionCounts>* out);

// Index of the first label >= limit in `labels` (kIgnoredPixel aside), or -1.
int64_t FirstLabelAtOrAbove(const uint16_t* labels, int64_t n, int limit);
// The largest label (kIgnoredPixel aside), or -1.
int MaxLabel(const uint16_t* labels, int64_t n);

}  // namespace tally

#endif  // TALLY_COMMON_LABEL_COUNTS_H_
