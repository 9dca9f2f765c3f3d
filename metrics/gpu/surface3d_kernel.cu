#include "metrics/gpu/surface3d_kernel.h"
#include "metrics/gpu/surface3d_memory.h"

#include "metrics/box_search.h"
#include "metrics/far_transform.h"
#include "metrics/label_counts.h"
#include "metrics/parallel_for.h"
#include "metrics/statistics.h"
#include "metrics/surface_summary.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <mutex>
#include <vector>
#include <thrust/iterator/counting_iterator.h>

namespace tally {
namespace {

using namespace surface3d_internal;  // NOLINT: the memory helpers of this one kernel file.

constexpr int kThreads = 256;
unsigned Blocks(int64_t n) { return static_cast<unsigned>((std::max<int64_t>(n, 1) + kThreads - 1) / kThreads); }
constexpr int kBudgetItems = static_cast<int>(kSurfaceQueryChunk) / kThreads;
static_assert(kBudgetItems * kThreads == static_cast<int>(kSurfaceQueryChunk), "a budget chunk per block");
// The far transform takes the slices holding far queries in batches of at most FarCells() cells (box
// voxels of the batch's slices, 24 bytes each of device memory): a 48th of the device's memory,
// between 2^25 and 2^27 cells (a 512 x 512 box: 127 to 510 slices at once). Each pass runs a thread
// per envelope (a slice's column, a query row), a chain of steps as long as the box is wide, so a
// batch takes about as long as one chain whatever its size until the GPU is full: fewer, larger
// batches are faster. On an H200, a 2-label speckled 512x512x300 prediction's far transforms
// (605 box slices, both directions): 2^25 cells 11.8 ms, 2^26 10.1, 2^27 8.5, 2^28 8.5; fragmented
// 5.8, 4.8, 3.8, 3.7 (BENCHMARKS.md "3D surface distances"). TALLY_SURFACE3D_FAR_CELLS=N (benchmarks,
// tests): another limit.
constexpr int64_t kFarCellsLeast = int64_t{1} << 25, kFarCellsMost = int64_t{1} << 27;

// A bitmap's box: its first voxel and its extent along y and x.
struct Box {
  int64_t z0, y0, x0, by, bx;
  __device__ int64_t At(int64_t z, int64_t y, int64_t x) const { return ((z - z0) * by + (y - y0)) * bx + (x - x0); }
};

// A voxel's (z, y, x) from its linear index.
struct Geometry3 {
  int64_t depth, height, width, plane;
  __host__ __device__ void Zyx(int64_t i, int64_t* z, int64_t* y, int64_t* x) const {
    *z = i / plane;
    const int64_t r = i - *z * plane;
    *y = r / width;
    *x = r - *y * width;
  }
};

// Edge voxels (the CPU's rule) of both maps: edge[m][i] is i's class where i is an edge voxel of
// map m, else -1. T: the labels as uploaded (uint8 where they fit; `ignore` then the narrowed one).
template <typename T>
__global__ void EdgeKernel(const T* pred, const T* ref, Geometry3 g, int classes, uint32_t ignore, int16_t* pred_edge,
                           int16_t* ref_edge) {
  const int64_t n = g.depth * g.plane;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t z, y, x;
  g.Zyx(i, &z, &y, &x);
  const bool inner = z > 0 && z + 1 < g.depth && y > 0 && y + 1 < g.height && x > 0 && x + 1 < g.width;
  const int64_t width = g.width, plane = g.plane;
  for (int m = 0; m < 2; ++m) {
    const T* map = m == 0 ? pred : ref;
    auto label = [&](int64_t j) -> uint32_t { return ref[j] == ignore ? 0xFFFFFFFFu : map[j]; };
    const uint32_t l = label(i);
    int16_t e = -1;
    if (l < static_cast<uint32_t>(classes)) {
      const bool interior = inner && label(i - 1) == l && label(i + 1) == l && label(i - width) == l &&
                            label(i + width) == l && label(i - plane) == l && label(i + plane) == l;
      if (!interior) e = static_cast<int16_t>(l);
    }
    (m == 0 ? pred_edge : ref_edge)[i] = e;
  }
}

struct IsEdge {
  const int16_t* edges;
  __device__ __forceinline__ bool operator()(int64_t i) const { return edges[i] >= 0; }
};

// Edge voxels per class of both maps (counts[m * classes + c]), a warp's voxels of one class
// counted at once: neighbours mostly share a class, and one counter per class takes every atomic.
__global__ void CountKernel(const int16_t* pred_edge, const int16_t* ref_edge, int64_t n, int classes,
                            unsigned long long* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // Whole warps reach the votes.
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int m = 0; m < 2; ++m) {
    const int key = i < n ? (m == 0 ? pred_edge : ref_edge)[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    if (key >= 0 && lane == __ffs(peers) - 1) atomicAdd(&counts[m * classes + key], static_cast<unsigned long long>(__popc(peers)));
  }
}

// The order statistics of one direction's sorted distances the summary needs: the largest, the
// values of ranks `rank` and rank + 1, and how many are within `tolerance`.
__global__ void OrderStatsKernel(const double* sorted, int64_t n, int64_t rank, double tolerance, double* out) {
  const int64_t within = far_transform::PartitionPoint(0, n, [&](int64_t i) { return sorted[i] <= tolerance; });
  out[0] = sorted[n - 1];
  out[1] = sorted[rank];
  out[2] = rank + 1 < n ? sorted[rank + 1] : sorted[rank];
  out[3] = static_cast<double>(within);
}

__global__ void ClassOfKernel(const int64_t* voxels, int64_t n, const int16_t* edge, uint16_t* cls) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) cls[k] = static_cast<uint16_t>(edge[voxels[k]]);
}

