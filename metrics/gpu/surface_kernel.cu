#include "metrics/gpu/surface_kernel.h"

#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace tally {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;
constexpr int64_t kTile = kThreads * kPerThread;  // Pixels per tile; a thread takes 8 in a row.
constexpr uint8_t kNoEdge = 255;
constexpr uint16_t kNoGap = 0xFFFF;
constexpr int kMaxClasses = 64;
constexpr size_t kMaxGapBytes = size_t{256} << 20;  // Column gaps of at most this many classes at once.

// Summary of one directed distance set (metrics/surface_distance.cc's Directed).
struct Directed {
  double max;
  double p95;
  double sum;
  long long within;
  long long n;
};

struct MaxOp {
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};
struct MinKeyOp {
  __device__ __forceinline__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a < b ? a : b;
  }
};

struct Layout {
  int64_t hw, segments, tiles;
  int chunk;  // Classes whose column gaps are held at once.
  size_t edges, counts, offsets, starts, totals, values, gaps, directed, bytes;
};

size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

Layout MakeLayout(int64_t n, int64_t height, int64_t width, int k) {
  Layout l;
  l.hw = height * width;
  l.segments = 2 * n;  // (image, set): set 0 = prediction edges, 1 = reference edges.
  l.tiles = (l.hw + kTile - 1) / kTile;
  const size_t gap_per_class = static_cast<size_t>(l.segments * l.hw) * sizeof(uint16_t);
  l.chunk = static_cast<int>(std::max<size_t>(1, std::min<size_t>(k, kMaxGapBytes / std::max<size_t>(gap_per_class, 1))));
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += Align(bytes);
    return here;
  };
  l.edges = take(static_cast<size_t>(l.segments * l.hw));
  l.counts = take(static_cast<size_t>(l.segments * k * l.tiles) * sizeof(int));
  l.offsets = take(static_cast<size_t>(l.segments * k * l.tiles) * sizeof(int));
  l.starts = take(static_cast<size_t>(l.segments * k) * sizeof(int));
  l.totals = take(static_cast<size_t>(l.segments * k) * sizeof(int));
  l.values = take(static_cast<size_t>(l.segments * l.hw) * sizeof(double));
  l.gaps = take(gap_per_class * l.chunk);
  l.directed = take(static_cast<size_t>(l.segments * k) * sizeof(Directed));
  l.bytes = at;
  return l;
}

// Edge pixels of both maps: the class (< K) of a pixel whose 4-neighbours are not all of its class
// or that lies on the image border, else kNoEdge. Ignored reference pixels are in no class, in the
// prediction too (ExtractEdges' label functions in ClassSurfaceMetrics).
__global__ void EdgeKernel(const int16_t* __restrict__ pred, const int16_t* __restrict__ ref, int64_t n, int height,
                           int width, int k, uint8_t* __restrict__ edges) {
  const int64_t hw = static_cast<int64_t>(height) * width;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n * hw;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t img = g / hw;
    const int64_t p = g - img * hw;
    const int y = static_cast<int>(p / width), x = static_cast<int>(p - static_cast<int64_t>(y) * width);
    const int16_t* r = ref + img * hw;
    for (int set = 0; set < 2; ++set) {
      const int16_t* m = set == 0 ? pred + img * hw : r;
      auto label = [&](int64_t i) -> int { return r[i] < 0 ? -1 : m[i]; };
      const int l = label(p);
      uint8_t e = kNoEdge;
      if (l >= 0 && l < k) {
        const bool interior = y > 0 && y + 1 < height && x > 0 && x + 1 < width && label(p - width) == l &&
                              label(p + width) == l && label(p - 1) == l && label(p + 1) == l;
        if (!interior) e = static_cast<uint8_t>(l);
      }
      edges[(img * 2 + set) * hw + p] = e;
    }
  }
}

// Edge pixels per (segment, class, tile).
__global__ void TileCountKernel(const uint8_t* __restrict__ edges, int64_t hw, int k, int64_t tiles,
                                int* __restrict__ counts) {
  __shared__ int hist[kMaxClasses];
  const int64_t seg = blockIdx.y, tile = blockIdx.x;
  for (int c = threadIdx.x; c < k; c += blockDim.x) hist[c] = 0;
  __syncthreads();
  const uint8_t* e = edges + seg * hw;
  for (int64_t p = tile * kTile + threadIdx.x; p < min(hw, (tile + 1) * kTile); p += blockDim.x) {
    if (e[p] != kNoEdge) atomicAdd(&hist[e[p]], 1);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < k; c += blockDim.x) counts[(seg * k + c) * tiles + tile] = hist[c];
}

