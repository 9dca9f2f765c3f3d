// Surface-distance metrics (hd, hd95, assd, nsd) on the GPU, from the label maps the confusion
// kernel leaves on the device: the values of metrics/surface_distance.h's ClassSurfaceMetrics, to
// the bit, for every image and class of a batch.
//
// Exactness: the CPU's distances are min over feature columns c of sx^2 (x - c)^2 + sy^2 g(y, c)^2
// (g: the vertical gap to the column's nearest feature), each product and sum rounded once in
// double precision; the kernels evaluate the same expression in the same order with explicit
// round-to-nearest intrinsics (no fused multiply-add), take the same minimum and the correctly
// rounded square root. The per-set sum is a running sum in row-major order, as the CPU adds; the
// 95th percentile selects the same two order statistics (radix select on the doubles' bits) and
// interpolates as numpy; max, the tolerance count and the NaN/inf cases follow Summarise/Combine.
//
// Steps (all on `stream`, no host synchronisation): edge pixels of both maps (4-connected, pixels
// outside the image and ignored reference pixels are background) -> per 2048-pixel tile and class,
// edge counts -> their prefix sums (each class's edges get a row-major slot range) -> per class,
// the column gaps of the features (a down and an up sweep per column) -> per edge pixel, the
// distance, written to its slot -> per (image, direction, class): the summary -> per (image, class):
// the four values. Memory: see SurfaceScratchBytes (about 14 bytes per pixel of the batch plus 4
// per pixel and class of a class chunk).
#ifndef TALLY_METRICS_GPU_SURFACE_KERNEL_H_
#define TALLY_METRICS_GPU_SURFACE_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "metrics/surface_distance.h"

namespace tally {

// Classes and sizes the kernels take (labels are held in bytes, column gaps in 16 bits).
bool SurfaceKernelSupports(int num_classes, int64_t height, int64_t width);

// Device scratch that LaunchSurface needs for n images of height x width and `num_classes` classes.
size_t SurfaceScratchBytes(int64_t n, int64_t height, int64_t width, int num_classes);

// pred, ref: int16 [n, H, W] on the device (ref < 0: ignored pixel, outside every class's mask in
// both maps). out: double [n, K, 4] (hd, hd95, assd, nsd). `scratch` holds SurfaceScratchBytes and
// must stay untouched until the stream passes this work. Returns false when unsupported or a launch
// failed.
bool LaunchSurface(const int16_t* pred, const int16_t* ref, int64_t n, int64_t height, int64_t width, int num_classes,
                   const SurfaceOptions& options, void* scratch, double* out, void* stream);

// For tests and benchmarks: copies host label maps to the device, runs LaunchSurface on a stream of
// its own, waits and copies the values back (`out`: n x K x 4). Returns an empty string, or why it
// could not (no device, unsupported sizes, a CUDA error). `kernel_ms`, when not null, gets the
// device time of LaunchSurface's work.
std::string SurfaceOnDeviceSync(const int16_t* pred, const int16_t* ref, int64_t n, int64_t height, int64_t width,
                                int num_classes, const SurfaceOptions& options, double* out, double* kernel_ms);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_SURFACE_KERNEL_H_