// Bounding boxes as six minima per slot (z, y, x and their negations: the maxima; set to 0x7f7f7f7f
// first), slot = cls[k] (or 0 without cls). A block of one slot reduces first and writes once.
struct MinOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a < b ? a : b; }
};
__global__ void BoundsKernel(const int64_t* voxels, const uint16_t* cls, int64_t n, Geometry3 g, int* bounds) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x;
  const int64_t k = first + threadIdx.x;
  const int64_t last = min(n, first + blockDim.x) - 1;
  const bool uniform = cls == nullptr || cls[first] == cls[last];
  int v[6] = {INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX};
  if (k < n) {
    int64_t z, y, x;
    g.Zyx(voxels[k], &z, &y, &x);
    v[0] = static_cast<int>(z), v[1] = static_cast<int>(y), v[2] = static_cast<int>(x);
    v[3] = -v[0], v[4] = -v[1], v[5] = -v[2];
  }
  if (uniform) {
    const int slot = cls == nullptr ? 0 : cls[first];
    for (int a = 0; a < 6; ++a) {
      const int m = Reduce(temp).Reduce(v[a], MinOp{});
      __syncthreads();
      if (threadIdx.x == 0) atomicMin(&bounds[slot * 6 + a], m);
    }
  } else if (k < n) {
    for (int a = 0; a < 6; ++a) atomicMin(&bounds[cls[k] * 6 + a], v[a]);
  }
}

__global__ void BitsKernel(const int64_t* features, int64_t n, Geometry3 g, Box b, uint32_t* bits) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  int64_t z, y, x;
  g.Zyx(features[k], &z, &y, &x);
  const int64_t at = b.At(z, y, x);
  atomicOr(&bits[at >> 5], 1u << (at & 31));
}

// The features of one direction as a bitmap over their box.
struct DeviceFeatureBits {
  const uint32_t* bits;
  Box b;
  __device__ bool operator()(int64_t z, int64_t y, int64_t x) const {
    const int64_t at = b.At(z, y, x);
    return (bits[at >> 5] >> (at & 31)) & 1u;
  }
};

// The CPU's box search for one query (metrics/box_search.h), without the chunk budget
// (BudgetKernel applies it).
__global__ void NearKernel(const int64_t* queries, int64_t n, DeviceFeatureBits has, FeatureBox f, Geometry3 g, double sz,
                           double sy, double sx, int64_t max_box, double* near, uint8_t* found, int64_t* cost) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  int64_t z, y, x;
  g.Zyx(queries[k], &z, &y, &x);
  double best = 0;
  const bool ok = BoxSearch(z, y, x, f, sz, sy, sx, max_box, has, &best, &cost[k]);
  near[k] = ok ? sqrt(best) : 0.0;
  found[k] = ok ? 1 : 0;
}

// FinishDirected3D's chunk budgets, a block per chunk: query q goes far when its chunk's budget is
// spent by the queries before it (the CPU stops charging then, so a prefix sum decides) or its box
// search found nothing; the others' distances are final.
__global__ void BudgetKernel(const int64_t* cost, const uint8_t* found, const double* near, int64_t n,
                             int64_t per_query, uint8_t* far, double* dist) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * static_cast<int64_t>(kSurfaceQueryChunk);
  const int64_t len = min(static_cast<int64_t>(kSurfaceQueryChunk), n - base);
  const int64_t budget = per_query * len + (int64_t{1} << 16);
  int64_t spent[kBudgetItems];
  for (int j = 0; j < kBudgetItems; ++j) {
    const int64_t q = base + threadIdx.x * kBudgetItems + j;
    spent[j] = q < n ? cost[q] : 0;
  }
  Scan(temp).ExclusiveSum(spent, spent);
  for (int j = 0; j < kBudgetItems; ++j) {
    const int64_t q = base + threadIdx.x * kBudgetItems + j;
    if (q >= n) break;
    const bool is_far = budget - spent[j] < 0 || !found[q];
    far[q] = is_far ? 1 : 0;
    dist[q] = is_far ? 0.0 : near[q];
  }
}

// Far queries' voxels, and where each (z, y) row of them starts.
__global__ void GatherFarKernel(const int64_t* queries, const int64_t* far_at, int64_t n, int64_t width,
                                int64_t* far_queries, uint8_t* row_starts) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t i = queries[far_at[k]];
  far_queries[k] = i;
  row_starts[k] = k == 0 || queries[far_at[k - 1]] / width != i / width;
}

// Where each slice's rows start; each row's y in the box comes later (RowYKernel).
__global__ void SliceStartsKernel(const int64_t* far_queries, const int64_t* row_first, int64_t rows, int64_t plane,
                                  uint8_t* slice_starts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  slice_starts[i] = i == 0 || far_queries[row_first[i - 1]] / plane != far_queries[row_first[i]] / plane;
}

__global__ void RowYKernel(const int64_t* far_queries, const int64_t* row_first, int64_t rows, Geometry3 g, int64_t y0,
                           int32_t* row_y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  int64_t z, y, x;
  g.Zyx(far_queries[row_first[i]], &z, &y, &x);
  row_y[i] = static_cast<int32_t>(y - y0);
}

// The features' column keys, (box column) * depth + z: sorted, they give each column's z ascending.
__global__ void ColumnKeysKernel(const int64_t* features, int64_t n, Geometry3 g, int64_t y0, int64_t x0, int W,
                                 uint64_t* keys) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  int64_t z, y, x;
  g.Zyx(features[k], &z, &y, &x);
  keys[k] = static_cast<uint64_t>(((y - y0) * W + (x - x0)) * g.depth + z);
}

__global__ void ColumnStartKernel(const uint64_t* keys, int64_t n, int64_t columns, int64_t depth,
                                  int64_t* col_start) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c > columns) return;
  const uint64_t key = static_cast<uint64_t>(c * depth);
  col_start[c] = far_transform::PartitionPoint(0, n, [&](int64_t i) { return keys[i] < key; });
}

__global__ void ColumnZKernel(const uint64_t* keys, int64_t n, int64_t depth, int32_t* fz) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) fz[k] = static_cast<int32_t>(keys[k] % static_cast<uint64_t>(depth));
}