// Per segment: each class's tile offsets (exclusive prefix sums), its total, and where its slots
// start in the segment's value range (classes one after the other).
__global__ void ScanKernel(const int* __restrict__ counts, int k, int64_t tiles, int* __restrict__ offsets,
                           int* __restrict__ starts, int* __restrict__ totals) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t seg = blockIdx.x;
  for (int c = 0; c < k; ++c) {
    const int* in = counts + (seg * k + c) * tiles;
    int* out = offsets + (seg * k + c) * tiles;
    int running = 0;
    for (int64_t t0 = 0; t0 < tiles; t0 += kThreads) {
      const int64_t t = t0 + threadIdx.x;
      const int v = t < tiles ? in[t] : 0;
      int off = 0, total = 0;
      Scan(tmp).ExclusiveSum(v, off, total);
      if (t < tiles) out[t] = running + off;
      running += total;
      __syncthreads();
    }
    if (threadIdx.x == 0) totals[seg * k + c] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int at = 0;
    for (int c = 0; c < k; ++c) {
      starts[seg * k + c] = at;
      at += totals[seg * k + c];
    }
  }
}

// Column gaps of class c0 + blockIdx.z's edges in every segment: for each pixel, the distance in rows
// to the nearest feature of its column (kNoGap: the column has none).
__global__ void ColumnKernel(const uint8_t* __restrict__ edges, int height, int width, int c0, int64_t segments,
                             uint16_t* __restrict__ gaps) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= width) return;
  const int64_t hw = static_cast<int64_t>(height) * width;
  const int64_t seg = blockIdx.y;
  const uint8_t c = static_cast<uint8_t>(c0 + blockIdx.z);
  const uint8_t* e = edges + seg * hw;
  uint16_t* g = gaps + (static_cast<int64_t>(blockIdx.z) * segments + seg) * hw;
  int last = -1;
  for (int y = 0; y < height; ++y) {
    const int64_t p = static_cast<int64_t>(y) * width + x;
    if (e[p] == c) last = y;
    g[p] = last < 0 ? kNoGap : static_cast<uint16_t>(y - last);
  }
  int next = -1;
  for (int y = height - 1; y >= 0; --y) {
    const int64_t p = static_cast<int64_t>(y) * width + x;
    if (e[p] == c) next = y;
    if (next >= 0) {
      const uint16_t d = static_cast<uint16_t>(next - y);
      if (g[p] == kNoGap || d < g[p]) g[p] = d;
    }
  }
}

__device__ __forceinline__ double ColumnCost(const uint16_t* __restrict__ row, int c, double sy2) {
  const uint16_t v = row[c];
  if (v == kNoGap) return CUDART_INF;
  const double d = static_cast<double>(v);
  return __dmul_rn(__dmul_rn(sy2, d), d);
}

// Squared distance from (y, x) to the nearest feature: DirectedDistances' search, term for term.
__device__ double NearestSquared(const uint16_t* __restrict__ gap, int y, int x, int width, double sy2, double sx2) {
  const uint16_t* row = gap + static_cast<int64_t>(y) * width;
  double best = ColumnCost(row, x, sy2);
  for (int d = 1; d < width; ++d) {
    const double dd = static_cast<double>(d);
    const double dx2 = __dmul_rn(__dmul_rn(sx2, dd), dd);
    if (dx2 >= best || (x - d < 0 && x + d >= width)) break;
    if (x - d >= 0) best = fmin(best, __dadd_rn(dx2, ColumnCost(row, x - d, sy2)));
    if (x + d < width) best = fmin(best, __dadd_rn(dx2, ColumnCost(row, x + d, sy2)));
  }
  return best;
}

