// Calibration counts on the GPU (metrics/calibration.h): per image the coarse bins of every
// histogram, per batch the fine histogram, in one pass over the probabilities, the same integers as
// CountCalibration on the CPU.
#ifndef TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_
#define TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_

#include <cstdint>
#include <string>

namespace tally {

// probs [n, k, hw] float32, ref and pred [n, hw] int16; adds to rows [n][CalibrationRowSize(k)]
// and fine [CalibrationFineSize(k)] (both int64, zeroed by the caller; only the first `fine_images`
// images count there, -1: all). Enqueued on `stream` (a cudaStream_t); false when the launch failed
// or n is out of range.
bool LaunchCalibration(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k, int64_t hw,
                       int64_t* rows, int64_t* fine, void* stream, int64_t fine_images = -1);

// For tests: the same from host arrays, synchronously (device memory allocated and freed here);
// rows and fine are overwritten. Returns "" or what failed ("no CUDA device" when none is visible).
std::string CalibrationOnDeviceSync(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k,
                                    int64_t hw, int64_t* rows, int64_t* fine, int64_t fine_images = -1);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_