// What the far transform's passes share: the box, the column index and the rows and slices of the
// far queries.
struct FarPlan {
  far_transform::Geometry g;
  const int64_t* col_start;
  const int32_t* fz;
  const int64_t* far_queries;  // Ascending.
  const int64_t* far_at;       // Each far query's place among the direction's queries.
  const int64_t* row_first;    // rows_n rows; the last ends at far_n.
  const int32_t* row_y;
  const int64_t* slice_first;  // slices_n slices; the last ends at rows_n.
  int64_t far_n, rows_n, slices_n;
  // One batch of slices: their z pass (gz, by slice then row then column), the envelopes' storage
  // and the y pass's results.
  int32_t* gz = nullptr;
  int32_t* v = nullptr;
  double* z = nullptr;
  far_transform::RowBest* best = nullptr;
  __device__ int64_t SliceZ(int64_t s) const { return far_queries[row_first[slice_first[s]]] / g.plane; }
};

// Step 1 for slices [s0, s0 + count): a thread per box column, walking the batch's slices (ascending)
// with a cursor into the column's features, as the CPU's ZPass does (a binary search per slice and
// column was a chain of dependent reads per cell: z 3.3 ms of a 2-label speckled prediction's far
// transforms on an H200).
__global__ void ZPassKernel(FarPlan p, int64_t s0, int64_t count) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t area = static_cast<int64_t>(p.g.H) * p.g.W;
  if (c >= area) return;
  const int64_t begin = p.col_start[c], end = p.col_start[c + 1];
  int64_t lo = begin;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t slice = p.SliceZ(s0 + s);
    while (lo < end && p.fz[lo] < slice) ++lo;
    p.gz[s * area + c] = far_transform::NearestZAt(p.fz, begin, end, lo, slice);
  }
}

// The envelopes of a pass over sites [0, n) in shared memory where a block of a warp or more fits
// (the passes are chains of dependent reads: shared memory answers them several times faster than
// global memory), else in the batch's global storage. Entry k of thread t: [k * stride + t].
constexpr int kEnvelopeSharedBytes = 48 * 1024;
constexpr int kEnvelopeEntryBytes = 12;  // z (double) and v (int32).
// Only where a whole warp's fit (boxes up to 127 voxels a side): blocks of fewer threads leave the
// SMs too few threads to hide the chains' latency, and global memory (cached) is faster there: on
// an H200, 512x512x300 with 5 labels, shared-memory envelopes of 7 threads a block against global
// ones, speckled 0.109 -> 0.066 s, fragmented 0.069 -> 0.050, filling 0.046 -> 0.033, smooth 0.027 ->
// 0.025 (BENCHMARKS.md "3D surface distances"). TALLY_SURFACE3D_GLOBAL_ENVELOPES=1 (tests and benchmarks
// only): every envelope in global memory; the values are the same either way.
int SharedEnvelopeThreads(int n) {
  static const bool global_only = std::getenv("TALLY_SURFACE3D_GLOBAL_ENVELOPES") != nullptr;
  const int fit = std::min(64, kEnvelopeSharedBytes / ((n + 1) * kEnvelopeEntryBytes));
  return global_only || fit < 32 ? 0 : fit;  // 0: global memory.
}
__device__ far_transform::Envelope EnvelopeAt(bool shared_memory, int n, int32_t* v, double* z, int64_t t,
                                              int64_t threads) {
  if (!shared_memory) return far_transform::Envelope{v + t, z + t, threads};
  extern __shared__ double envelope_shared[];
  const int64_t stride = blockDim.x;
  return far_transform::Envelope{reinterpret_cast<int32_t*>(envelope_shared + (n + 1) * stride) + threadIdx.x,
                                 envelope_shared + threadIdx.x, stride};
}

// Step 2 for the same slices, a thread per (slice, box column); the batch's rows start at row r0.
// Five blocks of 256 an SM (48 registers, a few spilled, against 72): more columns' chains at once,
// y passes 3.2 -> 2.6 ms on an H200's 2-label speckled 512x512x300 prediction, fragmented 1.5 ->
// 1.4; the x pass lost that way (4.0 -> 4.9 ms) and keeps its registers.
__global__ void __launch_bounds__(kThreads, 5)
    YPassKernel(FarPlan p, int64_t s0, int64_t count, int64_t r0, bool shared_memory) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = count * p.g.W;
  if (t >= threads) return;
  const int64_t s = s0 + t / p.g.W;
  const int cx = static_cast<int>(t % p.g.W);
  const int64_t first = p.slice_first[s], end = s + 1 < p.slices_n ? p.slice_first[s + 1] : p.rows_n;
  const int64_t at = (first - r0) * p.g.W + cx;
  far_transform::YPassColumn(p.g, p.gz + (s - s0) * p.g.H * p.g.W + cx, p.row_y + first, end - first, p.best + at,
                             EnvelopeAt(shared_memory, p.g.H, p.v, p.z, t, threads));
}

// Rows [r0, r0 + count), a thread per row: its queries' distances into dist.
__global__ void XPassKernel(FarPlan p, int64_t r0, int64_t count, double* dist, bool shared_memory) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const int64_t i = r0 + t;
  const int64_t first = p.row_first[i], end = i + 1 < p.rows_n ? p.row_first[i + 1] : p.far_n;
  far_transform::XPassRow(p.g, p.row_y[i], p.best + t * p.g.W, p.far_queries + first, end - first, p.far_at + first,
                          dist, EnvelopeAt(shared_memory, p.g.W, p.v, p.z, t, count));
}

// Launch shape of a pass of `threads` envelopes over n sites: (blocks, threads a block, shared bytes).
struct PassShape {
  unsigned blocks;
  unsigned block;
  size_t shared;
  bool shared_memory;
};
PassShape ShapeFor(int64_t threads, int n) {
  const int per_block = SharedEnvelopeThreads(n);
  if (per_block < 1) return PassShape{Blocks(threads), static_cast<unsigned>(kThreads), 0, false};
  return PassShape{static_cast<unsigned>((threads + per_block - 1) / per_block), static_cast<unsigned>(per_block),
                   static_cast<size_t>(per_block) * (n + 1) * kEnvelopeEntryBytes, true};
}

