#include "metrics/gpu/surface3d_kernel.h"

#include "metrics/surface_summary.h"

#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cub/device/device_select.cuh>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <thrust/iterator/counting_iterator.h>

namespace tally {
namespace {

constexpr int kThreads = 256;

struct Box {
  int64_t z0, y0, x0, by, bx;
};

__global__ void EdgeKernel(const uint16_t* pred, const uint16_t* ref, int64_t depth, int64_t height, int64_t width,
                           int classes, uint16_t ignore, int16_t* pred_edge, int16_t* ref_edge) {
  const int64_t n = depth * height * width;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t plane = height * width;
  const int64_t z = i / plane, r = i - z * plane, y = r / width, x = r - y * width;
  const bool inner = z > 0 && z + 1 < depth && y > 0 && y + 1 < height && x > 0 && x + 1 < width;
  for (int m = 0; m < 2; ++m) {
    const uint16_t* map = m == 0 ? pred : ref;
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

struct IsClass {
  const int16_t* edges;
  int16_t c;
  __device__ __forceinline__ bool operator()(int64_t i) const { return edges[i] == c; }
};
struct IsEdge {
  const int16_t* edges;
  __device__ __forceinline__ bool operator()(int64_t i) const { return edges[i] >= 0; }
};

__global__ void BitsKernel(const int64_t* features, int64_t n, int64_t plane, int64_t width, Box b, uint32_t* bits) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t i = features[k];
  const int64_t z = i / plane, y = (i % plane) / width, x = i % width;
  const int64_t at = ((z - b.z0) * b.by + (y - b.y0)) * b.bx + (x - b.x0);
  atomicOr(&bits[at >> 5], 1u << (at & 31));
}

// The CPU's NearSearch for one query, without the chunk budget (applied on the host).
__global__ void NearKernel(const int64_t* queries, int64_t n, const uint32_t* bits, Box b, int64_t z1, int64_t y1,
                           int64_t x1, int64_t plane, int64_t width, double sz, double sy, double sx, int64_t max_box,
                           double* near, uint8_t* found, int64_t* cost) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t i = queries[k];
  const int64_t z = i / plane, y = (i % plane) / width, x = i % width;
  const double smin = fmin(sz, fmin(sy, sx));
  double best = CUDART_INF;
  bool ok = false;
  int64_t spent = 0;
  for (double rho = 0;; rho = rho == 0 ? smin : 2 * rho) {
    const int64_t rz = static_cast<int64_t>(floor(rho / sz * (1 + 1e-12)));
    const int64_t ry = static_cast<int64_t>(floor(rho / sy * (1 + 1e-12)));
    const int64_t rx = static_cast<int64_t>(floor(rho / sx * (1 + 1e-12)));
    const int64_t box = (2 * rz + 1) * (2 * ry + 1) * (2 * rx + 1);
    if (box > max_box) break;
    const int64_t za = max(z - rz, b.z0), zb = min(z + rz, z1);
    const int64_t ya = max(y - ry, b.y0), yb = min(y + ry, y1);
    const int64_t xa = max(x - rx, b.x0), xb = min(x + rx, x1);
    spent += box;
    for (int64_t cz = za; cz <= zb; ++cz) {
      const double dz = sz * static_cast<double>(cz - z);
      for (int64_t cy = ya; cy <= yb; ++cy) {
        const double dy = sy * static_cast<double>(cy - y);
        const int64_t row = ((cz - b.z0) * b.by + (cy - b.y0)) * b.bx - b.x0;
        for (int64_t cx = xa; cx <= xb; ++cx) {
          const int64_t at = row + cx;
          if (!((bits[at >> 5] >> (at & 31)) & 1u)) continue;
          const double dx = sx * static_cast<double>(cx - x);
          best = fmin(best, (dx * dx + dy * dy) + dz * dz);
        }
      }
    }
    if (best <= rho * rho) {
      ok = true;
      break;
    }
  }
  near[k] = ok ? sqrt(best) : 0.0;
  found[k] = ok ? 1 : 0;
  cost[k] = spent;
}

std::mutex& DeviceMutex() {
  static std::mutex mu;
  return mu;
}

// Device memory freed at scope exit.
struct DeviceBuffers {
  std::vector<void*> held;
  template <typename T>
  T* Alloc(size_t count, cudaError_t* err) {
    void* p = nullptr;
    *err = cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T));
    if (*err == cudaSuccess) held.push_back(p);
    return static_cast<T*>(p);
  }
  ~DeviceBuffers() {
    for (void* p : held) cudaFree(p);
  }
};

