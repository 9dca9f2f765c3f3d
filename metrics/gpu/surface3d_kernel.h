// 3D surface distances (hd, hd95, assd, nsd) on the GPU: the values of metrics/surface_distance.h's
// ClassSurfaceMetrics3D, to the bit.
//
// On the device: the upload (one byte a voxel where the classes number at most 254: the ignore
// label as 255; staged through page-locked memory a slab at a time, each copied on as soon as it is
// staged), both maps' edge voxels of every class (the CPU's rule: 6-neighbourhood, outside and
// ignored voxels as background) grouped by class in ascending order, and per class and direction:
// every query's box search (the CPU's doubling radii and double-precision expression (dx*dx + dy*dy)
// + dz*dz, no fused multiply-add, correctly rounded square roots), the CPU's chunk budgets (which
// queries go to the separable transform: a prefix sum per chunk), the separable transform of those
// (metrics/far_transform.h, the CPU's arithmetic), and a sort of the distances for the order
// statistics (largest, the 95th percentile's two ranks, how many within the tolerance). On the
// host: each direction's sum in voxel order, as the CPU adds them.
//
// Kept between calls: page-locked host memory for the largest volume seen (staging and the
// distances on their way back) and a device memory pool of this file's own that holds up to 512 MiB.
// Thread-safe: calls take the device one at a time.
#ifndef TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_
#define TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "metrics/surface_distance.h"

namespace tally {

// pred, ref: host volumes (z, y, x), uploaded here. `device`: the CUDA device index. `threads`: the
// host's threads for the staging (at least 4) and the sums. Returns "" with `out` filled, or why it
// could not (no device, a CUDA error: the caller falls back to the CPU).
std::string ClassSurfaceMetrics3DOnDevice(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                                          int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                                          std::vector<SurfaceValues>* out, int device, int threads = 1);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_SURFACE3D_KERNEL_H_