// Both maps into `labels` (pred's n, then ref's n) through page-locked staging, a slab at a time
// on up to `threads` threads, each slab copied on as soon as it is staged. narrow: as one byte
// each (the ignore label of ref as 255, other values past 253 as 254 in ref and 255 in pred: none
// is a class when the classes number at most 254).
std::string Upload(const uint16_t* pred, const uint16_t* ref, int64_t n, bool narrow, uint16_t ignore, int threads,
                   int device, cudaStream_t stream, void* labels) {
  const size_t unit = narrow ? 1 : 2;
  cudaError_t err = cudaSuccess;
  uint8_t* staging = static_cast<uint8_t*>(Staging().Get(2 * n * unit, &err));
  TALLY_CUDA_OR_RETURN(err);
  constexpr int64_t kSlab = int64_t{1} << 20;
  const int64_t slabs = (n + kSlab - 1) / kSlab;
  std::atomic<int> failed{static_cast<int>(cudaSuccess)};
  ParallelFor(static_cast<size_t>(2 * slabs), std::max(threads, 4), [&](size_t k) {
    const int m = static_cast<int>(k % 2);
    const int64_t begin = static_cast<int64_t>(k / 2) * kSlab, end = std::min(n, begin + kSlab);
    const uint16_t* src = (m == 0 ? pred : ref) + begin;
    const size_t at = (static_cast<size_t>(m) * n + begin) * unit;
    if (!narrow) {
      std::memcpy(staging + at, src, (end - begin) * unit);
    } else if (m == 0) {
      NarrowPrediction(src, end - begin, staging + at);
    } else {
      NarrowReference(src, end - begin, ignore, staging + at);
    }
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(static_cast<uint8_t*>(labels) + at, staging + at, (end - begin) * unit,
                          cudaMemcpyHostToDevice, stream);
    }
    if (e != cudaSuccess) failed.store(static_cast<int>(e));
  });
  TALLY_CUDA_OR_RETURN(static_cast<cudaError_t>(failed.load()));
  return "";
}

// The volume's geometry and what one call works with.
struct Volume3 {
  Geometry3 g;
  int classes;
  int64_t n;
};

// Each map's edge voxels grouped by class, ascending within each; counts[m][c] and offsets[m][c]
// say where class c's lie; bounds[(m * classes + c) * 6 ...] their box (minima, negated maxima).
struct Edges {
  int64_t* grouped[2] = {nullptr, nullptr};
  std::vector<int64_t> counts[2], offsets[2];
  std::vector<int> bounds;
  int64_t total[2] = {0, 0};
  int64_t most = 1;
};

// Uploads both maps and marks their edge voxels: edge[m][i] is i's class or -1; counts their classes'.
std::string MarkEdges(const uint16_t* pred, const uint16_t* ref, const Volume3& v, uint16_t ignore_label, int threads,
                      int device, cudaStream_t stream, DeviceBuffers* mem, int16_t* edge[2], Edges* out,
                      Profile* profile) {
  cudaError_t err = cudaSuccess;
  const bool narrow = v.classes <= 254;
  void* labels = mem->Alloc<uint8_t>(2 * v.n * (narrow ? 1 : 2), &err);
  TALLY_CUDA_OR_RETURN(err);
  const std::string why = Upload(pred, ref, v.n, narrow, ignore_label, threads, device, stream, labels);
  if (!why.empty()) return why;
  profile->Mark(narrow ? "upload (one byte a voxel)" : "upload");
  for (int m = 0; m < 2; ++m) {
    edge[m] = mem->Alloc<int16_t>(v.n, &err);
    TALLY_CUDA_OR_RETURN(err);
  }
  if (narrow) {
    const uint8_t* l = static_cast<const uint8_t*>(labels);
    EdgeKernel<uint8_t><<<Blocks(v.n), kThreads, 0, stream>>>(l, l + v.n, v.g, v.classes, 255, edge[0], edge[1]);
  } else {
    const uint16_t* l = static_cast<const uint16_t*>(labels);
    EdgeKernel<uint16_t><<<Blocks(v.n), kThreads, 0, stream>>>(l, l + v.n, v.g, v.classes, ignore_label, edge[0],
                                                               edge[1]);
  }
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  unsigned long long* d_counts = mem->Alloc<unsigned long long>(2 * static_cast<size_t>(v.classes), &err);
  TALLY_CUDA_OR_RETURN(err);
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(d_counts, 0, 2 * v.classes * sizeof(unsigned long long), stream));
  CountKernel<<<Blocks(v.n), kThreads, 0, stream>>>(edge[0], edge[1], v.n, v.classes, d_counts);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  std::vector<unsigned long long> counts(2 * static_cast<size_t>(v.classes));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(counts.data(), d_counts, counts.size() * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  profile->Mark("edges and counts");
  for (int m = 0; m < 2; ++m) {
    out->counts[m].resize(v.classes);
    out->offsets[m].resize(v.classes);
    for (int c = 0; c < v.classes; ++c) {
      out->counts[m][c] = static_cast<int64_t>(counts[m * v.classes + c]);
      out->offsets[m][c] = out->total[m];
      out->total[m] += out->counts[m][c];
      out->most = std::max(out->most, out->counts[m][c]);
    }
  }
  return "";
}

