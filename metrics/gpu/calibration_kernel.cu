#include "metrics/gpu/calibration_kernel.h"

#include <cuda_runtime.h>

#include "metrics/calibration.h"
#include "metrics/gpu/classify.cuh"

namespace tally {
namespace {

constexpr int kThreads = 256;
constexpr int kPixelsPerBlock = kThreads * 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxClasses = 907;  // The block's counters in 227 KB of shared memory.

enum class Source { kSoftmax, kSingle, kGiven };

// A block's counters in shared memory, per histogram h: per coarse bin (pixels, correct) as uint32
// and the v-sum as uint64, and the fine histogram's two crowded end bins (0 and 65535), (pixels,
// correct) each. A block counts at most kPixelsPerBlock pixels: no uint32 overflows.
struct Counters {
  unsigned* coarse;            // [h][bin][2]
  unsigned long long* units;   // [h][bin]
  unsigned* ends;              // [h][end][2]
};

size_t SharedBytes(int k) {
  const size_t h = static_cast<size_t>(k) + 1;
  return h * kCalibrationBins * (2 * sizeof(unsigned) + sizeof(unsigned long long)) + h * 4 * sizeof(unsigned);
}

__device__ Counters Carve(unsigned char* shared, int k) {
  const int h = k + 1;
  Counters c;
  c.units = reinterpret_cast<unsigned long long*>(shared);
  c.coarse = reinterpret_cast<unsigned*>(c.units + h * kCalibrationBins);
  c.ends = c.coarse + h * kCalibrationBins * 2;
  return c;
}

// One pixel's probabilities, read or computed once per pixel.
struct PixelValues {
  int label = 0;
  float max = 0.f, sum = 1.f, one = 0.f;
};

template <Source S>
__device__ __forceinline__ PixelValues Prepare(const CalibrationInput& in, int64_t img, int64_t x) {
  PixelValues p;
  if (S == Source::kSoftmax) {
    const float* l = in.logits + img * in.k * in.hw;
    const gpu_internal::Pixel px = gpu_internal::Classify(l, in.k, in.hw, x);
    p.label = px.label;
    p.max = px.best;
    float sum = 0.f;
    for (int c = 0; c < in.k; ++c) sum += expf(l[c * in.hw + x] - p.max);
    p.sum = sum;
  } else if (S == Source::kSingle) {
    p.label = in.logits[img * in.hw + x] > 0.f ? 1 : 0;
    p.one = in.one[img * in.hw + x];
  } else {
    const int label = in.pred[img * in.hw + x];
    p.label = label < 0 ? 0 : (label >= in.k ? in.k - 1 : label);
  }
  return p;
}

template <Source S>
__device__ __forceinline__ float Probability(const CalibrationInput& in, const PixelValues& p, int64_t img, int64_t x,
                                             int c) {
  if (S == Source::kSoftmax) return expf(in.logits[(img * in.k + c) * in.hw + x] - p.max) / p.sum;
  if (S == Source::kSingle) return c == 1 ? p.one : 1.0f - p.one;
  return in.probs[(img * in.k + c) * in.hw + x];
}

// Histogram h's value v (flag ok) of each active lane of the warp: the coarse bins by warp-wide sums
// per distinct bin into the block's counters, the fine bins by warp-matched atomics into `fine`
// ([h][65536] words, pixels | correct << 32; null: not counted), its two ends into the block's.
// Every lane of the warp calls it with the same h.
__device__ __forceinline__ void Count(const Counters& s, unsigned long long* __restrict__ fine, int h, bool active,
                                      float v, bool ok) {
  const unsigned lane = threadIdx.x & 31;
  const int b = active ? CalibrationBin(v) : -1;
  const unsigned long long u = active ? ConfidenceUnits(v) : 0ull;  // <= 2^32: 17 bits >> 16.
  for (unsigned pending = __ballot_sync(kFull, active); pending != 0;) {
    const int leader = __ffs(pending) - 1;
    const int lb = __shfl_sync(kFull, b, leader);
    const bool in = active && b == lb;
    const unsigned group = __ballot_sync(kFull, in);
    const unsigned good = __ballot_sync(kFull, in && ok);
    const unsigned lo = __reduce_add_sync(kFull, in ? static_cast<unsigned>(u & 0xffffu) : 0u);
    const unsigned hi = __reduce_add_sync(kFull, in ? static_cast<unsigned>(u >> 16) : 0u);
    if (lane == static_cast<unsigned>(leader)) {
      const int cell = h * kCalibrationBins + lb;
      atomicAdd(&s.coarse[2 * cell], static_cast<unsigned>(__popc(group)));
      if (good) atomicAdd(&s.coarse[2 * cell + 1], static_cast<unsigned>(__popc(good)));
      atomicAdd(&s.units[cell], (static_cast<unsigned long long>(hi) << 16) + lo);
    }
    pending &= ~group;
  }
  if (fine == nullptr) return;  // The same for the whole block.
  const int f = active ? CalibrationFineBin(v) : -1;
  const unsigned low = __ballot_sync(kFull, f == 0), low_ok = __ballot_sync(kFull, f == 0 && ok);
  const unsigned high = __ballot_sync(kFull, f == kCalibrationFineBins - 1);
  const unsigned high_ok = __ballot_sync(kFull, f == kCalibrationFineBins - 1 && ok);
  if (lane == 0) {
    unsigned* e = s.ends + h * 4;
    if (low) atomicAdd(&e[0], static_cast<unsigned>(__popc(low)));
    if (low_ok) atomicAdd(&e[1], static_cast<unsigned>(__popc(low_ok)));
    if (high) atomicAdd(&e[2], static_cast<unsigned>(__popc(high)));
    if (high_ok) atomicAdd(&e[3], static_cast<unsigned>(__popc(high_ok)));
  }
  const bool middle = f > 0 && f < kCalibrationFineBins - 1;
  const unsigned want = __ballot_sync(kFull, middle);
  if (middle) {
    const unsigned same = __match_any_sync(want, f);
    const unsigned same_ok = __ballot_sync(want, ok) & same;
    if (lane == static_cast<unsigned>(__ffs(same) - 1)) {
      atomicAdd(&fine[static_cast<int64_t>(h) * kCalibrationFineBins + f],
                static_cast<unsigned long long>(__popc(same)) |
                    (static_cast<unsigned long long>(__popc(same_ok)) << 32));
    }
  }
}

// Block (x, image): kPixelsPerBlock pixels of one image, every histogram. Images from `fine_images`
// on (-1: none) count their rows' bins only.
template <Source S>
__global__ void Calibration(CalibrationInput in, unsigned long long* __restrict__ rows,
                            unsigned long long* __restrict__ packed, int64_t fine_images) {
  extern __shared__ __align__(8) unsigned char shared[];
  const Counters s = Carve(shared, in.k);
  const int hists = in.k + 1;
  for (int i = threadIdx.x; i < hists * kCalibrationBins; i += blockDim.x) {
    s.units[i] = 0;
    s.coarse[2 * i] = s.coarse[2 * i + 1] = 0;
  }
  for (int i = threadIdx.x; i < hists * 4; i += blockDim.x) s.ends[i] = 0;
  __syncthreads();
  const int64_t img = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kPixelsPerBlock;
  const int64_t end = begin + kPixelsPerBlock < in.hw ? begin + kPixelsPerBlock : in.hw;
  unsigned long long* fine = fine_images < 0 || img < fine_images ? packed : nullptr;
  // Every lane runs every round (the warp's collectives need all of them); past the end, a lane
  // counts nothing.
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t x = base + threadIdx.x;
    const int gt = x < end ? in.ref[img * in.hw + x] : -1;
    const bool valid = gt >= 0 && gt < in.k;
    PixelValues p;
    if (valid) p = Prepare<S>(in, img, x);
    float top = 0.f;
    for (int h = 0; h < in.k; ++h) {
      const float v = valid ? Probability<S>(in, p, img, x, h) : 0.f;
      if (h == p.label) top = v;
      Count(s, fine, h, valid, v, gt == h);
    }
    Count(s, fine, in.k, valid, top, p.label == gt);
  }
  __syncthreads();
  unsigned long long* row = rows + img * CalibrationRowSize(in.k);
  for (int i = threadIdx.x; i < hists * kCalibrationBins; i += blockDim.x) {
    if (s.coarse[2 * i] == 0) continue;
    unsigned long long* cell = row + static_cast<int64_t>(i) * kCalibrationValues;
    atomicAdd(&cell[0], static_cast<unsigned long long>(s.coarse[2 * i]));
    if (s.coarse[2 * i + 1]) atomicAdd(&cell[1], static_cast<unsigned long long>(s.coarse[2 * i + 1]));
    if (s.units[i]) atomicAdd(&cell[2], s.units[i]);
  }
  if (fine == nullptr) return;
  for (int i = threadIdx.x; i < hists * 2; i += blockDim.x) {
    const unsigned* e = s.ends + 2 * i;
    if (e[0] == 0) continue;
    const int h = i / 2;
    const int bin = i % 2 == 0 ? 0 : kCalibrationFineBins - 1;
    atomicAdd(&fine[static_cast<int64_t>(h) * kCalibrationFineBins + bin],
              static_cast<unsigned long long>(e[0]) | (static_cast<unsigned long long>(e[1]) << 32));
  }
}

// The packed fine histogram added to the (pixels, correct) pairs.
__global__ void Unpack(const unsigned long long* __restrict__ packed, int64_t words, unsigned long long* __restrict__ fine) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long w = packed[i];
    if (w == 0) continue;
    fine[2 * i] += w & 0xffffffffull;
    fine[2 * i + 1] += w >> 32;
  }
}

