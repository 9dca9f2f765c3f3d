// Connected components of a binary mask, 2D or 3D: the ground of lesion-wise metrics.
//
// Definitions: voxels are neighbours when they share a face (3D connectivity 6, 2D 4), a face or an
// edge (18; 2D 8 is faces and corners), or a face, an edge or a corner (26). Components are numbered
// 1, 2, ... in the order of their first voxel in a row-major scan (z, then y, then x), as
// scipy.ndimage.label numbers a C-ordered array; 0 is outside the mask.
#ifndef TALLY_METRICS_CONNECTED_COMPONENTS_H_
#define TALLY_METRICS_CONNECTED_COMPONENTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

// Labels the components of `mask` (depth x height x width, row-major; depth 1 for a 2D image;
// nonzero bytes are inside) into `labels` (resized). Returns the number of components.
// INVALID_ARGUMENT for a connectivity the dimension does not have (3D: 6, 18, 26; 2D: 4, 8).
absl::StatusOr<int64_t> LabelComponents(const uint8_t* mask, int depth, int height, int width, int connectivity,
                                        std::vector<int32_t>* labels);

// Components per label of a label map (depth x height x width, row-major): pixels are neighbours
// when their labels are equal and they touch by a face, an edge or a corner (2D 8, 3D 26). Returns
// out[l] = the number of components of label l for l in 0..max_label; labels above max_label
// (the ignore value among them) belong to none. Works on runs of equal labels along x: linear in
// the pixels, its memory per run.
std::vector<int64_t> CountComponentsPerLabel(const uint16_t* labels, int depth, int height, int width, int max_label);

}  // namespace tally

#endif  // TALLY_METRICS_CONNECTED_COMPONENTS_H_
