// 3D surface distances (hd, hd95, assd, nsd) with the GPU doing the voxel work: the values of
// metrics/surface_distance.h's ClassSurfaceMetrics3D, to the bit.
//
// On the device: both maps' edge voxels of every class (the CPU's rule: 6-neighbourhood, outside
// and ignored voxels as background), compacted per class in ascending order; per class and
// direction, a bitmap of the other map's edges over their bounding box and, for every query voxel
// at once, the CPU's box search (the same doubling radii, the same double-precision expression
// (dx*dx + dy*dy) + dz*dz with no fused multiply-add, the same correctly rounded square root) with
// the voxels it tried. On the host, with the CPU's code (FinishDirected3D): the CPU's chunk budgets
// decide which queries go to the separable transform, which runs there, and the summaries (running
// sums in voxel order, percentiles) are the CPU's. Close predictions leave the host almost nothing
// to do; far ones cost what the CPU's separable transform costs for them.
//
// Thread-safe: calls take the device one at a time (the host's part runs outside).
#ifndef TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_
#define TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "metrics/surface_distance.h"

namespace tally {

// pred, ref: host volumes (z, y, x), uploaded here. `device`: the CUDA device index. `threads`: the
// host's share of the separable transform. Returns "" with `out` filled, or why it could not (no
// device, a CUDA error: the caller falls back to the CPU).
std::string ClassSurfaceMetrics3DOnDevice(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                                          int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                                          std::vector<SurfaceValues>* out, int device, int threads = 1);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_
