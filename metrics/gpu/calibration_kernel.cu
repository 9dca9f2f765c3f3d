#include "metrics/gpu/calibration_kernel.h"

#include <cuda_runtime.h>

#include "metrics/calibration.h"

namespace tally {
namespace {

constexpr int kThreads = 256;
constexpr int kPixelsPerThread = 32;

__device__ __forceinline__ unsigned long long WarpSum64(unsigned long long v, unsigned mask) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(mask, v, o);
  return v;
}

// One histogram h of one image's block of pixels: the coarse bins in registers, reduced per warp;
// the fine bins by warp-aggregated atomics (the two crowded ends, 0 and 65535, in registers too),
// unless `fine` is null.
__device__ void CountHistogram(const float* __restrict__ probs, const int16_t* __restrict__ ref,
                               const int16_t* __restrict__ pred, int k, int h, int64_t hw, int64_t begin, int64_t end,
                               unsigned long long* __restrict__ row, unsigned long long* __restrict__ fine) {
  unsigned count[kCalibrationBins], correct[kCalibrationBins];
  unsigned long long units[kCalibrationBins];
#pragma unroll
  for (int b = 0; b < kCalibrationBins; ++b) count[b] = correct[b] = 0, units[b] = 0;
  unsigned low = 0, low_correct = 0, high = 0, high_correct = 0;
  unsigned long long* fh = fine != nullptr ? fine + static_cast<size_t>(h) * kCalibrationFineBins * 2 : nullptr;
  // Every lane runs every round (the warp's collectives below need all of them); past the end, a
  // lane counts nothing.
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t x = base + threadIdx.x;
    const int gt = x < end ? ref[x] : -1;
    const bool valid = gt >= 0 && gt < k;
    float v = 0.f;
    bool ok = false;
    if (valid) {
      if (h < k) {
        v = probs[static_cast<int64_t>(h) * hw + x];
        ok = gt == h;
      } else {
        int label = pred[x];
        label = label < 0 ? 0 : (label >= k ? k - 1 : label);
        v = probs[static_cast<int64_t>(label) * hw + x];
        ok = label == gt;
      }
      const int b = CalibrationBin(v);
      const unsigned long long u = ConfidenceUnits(v);
#pragma unroll
      for (int c = 0; c < kCalibrationBins; ++c) {
        const bool here = c == b;
        count[c] += here;
        correct[c] += here & ok;
        units[c] += here ? u : 0ull;
      }
    }
    const int f = valid ? CalibrationFineBin(v) : -1;
    if (f == 0) {
      ++low;
      low_correct += ok;
    } else if (f == kCalibrationFineBins - 1) {
      ++high;
      high_correct += ok;
    }
    const bool middle = fh != nullptr && f > 0 && f < kCalibrationFineBins - 1;
    const unsigned want = __ballot_sync(0xffffffffu, middle);
    if (middle) {
      const unsigned same = __match_any_sync(want, f);
      const unsigned same_ok = __ballot_sync(want, ok) & same;
      if ((threadIdx.x & 31) == static_cast<unsigned>(__ffs(same) - 1)) {
        atomicAdd(&fh[2 * f], static_cast<unsigned long long>(__popc(same)));
        if (same_ok) atomicAdd(&fh[2 * f + 1], static_cast<unsigned long long>(__popc(same_ok)));
      }
    }
  }
  const unsigned full = 0xffffffffu;
  const bool lane0 = (threadIdx.x & 31) == 0;
  unsigned long long* cells = row + CalibrationCell(h, 0);
#pragma unroll
  for (int c = 0; c < kCalibrationBins; ++c) {
    if (!__any_sync(full, count[c] != 0)) continue;
    const unsigned n = __reduce_add_sync(full, count[c]);
    const unsigned m = __reduce_add_sync(full, correct[c]);
    const unsigned long long u = WarpSum64(units[c], full);
    if (lane0) {
      atomicAdd(&cells[c * kCalibrationValues], static_cast<unsigned long long>(n));
      if (m) atomicAdd(&cells[c * kCalibrationValues + 1], static_cast<unsigned long long>(m));
      if (u) atomicAdd(&cells[c * kCalibrationValues + 2], u);
    }
  }
  const unsigned lo = __reduce_add_sync(full, low), lo_ok = __reduce_add_sync(full, low_correct);
  const unsigned hi = __reduce_add_sync(full, high), hi_ok = __reduce_add_sync(full, high_correct);
  if (lane0 && fh != nullptr) {
    if (lo) atomicAdd(&fh[0], static_cast<unsigned long long>(lo));
    if (lo_ok) atomicAdd(&fh[1], static_cast<unsigned long long>(lo_ok));
    if (hi) atomicAdd(&fh[2 * (kCalibrationFineBins - 1)], static_cast<unsigned long long>(hi));
    if (hi_ok) atomicAdd(&fh[2 * (kCalibrationFineBins - 1) + 1], static_cast<unsigned long long>(hi_ok));
  }
}