// The distance of every edge pixel of classes [c0, c0 + chunk) to the other set's features of its
// class, written to the pixel's slot: its class's start + its tile's offset + its rank in the tile,
// so each (segment, class) range holds its distances in row-major order.
__global__ void DistanceKernel(const uint8_t* __restrict__ edges, int height, int width, int k, int c0, int chunk,
                               int64_t segments, int64_t tiles, const int* __restrict__ counts,
                               const int* __restrict__ offsets, const int* __restrict__ starts,
                               const uint16_t* __restrict__ gaps, double sy2, double sx2, double* __restrict__ values) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t hw = static_cast<int64_t>(height) * width;
  const int64_t seg = blockIdx.y, tile = blockIdx.x;
  const int64_t other = seg ^ 1;  // The same image's other set.
  const int64_t base = tile * kTile + static_cast<int64_t>(threadIdx.x) * kPerThread;
  uint8_t e[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) e[j] = base + j < hw ? edges[seg * hw + base + j] : kNoEdge;
  for (int c = c0; c < c0 + chunk; ++c) {
    const int64_t sc = seg * k + c;
    if (counts[sc * tiles + tile] == 0) continue;  // Uniform over the block.
    int mine = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) mine += e[j] == c;
    int rank = 0;
    Scan(tmp).ExclusiveSum(mine, rank);
    __syncthreads();
    if (mine == 0) continue;
    double* out = values + seg * hw + starts[sc] + offsets[sc * tiles + tile] + rank;
    const uint16_t* gap = gaps + (static_cast<int64_t>(c - c0) * segments + other) * hw;
    for (int j = 0; j < kPerThread; ++j) {
      if (e[j] != c) continue;
      const int64_t p = base + j;
      const int y = static_cast<int>(p / width), x = static_cast<int>(p - static_cast<int64_t>(y) * width);
      *out++ = __dsqrt_rn(NearestSquared(gap, y, x, width, sy2, sx2));
    }
  }
}

__device__ __forceinline__ unsigned long long Key(double v) {
  return static_cast<unsigned long long>(__double_as_longlong(v));  // Ordered as v for v >= +0.
}

// The rank-th smallest (0-based) of n non-negative doubles: radix select on their bits, 8 at a time.
__device__ double SelectRank(const double* __restrict__ v, long long n, long long rank) {
  __shared__ unsigned hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ long long s_rank;
  unsigned long long prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned long long key = Key(v[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long below = 0;
      int digit = 0;
      for (; digit < 255; ++digit) {
        if (below + hist[digit] > rank) break;
        below += hist[digit];
      }
      s_prefix = prefix | (static_cast<unsigned long long>(digit) << shift);
      s_rank = rank - below;
    }
    __syncthreads();
    prefix = s_prefix;
    rank = s_rank;
    mask |= 255ull << shift;
    __syncthreads();
  }
  return __longlong_as_double(static_cast<long long>(prefix));
}

__device__ __forceinline__ double Lerp(double a, double b, double t) {
  const double diff = __dsub_rn(b, a);
  return t >= 0.5 ? __dsub_rn(b, __dmul_rn(diff, __dsub_rn(1.0, t))) : __dadd_rn(a, __dmul_rn(diff, t));
}

// One block per (segment, class): Summarise() of its distances.
__global__ void SummaryKernel(const double* __restrict__ values, int64_t hw, int k, const int* __restrict__ starts,
                              const int* __restrict__ totals, double tolerance, Directed* __restrict__ directed) {
  using MaxReduce = cub::BlockReduce<double, kThreads>;
  using CountReduce = cub::BlockReduce<long long, kThreads>;
  using KeyReduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename CountReduce::TempStorage count;
    typename KeyReduce::TempStorage key;
  } tmp;
  __shared__ long long s_less_equal;
  __shared__ unsigned long long s_above;
  const int64_t sc = blockIdx.x;
  const int64_t seg = sc / k;
  const long long n = totals[sc];
  const double* v = values + seg * hw + starts[sc];
  Directed out{0.0, 0.0, 0.0, 0, n};
  if (n == 0) {
    if (threadIdx.x == 0) directed[sc] = out;
    return;
  }
  double mx = 0.0;
  long long within = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    mx = fmax(mx, v[i]);
    within += v[i] <= tolerance;
  }
  mx = MaxReduce(tmp.max).Reduce(mx, MaxOp());
  __syncthreads();
  within = CountReduce(tmp.count).Sum(within);
  __syncthreads();
  // PercentileLinear(d, 0.95).
  const double pos = __dmul_rn(0.95, static_cast<double>(n - 1));
  const long long lo = static_cast<long long>(floor(pos));
  const double t = __dsub_rn(pos, static_cast<double>(lo));
  const double a = SelectRank(v, n, lo);
  double p95 = a;
  if (lo + 1 < n && t != 0) {
    // The (lo + 1)-th smallest: a again when a's copies reach past lo, else the least value above a.
    const unsigned long long ka = Key(a);
    long long le = 0;
    unsigned long long above = ~0ull;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned long long key = Key(v[i]);
      le += key <= ka;
      if (key > ka) above = min(above, key);
    }
    le = CountReduce(tmp.count).Sum(le);
    __syncthreads();
    above = KeyReduce(tmp.key).Reduce(above, MinKeyOp());
    if (threadIdx.x == 0) {
      s_less_equal = le;
      s_above = above;
    }
    __syncthreads();
    const double b = s_less_equal > lo + 1 ? a : __longlong_as_double(static_cast<long long>(s_above));
    p95 = Lerp(a, b, t);
  }
  // The sum: in row-major order, one rounding per addition, as the CPU adds. One thread adds; the
  // block stages the values in shared memory first, so the chain waits on additions, not on loads.
  __shared__ double staged[kTile];
  double sum = 0.0;
  for (long long c0 = 0; c0 < n; c0 += kTile) {
    const int m = static_cast<int>(min(static_cast<long long>(kTile), n - c0));
    for (int i = threadIdx.x; i < m; i += blockDim.x) staged[i] = v[c0 + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < m; ++i) sum = __dadd_rn(sum, staged[i]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out.max = mx;
    out.p95 = p95;
    out.sum = sum;
    out.within = within;
    directed[sc] = out;
  }
}

