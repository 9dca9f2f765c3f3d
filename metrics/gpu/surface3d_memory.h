// Internal to the 3D surface kernels (metrics/gpu/surface3d_kernel.cu): the device memory they
// take, page-locked staging kept from call to call, the lock that serialises their use, CUDA
// errors as text, and TALLY_SURFACE3D_PROFILE's timings. Host code only.
#ifndef TALLY_METRICS_GPU_SURFACE3D_MEMORY_H_
#define TALLY_METRICS_GPU_SURFACE3D_MEMORY_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace tally {
namespace surface3d_internal {

// Held while a call uses the pools and the page-locked buffers below.
std::mutex& DeviceMutex();

// TALLY_SURFACE3D_PROFILE=1: where a call's time goes, to stderr (the stream drained at each mark).
struct Profile {
  cudaStream_t stream = nullptr;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double near_ms = 0, far_ms[4] = {0, 0, 0, 0};  // Summed over the directions; far: set-up, z, y, x passes.
  int64_t far_queries = 0, far_slices = 0;
  static bool On();
  double Lap();
  void Add(double* into) {
    if (On()) *into += Lap();
  }
  void Mark(const char* what);
};

// Device memory freed at scope exit, in stream order, from a pool of this file's own per device
// (held under DeviceMutex) that keeps up to PoolKeep() bytes from call to call, so that a stream of
// volumes does not map and unmap its buffers every time; more goes back to the device at the
// stream's next synchronisation. Without memory pools: cudaMalloc and cudaFree.
// A 512x512x300 pair takes about 0.6 GB besides the far transform (labels 157 MB, edge maps 314 MB,
// the queries' scratch), whose batches take up to a 48th of the device's memory (FarCells): a 32nd,
// between 512 MiB and 4 GiB, stays mapped (4 GiB on a 141 GB GPU, 2.7 GB on an 80 GB one, 768 MB on
// a 24 GB one, beside the model). TALLY_SURFACE3D_POOL_KEEP_MB=N (benchmarks): another amount.
uint64_t PoolKeep(int device);
cudaMemPool_t Pool(int device);

struct DeviceBuffers {
  cudaStream_t stream;
  cudaMemPool_t pool;
  std::vector<void*> held;
  DeviceBuffers(cudaStream_t s, int device) : stream(s), pool(Pool(device)) {}
  template <typename T>
  T* Alloc(size_t count, cudaError_t* err) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(1, count) * sizeof(T);
    *err = pool != nullptr ? cudaMallocFromPoolAsync(&p, bytes, pool, stream) : cudaMalloc(&p, bytes);
    if (*err == cudaSuccess) held.push_back(p);
    return static_cast<T*>(p);
  }
  ~DeviceBuffers() {
    for (void* p : held) pool != nullptr ? cudaFreeAsync(p, stream) : cudaFree(p);
  }
};

// Page-locked host memory kept from call to call (used under DeviceMutex): the labels' staging on
// the way up and the distances on the way back.
struct PinnedBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  void* Get(size_t need, cudaError_t* err);
};
PinnedBuffer& Staging();
PinnedBuffer& Returning();

// "CUDA error in <what>: <CUDA's text>", the sticky error cleared.
std::string Why(cudaError_t e, const char* what);

#define TALLY_CUDA_OR_RETURN(expr)                    \
  do {                                                \
    const cudaError_t tally_err = (expr);             \
    if (tally_err != cudaSuccess) return Why(tally_err, #expr); \
  } while (0)

// Bits that hold `v` (at least 1).
int BitsFor(uint64_t v);

}  // namespace surface3d_internal
}  // namespace tally

#endif  // TALLY_METRICS_GPU_SURFACE3D_MEMORY_H_
