// Fused argmax + per-image confusion counts on the GPU: one pass over the logits, no host
// synchronisation (torch.bincount on CUDA reads the input's maximum back to the host to size its
// output, which stalls the worker's launch thread once per batch).
#ifndef TALLY_METRICS_GPU_CONFUSION_KERNEL_H_
#define TALLY_METRICS_GPU_CONFUSION_KERNEL_H_

#include <cstdint>

namespace tally {

// Largest number of classes the kernel handles; more fall back to torch ops.
inline constexpr int kMaxKernelClasses = 64;

// For n images: logits [n, C, hw] float32 (NCHW, contiguous), reference labels [n, hw] int16.
// K = C == 1 ? 2 : C. Writes counts [n, K, K] (row = reference class, column = predicted class;
// labels < 0 (ignored pixels) or >= K are left out; `counts` must be zeroed), the predicted labels [n, hw]
// when `pred` is not null, and adds to `ties` (when not null) the pixels whose two largest logits
// are equal, and to `nonfinite` [n] (zeroed) each image's NaN and infinite logits. The predicted
// class is the first maximum, NaN counting as the maximum (torch.argmax); for C == 1 it is
// logit > 0. Enqueued on `stream` (a cudaStream_t); returns false when K is too large or the launch
// failed.
bool LaunchConfusion(const float* logits, const int16_t* ref, int64_t n, int channels, int64_t hw, int16_t* pred,
                     int64_t* counts, int64_t* ties, int64_t* nonfinite, void* stream);

}  // namespace tally

#endif  // TALLY_METRICS_GPU_CONFUSION_KERNEL_H_