std::string Why(cudaError_t e, const char* what) {
  cudaGetLastError();
  return std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e);
}

#define TALLY_CUDA_OR_RETURN(expr)                    \
  do {                                                \
    const cudaError_t tally_err = (expr);             \
    if (tally_err != cudaSuccess) return Why(tally_err, #expr); \
  } while (0)

// One direction of one class: every query's box search (queries and features on the device and host).
// Device memory for every direction of a call, allocated once: a bitmap as large as the volume, and
// per query its distance, whether found and the boxes' voxels.
struct Scratch {
  uint32_t* bits;
  double* near;
  uint8_t* found;
  int64_t* cost;
};

std::string Directed(const int64_t* d_queries, const std::vector<int64_t>& queries, const int64_t* d_features,
                     const std::vector<int64_t>& features, int depth, int height, int width,
                     const SurfaceOptions3D& o, const Scratch& scratch, cudaStream_t stream, NearSearch3D* search_out) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  int64_t z0 = depth, z1 = -1, y0 = height, y1 = -1, x0 = width, x1 = -1;
  for (int64_t i : features) {
    const int64_t z = i / plane, y = (i % plane) / width, x = i % width;
    z0 = std::min(z0, z), z1 = std::max(z1, z);
    y0 = std::min(y0, y), y1 = std::max(y1, y);
    x0 = std::min(x0, x), x1 = std::max(x1, x);
  }
  const Box b{z0, y0, x0, y1 - y0 + 1, x1 - x0 + 1};
  const size_t words = static_cast<size_t>(((z1 - z0 + 1) * b.by * b.bx + 31) / 32);
  uint32_t* bits = scratch.bits;
  const size_t nq = queries.size();
  double* near = scratch.near;
  uint8_t* found = scratch.found;
  int64_t* cost = scratch.cost;
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(bits, 0, words * sizeof(uint32_t), stream));
  const int64_t nf = static_cast<int64_t>(features.size());
  BitsKernel<<<static_cast<unsigned>((nf + kThreads - 1) / kThreads), kThreads, 0, stream>>>(d_features, nf, plane,
                                                                                              width, b, bits);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  NearKernel<<<static_cast<unsigned>((nq + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      d_queries, static_cast<int64_t>(nq), bits, b, z1, y1, x1, plane, width, o.spacing_z, o.spacing_y, o.spacing_x,
      kSurfaceMaxBox, near, found, cost);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  NearSearch3D search;
  search.near.resize(nq);
  search.found.resize(nq);
  search.cost.resize(nq);
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(search.near.data(), near, nq * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(search.found.data(), found, nq, cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(search.cost.data(), cost, nq * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  *search_out = std::move(search);
  return "";
}

__global__ void CountKernel(const int16_t* pred_edge, const int16_t* ref_edge, int64_t n, int classes,
                            unsigned long long* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (pred_edge[i] >= 0) atomicAdd(&counts[pred_edge[i]], 1ull);
  if (ref_edge[i] >= 0) atomicAdd(&counts[classes + ref_edge[i]], 1ull);
}

// What the host finishes for one class: its edges and both directions' box searches.
struct ClassWork {
  std::vector<int64_t> edges[2];
  NearSearch3D search[2];
};

// The volume's geometry and what one call works with.
struct Volume3 {
  int depth, height, width, classes;
  int64_t n;
};

// Uploads both maps, marks their edge voxels per class (edge[m]: class or -1) and counts them
// (counts[m * classes + c]).
std::string FindEdges(const uint16_t* pred, const uint16_t* ref, const Volume3& v, uint16_t ignore_label,
                      cudaStream_t stream, DeviceBuffers* mem, int16_t* edge[2], std::vector<unsigned long long>* counts) {
  cudaError_t err = cudaSuccess;
  uint16_t* d_pred = mem->Alloc<uint16_t>(v.n, &err);
  TALLY_CUDA_OR_RETURN(err);
  uint16_t* d_ref = mem->Alloc<uint16_t>(v.n, &err);
  TALLY_CUDA_OR_RETURN(err);
  for (int m = 0; m < 2; ++m) {
    edge[m] = mem->Alloc<int16_t>(v.n, &err);
    TALLY_CUDA_OR_RETURN(err);
  }
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(d_pred, pred, v.n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(d_ref, ref, v.n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));
  const unsigned blocks = static_cast<unsigned>((v.n + kThreads - 1) / kThreads);
  EdgeKernel<<<blocks, kThreads, 0, stream>>>(d_pred, d_ref, v.depth, v.height, v.width, v.classes, ignore_label,
                                              edge[0], edge[1]);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  unsigned long long* d_counts = mem->Alloc<unsigned long long>(2 * static_cast<size_t>(v.classes), &err);
  TALLY_CUDA_OR_RETURN(err);
  TALLY_CUDA_OR_RETURN(cudaMemsetAsync(d_counts, 0, 2 * v.classes * sizeof(unsigned long long), stream));
  CountKernel<<<blocks, kThreads, 0, stream>>>(edge[0], edge[1], v.n, v.classes, d_counts);
  TALLY_CUDA_OR_RETURN(cudaGetLastError());
  counts->resize(2 * static_cast<size_t>(v.classes));
  TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(counts->data(), d_counts, counts->size() * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, stream));
  TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
  return "";
}

// Per class: its edges of each map (compacted once per map, then selected per class), copied to the
// host, and both directions' box searches.
std::string SearchClasses(int16_t* const edge[2], const std::vector<unsigned long long>& counts, const Volume3& v,
                          const SurfaceOptions3D& options, cudaStream_t stream, DeviceBuffers* mem,
                          std::vector<ClassWork>* work) {
  cudaError_t err = cudaSuccess;
  const int64_t most = static_cast<int64_t>(std::max<unsigned long long>(1, *std::max_element(counts.begin(), counts.end())));
  int64_t total[2] = {0, 0};
  for (int c = 0; c < v.classes; ++c) {
    total[0] += static_cast<int64_t>(counts[c]);
    total[1] += static_cast<int64_t>(counts[v.classes + c]);
  }
  int64_t* all[2];
  for (int m = 0; m < 2; ++m) {
    all[m] = mem->Alloc<int64_t>(static_cast<size_t>(std::max<int64_t>(total[m], 1)), &err);
    TALLY_CUDA_OR_RETURN(err);
  }
  int64_t* selected = mem->Alloc<int64_t>(2 * static_cast<size_t>(most), &err);
  TALLY_CUDA_OR_RETURN(err);
  int64_t* d_count = mem->Alloc<int64_t>(2, &err);
  TALLY_CUDA_OR_RETURN(err);
  Scratch scratch;
  scratch.bits = mem->Alloc<uint32_t>(static_cast<size_t>(v.n / 32 + 1), &err);
  TALLY_CUDA_OR_RETURN(err);
  scratch.near = mem->Alloc<double>(static_cast<size_t>(most), &err);
  TALLY_CUDA_OR_RETURN(err);
  scratch.found = mem->Alloc<uint8_t>(static_cast<size_t>(most), &err);
  TALLY_CUDA_OR_RETURN(err);
  scratch.cost = mem->Alloc<int64_t>(static_cast<size_t>(most), &err);
  TALLY_CUDA_OR_RETURN(err);
  size_t temp_bytes = 0, need = 0;
  thrust::counting_iterator<int64_t> indices(0);
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(nullptr, need, indices, all[0], d_count, v.n, IsEdge{edge[0]}, stream));
  temp_bytes = std::max(temp_bytes, need);
  TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(nullptr, need, all[0], selected, d_count,
                                             std::max<int64_t>(total[0], total[1]), IsClass{edge[0], 0}, stream));
  temp_bytes = std::max(temp_bytes, need);
  void* temp = mem->Alloc<uint8_t>(temp_bytes, &err);
  TALLY_CUDA_OR_RETURN(err);
  for (int m = 0; m < 2; ++m) {
    TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(temp, temp_bytes, indices, all[m], d_count + m, v.n, IsEdge{edge[m]},
                                               stream));
  }
  work->assign(v.classes, ClassWork{});
  for (int c = 0; c < v.classes; ++c) {
    ClassWork& w = (*work)[c];
    const int64_t count[2] = {static_cast<int64_t>(counts[c]), static_cast<int64_t>(counts[v.classes + c])};
    for (int m = 0; m < 2; ++m) w.edges[m].resize(static_cast<size_t>(count[m]));
    if (count[0] == 0 || count[1] == 0) continue;  // Only their number matters: nan or inf.
    for (int m = 0; m < 2; ++m) {
      TALLY_CUDA_OR_RETURN(cub::DeviceSelect::If(temp, temp_bytes, all[m], selected + m * most, d_count + m, total[m],
                                                 IsClass{edge[m], static_cast<int16_t>(c)}, stream));
      TALLY_CUDA_OR_RETURN(cudaMemcpyAsync(w.edges[m].data(), selected + m * most, count[m] * sizeof(int64_t),
                                           cudaMemcpyDeviceToHost, stream));
    }
    TALLY_CUDA_OR_RETURN(cudaStreamSynchronize(stream));
    for (int m = 0; m < 2; ++m) {
      const std::string why = Directed(selected + m * most, w.edges[m], selected + (1 - m) * most, w.edges[1 - m],
                                       v.depth, v.height, v.width, options, scratch, stream, &w.search[m]);
      if (!why.empty()) return why;
    }
  }
  return "";
}