// Combine() of the two directions, per (image, class): hd, hd95, assd, nsd.
__global__ void CombineKernel(const Directed* __restrict__ directed, int64_t n, int k, double* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * k) return;
  const int64_t img = i / k, c = i - img * k;
  const Directed a = directed[(img * 2) * k + c];      // Prediction edges -> reference edges.
  const Directed b = directed[(img * 2 + 1) * k + c];  // Reference edges -> prediction edges.
  double* o = out + i * 4;
  if (a.n == 0 && b.n == 0) {
    const double nan = __longlong_as_double(0x7ff8000000000000ll);
    o[0] = o[1] = o[2] = o[3] = nan;
  } else if (a.n == 0 || b.n == 0) {
    o[0] = o[1] = o[2] = CUDART_INF;
    o[3] = 0.0;
  } else {
    const double total = static_cast<double>(a.n + b.n);
    o[0] = fmax(a.max, b.max);
    o[1] = fmax(a.p95, b.p95);
    o[2] = __ddiv_rn(__dadd_rn(a.sum, b.sum), total);
    o[3] = __ddiv_rn(static_cast<double>(a.within + b.within), total);
  }
}

}  // namespace

bool SurfaceKernelSupports(int num_classes, int64_t height, int64_t width) {
  return num_classes >= 1 && num_classes <= kMaxClasses && height >= 1 && width >= 1 && height < kNoGap &&
         width < kNoGap && height * width < (int64_t{1} << 31);
}

size_t SurfaceScratchBytes(int64_t n, int64_t height, int64_t width, int num_classes) {
  return MakeLayout(n, height, width, num_classes).bytes;
}

