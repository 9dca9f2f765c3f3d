// COCO instances as masks, and label maps painted from them (docs/instances.md "Instances"). No Protobuf here:
// the TorchScript runner's files include this (LibTorch's wheel carries other Protobuf headers).
// Implemented in common/coco/coco_instances.cc.
#ifndef TALLY_COMMON_IO_COCO_MASKS_H_
#define TALLY_COMMON_IO_COCO_MASKS_H_

#include <cstdint>
#include <vector>

#include "metrics/coco_rle.h"

namespace tally {

struct CocoInstance {
  int64_t id = 0;           // Annotation id; results: 1-based position in the file; models: 1-based index.
  int64_t category_id = 0;
  double score = 0;         // Detections.
  double area = 0;          // References: the `area` field.
  bool crowd = false;
  Rle mask;
};

// Detections at or above this score enter the semantic label map (docs/instances.md "Instances").
inline constexpr double kCocoSemanticScore = 0.5;
// Label maps (row-major, height x width) for the semantic metrics: references painted with their
// category id in the file's order (later ones on top, crowd regions included); detections with a
// score >= kCocoSemanticScore painted in ascending score (file order among ties), so the most
// confident is on top. Pixels of no instance are 0.
// `column_major`: the map column by column (as the RLEs run: far faster to paint) instead.
// `zeroed`: `labels` holds 0s already (the fill is skipped).
void PaintCocoLabels(const std::vector<CocoInstance>& instances, bool detections, int64_t height, int64_t width,
                     uint16_t* labels, bool column_major = false,
                     bool zeroed = false);
// Paints `value` where `mask` is set (row-major labels of the mask's size).
void PaintRle(const Rle& mask, uint16_t value, uint16_t* labels);

}  // namespace tally

#endif  // TALLY_COMMON_IO_COCO_MASKS_H_