// The host's part: each direction's far queries in turn on every thread (the separable transform in
// slices), then the summaries, each direction on a thread of its own, then the classes' values.
void FinishClasses(std::vector<ClassWork>* work, const Volume3& v, const SurfaceOptions3D& options, int threads,
                   std::vector<SurfaceValues>* out) {
  const int tasks = 2 * v.classes;
  std::vector<std::vector<double>> distances(static_cast<size_t>(tasks));
  for (int k = 0; k < tasks; ++k) {
    ClassWork& w = (*work)[k / 2];
    const int m = k % 2;
    if (w.edges[0].empty() || w.edges[1].empty()) continue;
    FinishDirected3D(w.edges[m], w.edges[1 - m], v.depth, v.height, v.width, options, w.search[m], &distances[k],
                     threads);
    w.search[m] = NearSearch3D{};  // Its memory back early.
  }
  std::vector<surface_internal::Directed> summary(static_cast<size_t>(tasks));
  std::atomic<int> next{0};
  auto summarise = [&] {
    for (int k = next++; k < tasks; k = next++) {
      if (!distances[k].empty()) summary[k] = surface_internal::Summarise(&distances[k], options.nsd_tolerance);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, tasks); ++t) pool.emplace_back(summarise);
  summarise();
  for (std::thread& t : pool) t.join();
  out->assign(v.classes, SurfaceValues{});
  for (int c = 0; c < v.classes; ++c) {
    const ClassWork& w = (*work)[c];
    if (w.edges[0].empty() && w.edges[1].empty()) {
      (*out)[c] = SurfaceValues{surface_internal::kNaN, surface_internal::kNaN, surface_internal::kNaN,
                                surface_internal::kNaN};
    } else if (w.edges[0].empty() || w.edges[1].empty()) {
      (*out)[c] = SurfaceValues{surface_internal::kInf, surface_internal::kInf, surface_internal::kInf, 0.0};
    } else {
      (*out)[c] = surface_internal::Combine(summary[2 * c], summary[2 * c + 1]);
    }
  }
}

}  // namespace

