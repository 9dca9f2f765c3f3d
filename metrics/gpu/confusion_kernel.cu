#include "metrics/gpu/confusion_kernel.h"

#include <cuda_runtime.h>

#include <cmath>

#include "metrics/gpu/classify.cuh"

namespace tally {
namespace {

constexpr int kThreads = 256;

using gpu_internal::Classify;
using gpu_internal::Pixel;

__device__ __forceinline__ unsigned WarpSum(unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Small K: per-thread counters in registers, reduced per warp, one global atomic per warp and bin.
template <int K>
__global__ void ConfusionSmall(const float* __restrict__ logits, const int16_t* __restrict__ ref, int channels,
                               int64_t hw, int16_t* __restrict__ pred, unsigned long long* __restrict__ counts,
                               unsigned long long* __restrict__ ties, unsigned long long* __restrict__ nonfinite) {
  const int64_t img = blockIdx.y;
  const float* l = logits + img * channels * hw;
  const int16_t* r = ref + img * hw;
  unsigned local[K * K];
#pragma unroll
  for (int i = 0; i < K * K; ++i) local[i] = 0;
  unsigned local_ties = 0, local_nonfinite = 0;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < hw;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel px = Classify(l, channels, hw, p);
    if (pred) pred[img * hw + p] = static_cast<int16_t>(px.label);
    local_ties += px.tie;
    local_nonfinite += px.nonfinite;
    const int gt = r[p];
#pragma unroll
    for (int a = 0; a < K; ++a) {
#pragma unroll
      for (int b = 0; b < K; ++b) local[a * K + b] += (gt == a) & (px.label == b);
    }
  }
  const bool lane0 = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int i = 0; i < K * K; ++i) {
    const unsigned s = WarpSum(local[i]);
    if (lane0 && s) atomicAdd(&counts[img * K * K + i], static_cast<unsigned long long>(s));
  }
  const unsigned t = WarpSum(local_ties);
  if (ties && lane0 && t) atomicAdd(ties, static_cast<unsigned long long>(t));
  const unsigned bad = WarpSum(local_nonfinite);
  if (lane0 && bad) atomicAdd(&nonfinite[img], static_cast<unsigned long long>(bad));
}

// Larger K: a shared-memory histogram per block.
__global__ void ConfusionShared(const float* __restrict__ logits, const int16_t* __restrict__ ref, int channels,
                                int k, int64_t hw, int16_t* __restrict__ pred, unsigned long long* __restrict__ counts,
                                unsigned long long* __restrict__ ties, unsigned long long* __restrict__ nonfinite) {
  extern __shared__ unsigned hist[];
  const int64_t img = blockIdx.y;
  for (int i = threadIdx.x; i < k * k; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const float* l = logits + img * channels * hw;
  const int16_t* r = ref + img * hw;
  unsigned local_ties = 0, local_nonfinite = 0;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < hw;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pixel px = Classify(l, channels, hw, p);
    if (pred) pred[img * hw + p] = static_cast<int16_t>(px.label);
    local_ties += px.tie;
    local_nonfinite += px.nonfinite;
    const int gt = r[p];
    if (gt >= 0 && gt < k) atomicAdd(&hist[gt * k + px.label], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < k * k; i += blockDim.x) {
    if (hist[i]) atomicAdd(&counts[img * k * k + i], static_cast<unsigned long long>(hist[i]));
  }
  const unsigned t = WarpSum(local_ties);
  if (ties && (threadIdx.x & 31) == 0 && t) atomicAdd(ties, static_cast<unsigned long long>(t));
  const unsigned bad = WarpSum(local_nonfinite);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(&nonfinite[img], static_cast<unsigned long long>(bad));
}

}  // namespace

bool LaunchConfusion(const float* logits, const int16_t* ref, int64_t n, int channels, int64_t hw, int16_t* pred,
                     int64_t* counts, int64_t* ties, int64_t* nonfinite, void* stream) {
  const int k = channels == 1 ? 2 : channels;
  if (k > kMaxKernelClasses || n <= 0 || n > 65535) return false;
  const int64_t blocks_needed = (hw + kThreads * 4 - 1) / (kThreads * 4);
  dim3 grid(static_cast<unsigned>(blocks_needed < 1 ? 1 : (blocks_needed > 256 ? 256 : blocks_needed)),
            static_cast<unsigned>(n));
  auto s = static_cast<cudaStream_t>(stream);
  auto* c = reinterpret_cast<unsigned long long*>(counts);
  auto* t = reinterpret_cast<unsigned long long*>(ties);
  auto* nf = reinterpret_cast<unsigned long long*>(nonfinite);
  switch (k) {
    case 2: ConfusionSmall<2><<<grid, kThreads, 0, s>>>(logits, ref, channels, hw, pred, c, t, nf); break;
    case 3: ConfusionSmall<3><<<grid, kThreads, 0, s>>>(logits, ref, channels, hw, pred, c, t, nf); break;
    case 4: ConfusionSmall<4><<<grid, kThreads, 0, s>>>(logits, ref, channels, hw, pred, c, t, nf); break;
    default:
      ConfusionShared<<<grid, kThreads, k * k * sizeof(unsigned), s>>>(logits, ref, channels, k, hw, pred, c, t, nf);
  }
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace tally
