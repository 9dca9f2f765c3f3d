// Internal to the metrics' CUDA kernels: a pixel's predicted class from its logits, one rule for
// every kernel that needs it (the confusion counts, the calibration's top label).
#ifndef TALLY_METRICS_GPU_CLASSIFY_CUH_
#define TALLY_METRICS_GPU_CLASSIFY_CUH_

#include <cmath>
#include <cstdint>

namespace tally {
namespace gpu_internal {

struct Pixel {
  int label;
  bool tie;
  unsigned nonfinite;  // NaN or infinite logits of this pixel.
  float best;          // The largest logit (NaN when one is NaN): the label's.
};

// First maximum, NaN counting as the maximum (torch.argmax); tie = the two largest are equal. One
// channel: class 1 where the logit is > 0.
__device__ __forceinline__ Pixel Classify(const float* __restrict__ logits, int channels, int64_t hw, int64_t p) {
  if (channels == 1) {
    const float v = logits[p];
    return Pixel{v > 0.f ? 1 : 0, false, isfinite(v) ? 0u : 1u, v};
  }
  float best = logits[p];
  float second = -INFINITY;
  int arg = 0;
  unsigned nonfinite = isfinite(best) ? 0u : 1u;
  bool settled = isnan(best);  // A NaN is the maximum; the first one wins.
  for (int c = 1; c < channels; ++c) {
    const float v = logits[c * hw + p];
    nonfinite += isfinite(v) ? 0u : 1u;
    if (settled) continue;
    if (v > best || isnan(v)) {
      second = best;
      best = v;
      arg = c;
      settled = isnan(v);
    } else if (v > second) {
      second = v;
    }
  }
  return Pixel{arg, best == second, nonfinite, best};
}

}  // namespace gpu_internal
}  // namespace tally

#endif  // TALLY_METRICS_GPU_CLASSIFY_CUH_