// The edge voxels compacted in voxel order, then sorted by class (stable), and each class's box.
std::string GroupByClass(int16_t* const edge[2], const Volume3& v, cudaStream_t stream, DeviceBuffers* mem,
                         Edges* out) {
  cudaError_t err = cudaSuccess;
  int64_t* all[2];
  uint16_t* cls[2];
  uint16_t* cls_sorted[2];
  for (int m = 0; m < 2; ++m) {
    all[m] = mem->Alloc<int64_t>(out->total[m], &err);
    TALLY_CUDA_OR_RETURN(err);
    out->grouped[m] = mem->Alloc<int64_t>(out->total[m], &err);
    TALLY_CUDA_OR_RETURN(err);
    cls[m] = mem->Alloc<uint16_t>(out->total[m], &err);
    TALLY_CUDA_OR_RETURN(err);
    cls_sorted[m] = mem->Alloc<uint16_t>(out->total[m], &err);
    TALLY_CUDA_OR_RETURN(err);
  }
  int64_t* d_selected = mem->Alloc<int64_t>(2, &err);
  TALLY_CUDA_OR_RETURN(err);
  const int64_t larger = std::max<int64_t>(1, std::max(out->total[0], out->total[1]));
  const int class_bits = BitsFor(static_cast<uint64_t>(v.classes));
  thrust::counting_iterator<int64_t> indices(0);
  size_t temp_bytes = 0, need = 0;
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(nullptr, need, indices, all[0], d_selected, v.n, IsEdge{edge[0]}, stream));
  temp_bytes = std::max(temp_bytes, need);
  TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, need, cls[0], cls_sorted[0], all[0], out->grouped[0],
                                                       larger, 0, class_bits, stream));
  temp_bytes = std::max(temp_bytes, need);
  void* temp = mem->Alloc<uint8_t>(temp_bytes, &err);
  TALLY_CUDA_OR_RETURN(err);
  int* d_bounds = mem->Alloc<int>(12 * static_cast<size_t>(v.classes), &err);
  TALLY_CUDA_OR_RETURN(err);
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(d_bounds, 0x7f, 12 * v.classes * sizeof(int), stream));
  for (int m = 0; m < 2; ++m) {
    if (out->total[m] == 0) continue;
    TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(temp, temp_bytes, indices, all[m], d_selected + m, v.n,
                                               IsEdge{edge[m]}, stream));
    ClassOfKernel<<<Blocks(out->total[m]), kThreads, 0, stream>>>(all[m], out->total[m], edge[m], cls[m]);
    TALLY_CUDA_OR_RETURN(cudaGetLastError());
    size_t bytes = temp_bytes;
    TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortPairs(temp, bytes, cls[m], cls_sorted[m], all[m], out->grouped[m],
                                                         out->total[m], 0, class_bits, stream));
    BoundsKernel<<<Blocks(out->total[m]), kThreads, 0, stream>>>(out->grouped[m], cls_sorted[m], out->total[m], v.g,
                                                                 d_bounds + m * v.classes * 6);
    TALLY_CUDA_OR_RETURN(cudaGetLastError());
  }
  out->bounds.resize(12 * static_cast<size_t>(v.classes));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(out->bounds.data(), d_bounds, out->bounds.size() * sizeof(int),
                                       cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  return "";
}

// The far transform's batch storage (gz, envelopes, the y pass's results: kCellBytes a cell), taken
// once a call and grown when a direction needs more: allocated for each direction, its hundreds of
// MB went back to the device at the next synchronisation and were mapped again for the next one.
struct FarStorage {
  static constexpr int64_t kCellBytes = 2 * sizeof(int32_t) + sizeof(far_transform::RowBest) + sizeof(double);
  static_assert(kCellBytes == 24, "the 24 bytes a cell that the comments and BENCHMARKS.md count");
  DeviceBuffers* mem;
  int64_t cells = 0;
  int32_t *gz = nullptr, *v = nullptr;
  far_transform::RowBest* best = nullptr;
  double* z = nullptr;
  std::string Reserve(int64_t need) {
    if (need <= cells) return "";
    cudaError_t err = cudaSuccess;
    for (int32_t** b : {&gz, &v}) {
      *b = mem->Alloc<int32_t>(need, &err);
      TALLY_CUDA_OR_RETURN(err);
    }
    best = mem->Alloc<far_transform::RowBest>(need, &err);
    TALLY_CUDA_OR_RETURN(err);
    z = mem->Alloc<double>(need, &err);
    TALLY_CUDA_OR_RETURN(err);
    cells = need;
    return "";
  }
};

// Device memory for every direction of a call, sized for the largest.
struct Scratch {
  uint32_t* bits;
  double* near;
  uint8_t* found;
  int64_t* cost;
  uint8_t* flags;
  int64_t* far_at;
  int64_t* far_queries;
  int64_t* row_first;
  int32_t* row_y;
  int64_t* slice_first;
  int64_t* selected;  // 3 counts.
  int* far_bounds;    // 6.
  uint64_t* keys;
  uint64_t* keys_sorted;
  int64_t* col_start;
  int32_t* fz;
  int64_t far_cells;  // The most the far transform may take (FarCells).
  FarStorage* far_storage;
  void* temp;
  size_t temp_bytes;
};

// The most cells (FarStorage::kCellBytes each, a box slice needing (H + 1) x W) the far transform's batches may
// take: a 48th of the device's memory between kFarCellsLeast and kFarCellsMost, less on a device
// short of memory (an eighth of its free memory), but always one slice of the volume.
int64_t FarCells(const Volume3& v) {
  static const int64_t limit = [] {
    const char* env = std::getenv("TALLY_SURFACE3D_FAR_CELLS");
    return env != nullptr && std::atoll(env) > 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{0};
  }();
  size_t free_bytes = 0, total_bytes = 0;
  const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  cudaGetLastError();
  int64_t cells = limit;
  if (cells == 0) {
    cells = known ? std::clamp(static_cast<int64_t>(total_bytes / 48 / FarStorage::kCellBytes), kFarCellsLeast,
                               kFarCellsMost)
                  : kFarCellsLeast;
  }
  if (known) cells = std::min<int64_t>(cells, static_cast<int64_t>(free_bytes / 8 / FarStorage::kCellBytes));
  return std::max<int64_t>(cells, (v.g.height + 1) * (v.g.width + 1));
}

