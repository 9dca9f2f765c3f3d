// Calibration of prediction manifests (docs/metrics.md "Calibration"): each row's probability map,
// a 16-bit grayscale PNG whose value v gives class 1's probability v / 65535 (class 0's: 1 minus
// it, in float32 as a model's single logit gives them), counted against the row's reference and
// predicted labels as a model's probabilities are (metrics/calibration.h).
#ifndef TALLY_WORKER_SCORING_PROBABILITIES_H_
#define TALLY_WORKER_SCORING_PROBABILITIES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/formats/image_formats.h"
#include "proto/tally.pb.h"

namespace tally {

// Reads `path` (at most `max_pixels` pixels; it must be 2D and the reference's size) and sets
// `result`'s calibration values and, sparse, its fine histogram (covers left to the caller). The row
// has `classes` classes, which must be 2. Errors name the file and what is wrong.
absl::Status CountRowProbabilities(const std::string& path, int64_t max_pixels, const LabelMap& ref,
                                   const LabelMap& pred, int classes, v1::ImageResult* result);

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_PROBABILITIES_H_
