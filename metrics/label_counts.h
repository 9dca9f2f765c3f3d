// Confusion counts of a predicted label map (2D or 3D) against a reference, on the CPU: what
// prediction jobs (no model) count instead of the GPU kernel. Reference pixels equal to
// kIgnoredPixel leave every count, as in the model path.
#ifndef TALLY_METRICS_LABEL_COUNTS_H_
#define TALLY_METRICS_LABEL_COUNTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metrics/overlap.h"

namespace tally {

// What an ignored reference pixel holds once a worker has prepared a mask (common/formats/image_formats.h
// PrepareMask): -1 as int16, which every count leaves out whatever the job's ignore index was.
inline constexpr uint16_t kIgnoredPixel = 0xFFFF;

// Most classes (or regions) a job may have: results carry one entry per class.
inline constexpr int kMaxClasses = 4096;
// A job's ignore index when no label is ignored.
inline constexpr int kNoIgnoreIndex = -1;

// Per class in [0, num_classes): labels of either map at or above num_classes (other than an
// ignored reference pixel) must not occur; the caller checks (LabelsBelow).
void CountClasses(const uint16_t* pred, const uint16_t* ref, int64_t n, int num_classes,
                  std::vector<ConfusionCounts>* out);

// Per region, each a sorted list of labels: a pixel is in the region when its label is one of
// them (nnU-Net's region_or_label_to_mask), in the prediction and in the reference alike.
void CountRegions(const uint16_t* pred, const uint16_t* ref, int64_t n, const std::vector<std::vector<int>>& regions,
                  std::vector<ConfusionCounts>* out);

// The K x K confusion matrix of one image, added to `counts` (row = reference label, column =
// predicted label; labels in [0, k)): what the Python backend counts on the CPU. Ignored reference
// pixels and reference labels >= k are left out; predicted labels must be < k (the caller checks).
void CountConfusionMatrix(const uint16_t* pred, const uint16_t* ref, size_t n, int k, int64_t* counts);

// Per class c of a K x K confusion matrix (row = reference, column = prediction): TP the diagonal,
// FP its column's rest, FN its row's rest, TN everything else. The model path's counts.
void ClassCountsFromMatrix(const int64_t* matrix, int k, std::vector<ConfusionCounts>* out);

// Index of the first label >= limit in `labels` (kIgnoredPixel aside), or -1.
int64_t FirstLabelAtOrAbove(const uint16_t* labels, int64_t n, int limit);
// The largest label (kIgnoredPixel aside), or -1.
int MaxLabel(const uint16_t* labels, int64_t n);

// Labels narrowed to one byte each, as the device's 3D surface path uploads them when the classes
// number at most 254: a prediction's label v as min(v, 255); a reference's as 255 where it equals
// `ignore`, else min(v, 254). (No class is 254 or 255 then, so the narrowed values keep every
// class, every ignored voxel, and every other value as a non-class.)
void NarrowPrediction(const uint16_t* labels, int64_t n, uint8_t* out);
void NarrowReference(const uint16_t* labels, int64_t n, uint16_t ignore, uint8_t* out);

}  // namespace tally

#endif  // TALLY_METRICS_LABEL_COUNTS_H_