std::string ClassSurfaceMetrics3DOnDevice(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                                          int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                                          std::vector<SurfaceValues>* out, int device, int threads) {
  if (num_classes > 32767) return "more classes than the device path takes";
  // TALLY_SURFACE3D_PROFILE=1: where the time goes, to stderr.
  static const bool profile = std::getenv("TALLY_SURFACE3D_PROFILE") != nullptr;
  auto t0 = std::chrono::steady_clock::now();
  auto mark = [&](const char* what) {
    if (!profile) return;
    const auto t = std::chrono::steady_clock::now();
    std::fprintf(stderr, "surface3d profile: %s %.2f ms\n", what, std::chrono::duration<double, std::milli>(t - t0).count());
    t0 = t;
  };
  const Volume3 v{depth, height, width, num_classes, static_cast<int64_t>(depth) * height * width};
  std::vector<ClassWork> work;
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());  // The host's part runs outside.
    TALLY_CUDA_OR_RETURN(cudaSetDevice(device));
    cudaStream_t stream = nullptr;
    TALLY_CUDA_OR_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct StreamGuard {
      cudaStream_t s;
      ~StreamGuard() { cudaStreamDestroy(s); }
    } guard{stream};
    DeviceBuffers mem;
    int16_t* edge[2] = {nullptr, nullptr};
    std::vector<unsigned long long> counts;
    std::string why = FindEdges(pred, ref, v, ignore_label, stream, &mem, edge, &counts);
    if (!why.empty()) return why;
    mark("upload, edges and counts");
    why = SearchClasses(edge, counts, v, options, stream, &mem, &work);
    if (!why.empty()) return why;
    mark("per class: selection, bitmaps, box searches, copies");
  }
  FinishClasses(&work, v, options, threads, out);
  mark("host: budgets, far queries, summaries");
  return "";
}

}  // namespace tally
