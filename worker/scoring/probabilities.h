// Calibration of prediction manifests (docs/metrics.md "Calibration"): each row's probability map
// of class 1 (class 0's: 1 minus it, in float32 as a model's single logit gives them): a 16-bit
// grayscale PNG whose value v is the probability v / 65535, or a NIfTI volume of floats (after its
// header's scaling, as float32) in [0, 1] with its reference's geometry; counted against the row's
// reference and predicted labels as a model's probabilities are (metrics/calibration.h).
#ifndef TALLY_WORKER_SCORING_PROBABILITIES_H_
#define TALLY_WORKER_SCORING_PROBABILITIES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/formats/image_formats.h"
#include "common/formats/volume.h"
#include "proto/tally.pb.h"

namespace tally {

// Reads `path` (at most `max_pixels` voxels; of the reference's size, and for a volume its
// geometry) and sets `result`'s calibration values and, sparse, its fine histogram (covers left to
// the caller). The row has `classes` classes, which must be 2. Errors name the file and what is wrong.
absl::Status CountRowProbabilities(const std::string& path, int64_t max_pixels, const LabelMap& ref,
                                   const VolumeGeometry& ref_geometry, const std::string& ref_name,
                                   const LabelMap& pred, int classes, v1::ImageResult* result);

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_PROBABILITIES_H_
