// Where the calibration kernel's time goes (bench/gpu/calibration.sh stage `probe`): microseconds per
// 512x512 image of a batch of 32, for K = 2 and 21 classes and logits of growing scale (0.5: the
// probabilities spread over the fine bins; 32: crowded at 0 and 1), of
//   floor     a softmax + argmax pass that writes the probabilities (what LibTorch's two ops do),
//   logits    LaunchCalibration from the logits (its own softmax), every histogram,
//   coarse    the same with no image in the fine histogram (fine_images 0),
//   given     LaunchCalibration from given probabilities and labels.
// Built by the suite: nvcc -O3 -std=c++17 -arch=sm_90 -I. bench/gpu/tools/calibration_probe.cu
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "metrics/calibration.h"
#include "metrics/gpu/calibration_kernel.h"

namespace {

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    const cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

__device__ unsigned Hash(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Smooth class fields plus noise, times `scale`; the reference is the argmax, 10 % of pixels another class.
__global__ void MakeLogits(float* logits, int16_t* ref, int n, int k, int64_t hw, int w, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * hw) return;
  const int img = static_cast<int>(i / hw);
  const int64_t x = i % hw;
  const int row = static_cast<int>(x / w), col = static_cast<int>(x % w);
  int best = 0;
  float top = -1e30f;
  for (int c = 0; c < k; ++c) {
    const float field = sinf(col / 37.f + c * 1.3f + img) * cosf(row / 53.f - c * 0.7f);
    const float noise = (Hash(static_cast<unsigned>(i * 31 + c)) & 0xffffu) / 65535.f - 0.5f;
    const float l = scale * (field + 0.5f * noise);
    logits[(img * static_cast<int64_t>(k) + c) * hw + x] = l;
    if (l > top) top = l, best = c;
  }
  const unsigned r = Hash(static_cast<unsigned>(i) * 7u + 3u);
  ref[i] = static_cast<int16_t>(r % 10 ? best : static_cast<int>(r % k));
}

__global__ void SoftmaxArgmax(const float* logits, float* probs, int16_t* pred, int n, int k, int64_t hw) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * hw) return;
  const int64_t img = i / hw, x = i % hw;
  const float* l = logits + img * k * hw + x;
  float m = -INFINITY;
  int best = 0;
  for (int c = 0; c < k; ++c) {
    if (l[c * hw] > m) m = l[c * hw], best = c;
  }
  float sum = 0.f;
  for (int c = 0; c < k; ++c) sum += expf(l[c * hw] - m);
  for (int c = 0; c < k; ++c) probs[(img * k + c) * hw + x] = expf(l[c * hw] - m) / sum;
  pred[i] = static_cast<int16_t>(best);
}

float Elapsed(cudaEvent_t a, cudaEvent_t b) {
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

int main() {
  using tally::CalibrationFineSize;
  using tally::CalibrationRowSize;
  constexpr int n = 32, w = 512, reps = 10;
  constexpr int64_t hw = int64_t{w} * w;
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (const int k : {2, 21}) {
    float *logits = nullptr, *probs = nullptr;
    int16_t *ref = nullptr, *pred = nullptr;
    int64_t *rows = nullptr, *fine = nullptr, *scratch = nullptr;
    CHECK_CUDA(cudaMalloc(&logits, sizeof(float) * n * k * hw));
    CHECK_CUDA(cudaMalloc(&probs, sizeof(float) * n * k * hw));
    CHECK_CUDA(cudaMalloc(&ref, sizeof(int16_t) * n * hw));
    CHECK_CUDA(cudaMalloc(&pred, sizeof(int16_t) * n * hw));
    CHECK_CUDA(cudaMalloc(&rows, sizeof(int64_t) * n * CalibrationRowSize(k)));
    CHECK_CUDA(cudaMalloc(&fine, sizeof(int64_t) * CalibrationFineSize(k)));
    CHECK_CUDA(cudaMalloc(&scratch, sizeof(int64_t) * tally::CalibrationScratchWords(k)));
    const unsigned blocks = static_cast<unsigned>((n * hw + 255) / 256);
    for (const float scale : {0.5f, 2.f, 8.f, 32.f}) {
      MakeLogits<<<blocks, 256>>>(logits, ref, n, k, hw, w, scale);
      SoftmaxArgmax<<<blocks, 256>>>(logits, probs, pred, n, k, hw);
      CHECK_CUDA(cudaDeviceSynchronize());
      tally::CalibrationInput from_logits;
      from_logits.logits = logits;
      from_logits.channels = k;
      from_logits.ref = ref;
      from_logits.n = n;
      from_logits.k = k;
      from_logits.hw = hw;
      tally::CalibrationInput given = from_logits;
      given.probs = probs;
      given.pred = pred;
      float floor = 0, all = 0, coarse = 0, from_given = 0;
      bool ok = true;
      // Milliseconds of `launch` on the default stream, between two events; its launch's success into ok.
      auto timed = [&](auto launch) {
        CHECK_CUDA(cudaEventRecord(a));
        ok = launch() && ok;
        CHECK_CUDA(cudaEventRecord(b));
        return Elapsed(a, b);
      };
      for (int r = 0; r < reps; ++r) {
        floor += timed([&] {
          SoftmaxArgmax<<<blocks, 256>>>(logits, probs, pred, n, k, hw);
          return true;
        });
        all += timed([&] { return tally::LaunchCalibration(from_logits, rows, fine, scratch, nullptr, -1); });
        coarse += timed([&] { return tally::LaunchCalibration(from_logits, rows, fine, scratch, nullptr, 0); });
        from_given += timed([&] { return tally::LaunchCalibration(given, rows, fine, scratch, nullptr, -1); });
        if (!ok) {
          std::printf("launch failed\n");
          return 1;
        }
      }
      const double us = 1000.0 / reps / n;
      std::printf("k %2d scale %4.1f  us/image: floor %.2f  logits %.2f  coarse %.2f  given %.2f\n", k, scale,
                  floor * us, all * us, coarse * us, from_given * us);
      std::fflush(stdout);
    }
    for (void* p : {static_cast<void*>(logits), static_cast<void*>(probs), static_cast<void*>(ref),
                    static_cast<void*>(pred), static_cast<void*>(rows), static_cast<void*>(fine),
                    static_cast<void*>(scratch)}) {
      cudaFree(p);
    }
  }
  return 0;
}