// The probabilities and labels Calibration<S> counts (for tests).
template <Source S>
__global__ void Values(CalibrationInput in, float* __restrict__ probs, int16_t* __restrict__ pred) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= in.n * in.hw) return;
  const int64_t img = i / in.hw, x = i % in.hw;
  const PixelValues p = Prepare<S>(in, img, x);
  for (int c = 0; c < in.k; ++c) probs[(img * in.k + c) * in.hw + x] = Probability<S>(in, p, img, x, c);
  pred[i] = static_cast<int16_t>(p.label);
}

Source SourceOf(const CalibrationInput& in) {
  if (in.probs != nullptr) return Source::kGiven;
  return in.channels == 1 ? Source::kSingle : Source::kSoftmax;
}

bool Usable(const CalibrationInput& in) {
  if (in.n <= 0 || in.n > 65535 || in.k <= 0 || in.k > kMaxClasses || in.hw <= 0 || in.ref == nullptr) return false;
  // A fine word holds a batch's pixels of a bin in 32 bits.
  if (static_cast<double>(in.n) * static_cast<double>(in.hw) >= 4294967296.0) return false;
  switch (SourceOf(in)) {
    case Source::kGiven: return in.pred != nullptr;
    case Source::kSingle: return in.k == 2 && in.logits != nullptr && in.one != nullptr;
    case Source::kSoftmax: return in.channels == in.k && in.k >= 2 && in.logits != nullptr;
  }
  return false;
}