std::string MakeScratch(const Volume3& v, int64_t most, cudaStream_t stream, DeviceBuffers* mem, Scratch* s) {
  cudaError_t err = cudaSuccess;
#define TALLY_ALLOC(field, type, count)                  \
  s->field = mem->Alloc<type>(static_cast<size_t>(count), &err); \
  TALLY_CUDA_OR_RETURN(err)
  TALLY_ALLOC(bits, uint32_t, v.n / 32 + 1);
  TALLY_ALLOC(near, double, most);
  TALLY_ALLOC(found, uint8_t, most);
  TALLY_ALLOC(cost, int64_t, most);
  TALLY_ALLOC(flags, uint8_t, most);
  TALLY_ALLOC(far_at, int64_t, most);
  TALLY_ALLOC(far_queries, int64_t, most);
  TALLY_ALLOC(row_first, int64_t, most);
  TALLY_ALLOC(row_y, int32_t, most);
  TALLY_ALLOC(slice_first, int64_t, std::min<int64_t>(most, v.g.depth));
  TALLY_ALLOC(selected, int64_t, 3);
  TALLY_ALLOC(far_bounds, int, 6);
  TALLY_ALLOC(keys, uint64_t, most);
  TALLY_ALLOC(keys_sorted, uint64_t, most);
  TALLY_ALLOC(col_start, int64_t, v.g.plane + 1);
  TALLY_ALLOC(fz, int32_t, most);
  s->far_cells = FarCells(v);
#undef TALLY_ALLOC
  thrust::counting_iterator<int64_t> indices(0);
  size_t need = 0;
  s->temp_bytes = 0;
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::Flagged(nullptr, need, indices, s->flags, s->far_at, s->selected, most,
                                                  stream));
  s->temp_bytes = std::max(s->temp_bytes, need);
  TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortKeys(nullptr, need, s->keys, s->keys_sorted, most, 0, 64, stream));
  s->temp_bytes = std::max(s->temp_bytes, need);
  s->temp = mem->Alloc<uint8_t>(s->temp_bytes, &err);
  TALLY_CUDA_OR_RETURN(err);
  return "";
}

// One direction's queries and features (device, ascending) and the features' box (minima, negated
// maxima).
struct DirectionIn {
  const int64_t* queries;
  int64_t queries_n;
  const int64_t* features;
  int64_t features_n;
  const int* feature_bounds;
};

std::string Selected(const Scratch& s, int k, cudaStream_t stream, int64_t* n) {
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(n, s.selected + k, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  return "";
}

// Steps 1-3 of the far transform over batches of slices that fit `most_cells` (slice_first: where
// each slice's rows start, on the host too).
std::string FarPasses(FarPlan plan, const std::vector<int64_t>& slice_first, int64_t most_cells, cudaStream_t stream,
                      FarStorage* storage, double* dist, Profile* profile) {
  const far_transform::Geometry& g = plan.g;
  const int64_t area = static_cast<int64_t>(g.H) * g.W;
  const int64_t per_slice = static_cast<int64_t>(g.W) * (g.H + 1), per_row = g.W + 1;
  const int64_t cells = std::min(most_cells, std::max(per_slice, plan.slices_n * per_slice));
  const std::string why = storage->Reserve(cells);
  if (!why.empty()) return why;
  plan.gz = storage->gz, plan.v = storage->v, plan.best = storage->best;
  plan.z = storage->z;
  auto rows_until = [&](int64_t end) { return end < plan.slices_n ? slice_first[end] : plan.rows_n; };
  for (int64_t s0 = 0; s0 < plan.slices_n;) {
    int64_t count = 1;
    while (s0 + count < plan.slices_n && (count + 1) * per_slice <= cells &&
           (rows_until(s0 + count + 1) - slice_first[s0]) * per_row <= cells) {
      ++count;
    }
    const int64_t r0 = slice_first[s0], rows = rows_until(s0 + count) - r0;
    ZPassKernel<<<Blocks(area), kThreads, 0, stream>>>(plan, s0, count);
    profile->Add(&profile->far_ms[1]);
    const PassShape y = ShapeFor(count * g.W, g.H), x = ShapeFor(rows, g.W);
    YPassKernel<<<y.blocks, y.block, y.shared, stream>>>(plan, s0, count, r0, y.shared_memory);
    profile->Add(&profile->far_ms[2]);
    XPassKernel<<<x.blocks, x.block, x.shared, stream>>>(plan, r0, rows, dist, x.shared_memory);
    profile->Add(&profile->far_ms[3]);
    TALLY_CUDA_OR_RETURN(cudaGetLastError());
    s0 += count;
  }
  return "";
}

// The far queries' separable transform (metrics/far_transform.h): the box, the column index,
// rows and slices, then the y and x passes over batches of slices that fit the envelope storage.
std::string FarTransform(const DirectionIn& in, int64_t far_n, const Volume3& v, const SurfaceOptions3D& o,
                         const Scratch& s, cudaStream_t stream, double* dist, Profile* profile) {
  thrust::counting_iterator<int64_t> indices(0);
  GatherFarKernel<<<Blocks(far_n), kThreads, 0, stream>>>(in.queries, s.far_at, far_n, v.g.width, s.far_queries,
                                                          s.flags);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  size_t bytes = s.temp_bytes;
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::Flagged(s.temp, bytes, indices, s.flags, s.row_first, s.selected + 1, far_n,
                                                  stream));
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(s.far_bounds, 0x7f, 6 * sizeof(int), stream));
  BoundsKernel<<<Blocks(far_n), kThreads, 0, stream>>>(s.far_queries, nullptr, far_n, v.g, s.far_bounds);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  int64_t rows_n = 0, slices_n = 0;
  int fb[6];
  std::string why = Selected(s, 1, stream, &rows_n);
  if (!why.empty()) return why;
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(fb, s.far_bounds, sizeof fb, cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  SliceStartsKernel<<<Blocks(rows_n), kThreads, 0, stream>>>(s.far_queries, s.row_first, rows_n, v.g.plane, s.flags);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  bytes = s.temp_bytes;
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::Flagged(s.temp, bytes, indices, s.flags, s.slice_first, s.selected + 2,
                                                  rows_n, stream));
  far_transform::Geometry g;
  g.plane = v.g.plane, g.width = v.g.width, g.sz = o.spacing_z, g.sy = o.spacing_y, g.sx = o.spacing_x;
  const int* f = in.feature_bounds;
  g.y0 = std::min(fb[1], f[1]), g.x0 = std::min(fb[2], f[2]);
  g.H = static_cast<int>(std::max(-fb[4], -f[4]) - g.y0 + 1);
  g.W = static_cast<int>(std::max(-fb[5], -f[5]) - g.x0 + 1);
  RowYKernel<<<Blocks(rows_n), kThreads, 0, stream>>>(s.far_queries, s.row_first, rows_n, v.g, g.y0, s.row_y);
  ColumnKeysKernel<<<Blocks(in.features_n), kThreads, 0, stream>>>(in.features, in.features_n, v.g, g.y0, g.x0, g.W,
                                                                   s.keys);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  const int64_t area = static_cast<int64_t>(g.H) * g.W;
  bytes = s.temp_bytes;
  TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortKeys(s.temp, bytes, s.keys, s.keys_sorted, in.features_n, 0,
                                                      BitsFor(static_cast<uint64_t>(area * v.g.depth)), stream));
  ColumnStartKernel<<<Blocks(area + 1), kThreads, 0, stream>>>(s.keys_sorted, in.features_n, area, v.g.depth,
                                                               s.col_start);
  ColumnZKernel<<<Blocks(in.features_n), kThreads, 0, stream>>>(s.keys_sorted, in.features_n, v.g.depth, s.fz);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  why = Selected(s, 2, stream, &slices_n);
  if (!why.empty()) return why;
  std::vector<int64_t> slice_first(static_cast<size_t>(std::min<int64_t>(rows_n, v.g.depth)));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(slice_first.data(), s.slice_first, slice_first.size() * sizeof(int64_t),
                                       cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  profile->far_queries += far_n;
  profile->far_slices += slices_n;
  profile->Add(&profile->far_ms[0]);
  const FarPlan plan{g, s.col_start, s.fz, s.far_queries, s.far_at, s.row_first, s.row_y, s.slice_first, far_n,
                     rows_n, slices_n};
  return FarPasses(plan, slice_first, s.far_cells, stream, s.far_storage, dist, profile);
}