bool LaunchSurface(const int16_t* pred, const int16_t* ref, int64_t n, int64_t height, int64_t width, int num_classes,
                   const SurfaceOptions& options, void* scratch, double* out, void* stream) {
  if (!SurfaceKernelSupports(num_classes, height, width) || n <= 0 || 2 * n > 65535) return false;
  const int k = num_classes;
  const Layout l = MakeLayout(n, height, width, k);
  auto* s = static_cast<cudaStream_t>(stream);
  auto* base = static_cast<char*>(scratch);
  auto* edges = reinterpret_cast<uint8_t*>(base + l.edges);
  auto* counts = reinterpret_cast<int*>(base + l.counts);
  auto* offsets = reinterpret_cast<int*>(base + l.offsets);
  auto* starts = reinterpret_cast<int*>(base + l.starts);
  auto* totals = reinterpret_cast<int*>(base + l.totals);
  auto* values = reinterpret_cast<double*>(base + l.values);
  auto* gaps = reinterpret_cast<uint16_t*>(base + l.gaps);
  auto* directed = reinterpret_cast<Directed*>(base + l.directed);
  const int h = static_cast<int>(height), w = static_cast<int>(width);
  const double sy2 = options.spacing_y * options.spacing_y, sx2 = options.spacing_x * options.spacing_x;

  const int64_t pixels = n * l.hw;
  const unsigned edge_blocks = static_cast<unsigned>(std::min<int64_t>((pixels + kThreads - 1) / kThreads, 8192));
  EdgeKernel<<<edge_blocks, kThreads, 0, s>>>(pred, ref, n, h, w, k, edges);
  const dim3 tile_grid(static_cast<unsigned>(l.tiles), static_cast<unsigned>(l.segments));
  TileCountKernel<<<tile_grid, kThreads, 0, s>>>(edges, l.hw, k, l.tiles, counts);
  ScanKernel<<<static_cast<unsigned>(l.segments), kThreads, 0, s>>>(counts, k, l.tiles, offsets, starts, totals);
  for (int c0 = 0; c0 < k; c0 += l.chunk) {
    const int chunk = std::min(l.chunk, k - c0);
    const dim3 column_grid(static_cast<unsigned>((w + 127) / 128), static_cast<unsigned>(l.segments),
                           static_cast<unsigned>(chunk));
    ColumnKernel<<<column_grid, 128, 0, s>>>(edges, h, w, c0, l.segments, gaps);
    DistanceKernel<<<tile_grid, kThreads, 0, s>>>(edges, h, w, k, c0, chunk, l.segments, l.tiles, counts, offsets,
                                                  starts, gaps, sy2, sx2, values);
  }
  SummaryKernel<<<static_cast<unsigned>(l.segments * k), kThreads, 0, s>>>(values, l.hw, k, starts, totals,
                                                                           options.nsd_tolerance, directed);
  const int64_t pairs = n * k;
  CombineKernel<<<static_cast<unsigned>((pairs + kThreads - 1) / kThreads), kThreads, 0, s>>>(directed, n, k, out);
  return cudaGetLastError() == cudaSuccess;
}

std::string SurfaceOnDeviceSync(const int16_t* pred, const int16_t* ref, int64_t n, int64_t height, int64_t width,
                                int num_classes, const SurfaceOptions& options, double* out, double* kernel_ms) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  if (!SurfaceKernelSupports(num_classes, height, width)) return "unsupported class count or size";
  const size_t map_bytes = static_cast<size_t>(n * height * width) * sizeof(int16_t);
  const size_t out_bytes = static_cast<size_t>(n * num_classes * 4) * sizeof(double);
  const size_t scratch_bytes = SurfaceScratchBytes(n, height, width, num_classes);
  void *d_pred = nullptr, *d_ref = nullptr, *d_out = nullptr, *d_scratch = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::string error;
  auto check = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess && error.empty()) error = std::string(what) + ": " + cudaGetErrorString(e);
    return error.empty();
  };
  if (check(cudaStreamCreate(&stream), "cudaStreamCreate") && check(cudaEventCreate(&start), "cudaEventCreate") &&
      check(cudaEventCreate(&stop), "cudaEventCreate") && check(cudaMalloc(&d_pred, map_bytes), "cudaMalloc") &&
      check(cudaMalloc(&d_ref, map_bytes), "cudaMalloc") && check(cudaMalloc(&d_out, out_bytes), "cudaMalloc") &&
      check(cudaMalloc(&d_scratch, scratch_bytes), "cudaMalloc") &&
      check(cudaMemcpy(d_pred, pred, map_bytes, cudaMemcpyHostToDevice), "cudaMemcpy") &&
      check(cudaMemcpy(d_ref, ref, map_bytes, cudaMemcpyHostToDevice), "cudaMemcpy") &&
      check(cudaEventRecord(start, stream), "cudaEventRecord")) {
    if (!LaunchSurface(static_cast<const int16_t*>(d_pred), static_cast<const int16_t*>(d_ref), n, height, width,
                       num_classes, options, d_scratch, static_cast<double*>(d_out), stream)) {
      error = std::string("LaunchSurface failed: ") + cudaGetErrorString(cudaGetLastError());
    }
    if (check(cudaEventRecord(stop, stream), "cudaEventRecord") &&
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize") &&
        check(cudaMemcpy(out, d_out, out_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy") && kernel_ms != nullptr) {
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      *kernel_ms = ms;
    }
  }
  for (void* p : {d_pred, d_ref, d_out, d_scratch}) {
    if (p != nullptr) cudaFree(p);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (stream != nullptr) cudaStreamDestroy(stream);
  return error;
}

}  // namespace tally