template <Source S>
bool Launch(const CalibrationInput& in, unsigned long long* rows, unsigned long long* packed, cudaStream_t stream,
            int64_t fine_images) {
  const size_t shared = SharedBytes(in.k);
  if (shared > 48 * 1024 &&
      cudaFuncSetAttribute(Calibration<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)) !=
          cudaSuccess) {
    return false;
  }
  const int64_t blocks = (in.hw + kPixelsPerBlock - 1) / kPixelsPerBlock;
  if (blocks > 0x7fffffff) return false;
  dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(in.n));
  Calibration<S><<<grid, kThreads, shared, stream>>>(in, rows, packed, fine_images);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace

int64_t CalibrationScratchWords(int k) { return int64_t{k + 1} * kCalibrationFineBins; }

bool LaunchCalibration(const CalibrationInput& in, int64_t* rows, int64_t* fine, int64_t* scratch, void* stream,
                       int64_t fine_images) {
  if (!Usable(in)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  auto* r = reinterpret_cast<unsigned long long*>(rows);
  auto* packed = reinterpret_cast<unsigned long long*>(scratch);
  const int64_t words = CalibrationScratchWords(in.k);
  if (cudaMemsetAsync(packed, 0, sizeof(int64_t) * words, s) != cudaSuccess) return false;
  bool launched = false;
  switch (SourceOf(in)) {
    case Source::kSoftmax: launched = Launch<Source::kSoftmax>(in, r, packed, s, fine_images); break;
    case Source::kSingle: launched = Launch<Source::kSingle>(in, r, packed, s, fine_images); break;
    case Source::kGiven: launched = Launch<Source::kGiven>(in, r, packed, s, fine_images); break;
  }
  if (!launched) return false;
  const int64_t blocks = (words + kThreads - 1) / kThreads;
  Unpack<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, s>>>(
      packed, words, reinterpret_cast<unsigned long long*>(fine));
  return cudaGetLastError() == cudaSuccess;
}

std::string CalibrationOnDeviceSync(const CalibrationInput& host, int64_t* rows, int64_t* fine, int64_t fine_images,
                                    float* probs_out, int16_t* pred_out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return "no CUDA device";
  if (!Usable(host)) return "input out of the kernel's range";
  const int64_t n = host.n, k = host.k, hw = host.hw;
  const size_t planes = sizeof(float) * n * k * hw, one = sizeof(float) * n * hw, labels = sizeof(int16_t) * n * hw;
  const size_t rb = sizeof(int64_t) * n * CalibrationRowSize(host.k), fb = sizeof(int64_t) * CalibrationFineSize(host.k);
  const size_t sb = sizeof(int64_t) * CalibrationScratchWords(host.k);
  void *dlogits = nullptr, *done = nullptr, *dprobs = nullptr, *dpred = nullptr, *dref = nullptr;
  void *drows = nullptr, *dfine = nullptr, *dscratch = nullptr, *vprobs = nullptr, *vpred = nullptr;
  std::string error;
  const auto upload = [&](const void* from, size_t bytes, void** to) {
    if (from == nullptr || !error.empty()) return;
    if (cudaMalloc(to, bytes) != cudaSuccess || cudaMemcpy(*to, from, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      error = "cudaMalloc/cudaMemcpy failed";
    }
  };
  CalibrationInput dev = host;
  upload(host.logits, host.channels == 1 ? one : planes, &dlogits);
  upload(host.one, one, &done);
  upload(host.probs, planes, &dprobs);
  upload(host.pred, labels, &dpred);
  upload(host.ref, labels, &dref);
  dev.logits = static_cast<const float*>(dlogits);
  dev.one = static_cast<const float*>(done);
  dev.probs = static_cast<const float*>(dprobs);
  dev.pred = static_cast<const int16_t*>(dpred);
  dev.ref = static_cast<const int16_t*>(dref);
  if (error.empty() && (cudaMalloc(&drows, rb) != cudaSuccess || cudaMalloc(&dfine, fb) != cudaSuccess ||
                        cudaMalloc(&dscratch, sb) != cudaSuccess || cudaMalloc(&vprobs, planes) != cudaSuccess ||
                        cudaMalloc(&vpred, labels) != cudaSuccess)) {
    error = "cudaMalloc failed";
  }
  if (error.empty()) {
    cudaMemset(drows, 0, rb);
    cudaMemset(dfine, 0, fb);
    if (!LaunchCalibration(dev, static_cast<int64_t*>(drows), static_cast<int64_t*>(dfine),
                           static_cast<int64_t*>(dscratch), nullptr, fine_images)) {
      error = std::string("launch failed: ") + cudaGetErrorString(cudaGetLastError());
    } else {
      const unsigned blocks = static_cast<unsigned>((n * hw + kThreads - 1) / kThreads);
      auto* vp = static_cast<float*>(vprobs);
      auto* vl = static_cast<int16_t*>(vpred);
      switch (SourceOf(dev)) {
        case Source::kSoftmax: Values<Source::kSoftmax><<<blocks, kThreads>>>(dev, vp, vl); break;
        case Source::kSingle: Values<Source::kSingle><<<blocks, kThreads>>>(dev, vp, vl); break;
        case Source::kGiven: Values<Source::kGiven><<<blocks, kThreads>>>(dev, vp, vl); break;
      }
      if (cudaDeviceSynchronize() != cudaSuccess) {
        error = cudaGetErrorString(cudaGetLastError());
      } else {
        cudaMemcpy(rows, drows, rb, cudaMemcpyDeviceToHost);
        cudaMemcpy(fine, dfine, fb, cudaMemcpyDeviceToHost);
        if (probs_out != nullptr) cudaMemcpy(probs_out, vprobs, planes, cudaMemcpyDeviceToHost);
        if (pred_out != nullptr) cudaMemcpy(pred_out, vpred, labels, cudaMemcpyDeviceToHost);
      }
    }
  }
  for (void* p : {dlogits, done, dprobs, dpred, dref, drows, dfine, dscratch, vprobs, vpred}) cudaFree(p);
  return error;
}

}  // namespace tally