// One direction of one class into dist (its queries' distances): box searches, budgets, the far
// queries' transform.
std::string Directed(const DirectionIn& in, const Volume3& v, const SurfaceOptions3D& o, const Scratch& s,
                     cudaStream_t stream, double* dist, Profile* profile) {
  const int* f = in.feature_bounds;
  const int64_t z1 = -f[3], y1 = -f[4], x1 = -f[5];
  const Box b{f[0], f[1], f[2], y1 - f[1] + 1, x1 - f[2] + 1};
  const size_t words = static_cast<size_t>(((z1 - b.z0 + 1) * b.by * b.bx + 31) / 32);
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(s.bits, 0, words * sizeof(uint32_t), stream));
  BitsKernel<<<Blocks(in.features_n), kThreads, 0, stream>>>(in.features, in.features_n, v.g, b, s.bits);
  NearKernel<<<Blocks(in.queries_n), kThreads, 0, stream>>>(
      in.queries, in.queries_n, DeviceFeatureBits{s.bits, b}, FeatureBox{b.z0, z1, b.y0, y1, b.x0, x1}, v.g,
      o.spacing_z, o.spacing_y, o.spacing_x, kSurfaceMaxBox, s.near, s.found, s.cost);
  const int64_t chunks = (in.queries_n + static_cast<int64_t>(kSurfaceQueryChunk) - 1) /
                         static_cast<int64_t>(kSurfaceQueryChunk);
  BudgetKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(s.cost, s.found, s.near, in.queries_n,
                                                                       kSurfaceBudgetPerQuery, s.flags, dist);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  thrust::counting_iterator<int64_t> indices(0);
  size_t bytes = s.temp_bytes;
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::Flagged(s.temp, bytes, indices, s.flags, s.far_at, s.selected,
                                                  in.queries_n, stream));
  int64_t far_n = 0;
  const std::string why = Selected(s, 0, stream, &far_n);
  if (!why.empty()) return why;
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  profile->Add(&profile->near_ms);
  if (far_n == 0) return "";
  return FarTransform(in, far_n, v, o, s, stream, dist, profile);
}