// Images from `fine_images` on (-1: none) count their rows' bins only.
__global__ void Calibration(const float* __restrict__ probs, const int16_t* __restrict__ ref,
                            const int16_t* __restrict__ pred, int k, int64_t hw, unsigned long long* __restrict__ rows,
                            unsigned long long* __restrict__ fine, int64_t fine_images) {
  const int64_t img = blockIdx.y;
  const int64_t span = static_cast<int64_t>(blockDim.x) * kPixelsPerThread;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * span;
  if (begin >= hw) return;
  const int64_t end = begin + span < hw ? begin + span : hw;
  const float* p = probs + img * k * hw;
  unsigned long long* row = rows + img * CalibrationRowSize(k);
  unsigned long long* f = fine_images < 0 || img < fine_images ? fine : nullptr;  // The same for the whole block.
  for (int h = 0; h <= k; ++h) {
    CountHistogram(p, ref + img * hw, pred + img * hw, k, h, hw, begin, end, row, f);
  }
}

}  // namespace

bool LaunchCalibration(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k, int64_t hw,
                       int64_t* rows, int64_t* fine, void* stream, int64_t fine_images) {
  if (n <= 0 || n > 65535 || k <= 0 || hw <= 0) return false;

  const int64_t span = static_cast<int64_t>(kThreads) * kPixelsPerThread;
  const int64_t blocks = (hw + span - 1) / span;
  if (blocks > 0x7fffffff) return false;
  dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n));
  Calibration<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, ref, pred, k, hw, reinterpret_cast<unsigned long long*>(rows), reinterpret_cast<unsigned long long*>(fine),
      fine_images);
  return cudaGetLastError() == cudaSuccess;
}

std::string CalibrationOnDeviceSync(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k,
                                    int64_t hw, int64_t* rows, int64_t* fine, int64_t fine_images) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return "no CUDA device";
  const size_t pb = sizeof(float) * n * k * hw, lb = sizeof(int16_t) * n * hw;
  const size_t rb = sizeof(int64_t) * n * CalibrationRowSize(k), fb = sizeof(int64_t) * CalibrationFineSize(k);
  void *dp = nullptr, *dr = nullptr, *dl = nullptr, *drows = nullptr, *dfine = nullptr;
  std::string error;
  if (cudaMalloc(&dp, pb) != cudaSuccess || cudaMalloc(&dr, lb) != cudaSuccess || cudaMalloc(&dl, lb) != cudaSuccess ||
      cudaMalloc(&drows, rb) != cudaSuccess || cudaMalloc(&dfine, fb) != cudaSuccess) {
    error = "cudaMalloc failed";
  } else {
    cudaMemcpy(dp, probs, pb, cudaMemcpyHostToDevice);
    cudaMemcpy(dr, ref, lb, cudaMemcpyHostToDevice);
    cudaMemcpy(dl, pred, lb, cudaMemcpyHostToDevice);
    cudaMemset(drows, 0, rb);
    cudaMemset(dfine, 0, fb);
    if (!LaunchCalibration(static_cast<float*>(dp), static_cast<int16_t*>(dr), static_cast<int16_t*>(dl), n, k, hw,
                           static_cast<int64_t*>(drows), static_cast<int64_t*>(dfine), nullptr, fine_images) ||
        cudaDeviceSynchronize() != cudaSuccess) {
      error = cudaGetErrorString(cudaGetLastError());
    } else {
      cudaMemcpy(rows, drows, rb, cudaMemcpyDeviceToHost);
      cudaMemcpy(fine, dfine, fb, cudaMemcpyDeviceToHost);
    }
  }
  for (void* p : {dp, dr, dl, drows, dfine}) cudaFree(p);
  return error;
}

}  // namespace tally
