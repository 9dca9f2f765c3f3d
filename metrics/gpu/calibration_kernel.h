// Calibration counts on the GPU (metrics/calibration.h): per image the coarse bins of every
// histogram, per batch the fine histogram, in one pass over each pixel (all K + 1 histograms at
// once), the same integers as CountCalibration on the CPU for the same probabilities.
#ifndef TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_
#define TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_

#include <cstdint>
#include <string>

namespace tally {

// What the kernel reads, for n images of hw pixels and k classes; one of three sources:
//  - logits [n, k, hw] float32 (channels = k >= 2): the softmax is computed here, in float32 (each
//    class's exp(l - max) over the sum of them), the top label is the logits' first maximum, NaN
//    counting as the maximum (the confusion kernel's rule);
//  - a single logit (channels = 1, k = 2): `one` [n, hw] holds class 1's probability (as the caller
//    computed it), class 0's is 1 - it in float32, the label is logit > 0;
//  - probabilities given: `probs` [n, k, hw] and the labels `pred` [n, hw] (clamped to [0, k)).
// The reference `ref` [n, hw] int16: < 0 or >= k left out. All contiguous, on the device.
struct CalibrationInput {
  const float* logits = nullptr;
  int channels = 0;
  const float* one = nullptr;
  const float* probs = nullptr;
  const int16_t* pred = nullptr;
  const int16_t* ref = nullptr;
  int64_t n = 0;
  int k = 0;
  int64_t hw = 0;
};

// The int64 scratch LaunchCalibration needs (its fine histogram packed a word a bin).
int64_t CalibrationScratchWords(int k);

// Adds to rows [n][CalibrationRowSize(k)] and fine [CalibrationFineSize(k)] (int64; only the first
// `fine_images` images count there, -1: all); `scratch` holds CalibrationScratchWords(k) int64
// (cleared here). Enqueued on `stream` (a cudaStream_t); false when nothing was launched (the input
// is out of the kernel's range: more than 907 classes, or 2^32 pixels or more in the batch) or the
// launch failed.
bool LaunchCalibration(const CalibrationInput& in, int64_t* rows, int64_t* fine, int64_t* scratch, void* stream,
                       int64_t fine_images = -1);

// For tests, synchronously from host arrays (device memory allocated and freed here; the input's
// pointers are the host's): LaunchCalibration's counts (rows and fine overwritten), and, when
// `probs_out` ([n, k, hw]) and `pred_out` ([n, hw]) are not null, the probabilities and labels the
// kernel counted. Returns "" or what failed ("no CUDA device" when none is visible).
std::string CalibrationOnDeviceSync(const CalibrationInput& host, int64_t* rows, int64_t* fine,
                                    int64_t fine_images = -1, float* probs_out = nullptr,
                                    int16_t* pred_out = nullptr);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_CALIBRATION_KERNEL_H_
