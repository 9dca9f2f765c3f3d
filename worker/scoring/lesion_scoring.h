// Lesion-wise metrics of a scored row (metrics/lesion.h) into its result: per foreground class (or
// every region) the class's masks in both maps, reference pixels equal to kIgnoredPixel outside
// both, then ClassResult's lesion_* fields and ImageResult.lesions. Used by every path that holds
// the row's two label maps on the host (prediction jobs, 2D model jobs, volume model jobs).
#ifndef TALLY_WORKER_SCORING_LESION_SCORING_H_
#define TALLY_WORKER_SCORING_LESION_SCORING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "metrics/lesion.h"
#include "proto/tally.pb.h"

namespace tally {

// `result` already holds its `classes` (one per class or region). `options` carries the row's
// spacing. Classes past result->classes_size() are skipped. INVALID_ARGUMENT (naming the
// connectivity) where the dimension lacks the job's connectivity.
absl::Status ScoreLesions(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                          const std::vector<std::vector<int>>& regions, bool include_background,
                          const LesionOptions& options, v1::ImageResult* result);

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_LESION_SCORING_H_