// Each direction's summary from its distances (dist[m]'s class segments): the order statistics from
// a sorted copy on the device, the sum in voxel order on the host (as the CPU adds them), a
// direction per thread.
std::string Summaries(double* const dist[2], const Edges& edges, const Volume3& v, double tolerance, int threads,
                      cudaStream_t stream, DeviceBuffers* mem,
                      std::vector<surface_internal::Directed>* summary) {
  cudaError_t err = cudaSuccess;
  const size_t tasks = 2 * static_cast<size_t>(v.classes);
  double* sorted = mem->Alloc<double>(edges.most, &err);
  TALLY_CUDA_OR_RETURN(err);
  double* d_stats = mem->Alloc<double>(4 * tasks, &err);
  TALLY_CUDA_OR_RETURN(err);
  size_t temp_bytes = 0;
  TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, dist[0], sorted, edges.most, 0, 64, stream));
  void* temp = mem->Alloc<uint8_t>(temp_bytes, &err);
  TALLY_CUDA_OR_RETURN(err);
  auto live = [&](size_t k) { return edges.counts[0][k / 2] > 0 && edges.counts[1][k / 2] > 0; };
  for (size_t k = 0; k < tasks; ++k) {
    if (!live(k)) continue;
    const int c = static_cast<int>(k / 2), m = static_cast<int>(k % 2);
    const int64_t n = edges.counts[m][c];
    size_t bytes = temp_bytes;
    TALLY_CUDA_OR_RETURN(cub::DeviceRadixSort::SortKeys(temp, bytes, dist[m] + edges.offsets[m][c], sorted, n, 0, 64,
                                                        stream));
    OrderStatsKernel<<<1, 1, 0, stream>>>(sorted, n, static_cast<int64_t>(PercentileRank(static_cast<size_t>(n), 0.95)),
                                          tolerance, d_stats + 4 * k);
    TALLY_CUDA_OR_RETURN(cudaGetLastError());
  }
  const int64_t total = edges.total[0] + edges.total[1];
  const size_t bytes = static_cast<size_t>(total) * sizeof(double) + 4 * tasks * sizeof(double);
  double* back = static_cast<double*>(Returning().Get(bytes, &err));
  TALLY_CUDA_OR_RETURN(err);
  for (int m = 0; m < 2; ++m) {
    TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(back + m * edges.total[0], dist[m], edges.total[m] * sizeof(double),
                                         cudaMemcpyDeviceToHost, stream));
  }
  const double* stats = back + total;
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(back + total, d_stats, 4 * tasks * sizeof(double), cudaMemcpyDeviceToHost,
                                       stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  summary->assign(tasks, surface_internal::Directed{});
  ParallelFor(tasks, std::max(1, threads), [&](size_t k) {
    if (!live(k)) return;
    const int c = static_cast<int>(k / 2), m = static_cast<int>(k % 2);
    surface_internal::Directed& d = (*summary)[k];
    d.n = static_cast<size_t>(edges.counts[m][c]);
    const double* from = back + m * edges.total[0] + edges.offsets[m][c];
    for (size_t q = 0; q < d.n; ++q) d.sum += from[q];
    d.max = stats[4 * k];
    d.p95 = PercentileFromRanks(stats[4 * k + 1], stats[4 * k + 2], d.n, 0.95);
    d.within = static_cast<int64_t>(stats[4 * k + 3]);
  });
  return "";
}

// Every class's two directions on the device and their summaries (pred -> ref, then ref -> pred per
// class; unset where a class lacks edges on a side).
std::string DeviceSummaries(const uint16_t* pred, const uint16_t* ref, const Volume3& v, uint16_t ignore_label,
                            const SurfaceOptions3D& options, int device, int threads, Edges* edges,
                            std::vector<surface_internal::Directed>* summary, Profile* profile) {
  TALLY_CUDA_OR_RETURN(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  TALLY_CUDA_OR_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  profile->stream = stream;
  DeviceBuffers mem(stream, device);
  int16_t* edge[2] = {nullptr, nullptr};
  std::string why = MarkEdges(pred, ref, v, ignore_label, threads, device, stream, &mem, edge, edges, profile);
  if (!why.empty()) return why;
  why = GroupByClass(edge, v, stream, &mem, edges);
  if (!why.empty()) return why;
  profile->Mark("edges grouped by class, boxes");
  Scratch scratch;
  FarStorage far_storage{&mem};
  scratch.far_storage = &far_storage;
  why = MakeScratch(v, edges->most, stream, &mem, &scratch);
  if (!why.empty()) return why;
  profile->Mark("scratch");
  cudaError_t err = cudaSuccess;
  double* dist[2];
  for (int m = 0; m < 2; ++m) {
    dist[m] = mem.Alloc<double>(edges->total[m], &err);
    TALLY_CUDA_OR_RETURN(err);
  }
  for (int c = 0; c < v.classes; ++c) {
    if (edges->counts[0][c] == 0 || edges->counts[1][c] == 0) continue;  // Only their number matters.
    for (int m = 0; m < 2; ++m) {
      const DirectionIn in{edges->grouped[m] + edges->offsets[m][c], edges->counts[m][c],
                           edges->grouped[1 - m] + edges->offsets[1 - m][c], edges->counts[1 - m][c],
                           edges->bounds.data() + ((1 - m) * v.classes + c) * 6};
      why = Directed(in, v, options, scratch, stream, dist[m] + edges->offsets[m][c], profile);
      if (!why.empty()) return why;
    }
  }
  profile->Mark("box searches, budgets, far transforms");
  why = Summaries(dist, *edges, v, options.nsd_tolerance, threads, stream, &mem, summary);
  profile->Mark("summaries (sorts, order statistics, sums)");
  return why;
}

}  // namespace

std::string ClassSurfaceMetrics3DOnDevice(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                                          int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                                          std::vector<SurfaceValues>* out, int device, int threads) {
  if (num_classes > 32767) return "more classes than the device path takes";
  const int64_t plane = static_cast<int64_t>(height) * width;
  const Volume3 v{Geometry3{depth, height, width, plane}, num_classes, plane * depth};
  Edges edges;
  std::vector<surface_internal::Directed> summary;
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    Profile profile;
    const std::string why = DeviceSummaries(pred, ref, v, ignore_label, options, device, threads, &edges, &summary,
                                            &profile);
    if (!why.empty()) return why;
  }
  out->assign(num_classes, SurfaceValues{});
  for (int c = 0; c < num_classes; ++c) {
    const bool pred_empty = edges.counts[0][c] == 0, ref_empty = edges.counts[1][c] == 0;
    if (pred_empty && ref_empty) {
      (*out)[c] = SurfaceValues{surface_internal::kNaN, surface_internal::kNaN, surface_internal::kNaN,
                                surface_internal::kNaN};
    } else if (pred_empty || ref_empty) {
      (*out)[c] = SurfaceValues{surface_internal::kInf, surface_internal::kInf, surface_internal::kInf, 0.0};
    } else {
      (*out)[c] = surface_internal::Combine(summary[2 * c], summary[2 * c + 1]);
    }
  }
  return "";
}

}  // namespace tally
