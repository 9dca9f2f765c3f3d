// The 3D surface kernels' memory, lock, errors and profile (metrics/gpu/surface3d_memory.h).
#include "metrics/gpu/surface3d_memory.h"

#include <cstdio>

namespace tally {
namespace surface3d_internal {

std::mutex& DeviceMutex() {
  static std::mutex mu;
  return mu;
}

bool Profile::On() {
  static const bool on = std::getenv("TALLY_SURFACE3D_PROFILE") != nullptr;
  return on;
}

double Profile::Lap() {
  if (stream != nullptr) cudaStreamSynchronize(stream);
  const auto t = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(t - t0).count();
  t0 = t;
  return ms;
}

void Profile::Mark(const char* what) {
  if (!On()) return;
  const double ms = Lap();
  const double far = far_ms[0] + far_ms[1] + far_ms[2] + far_ms[3];
  if (near_ms + far > 0) {
    std::fprintf(stderr,
                 "surface3d profile: %s %.2f ms (box searches and budgets %.2f; far transforms %.2f: set-up %.2f, "
                 "z %.2f, y %.2f, x %.2f; %lld queries on %lld slices)\n",
                 what, ms + near_ms + far, near_ms, far, far_ms[0], far_ms[1], far_ms[2], far_ms[3],
                 static_cast<long long>(far_queries), static_cast<long long>(far_slices));
    near_ms = 0;
    for (double& f : far_ms) f = 0;
  } else {
    std::fprintf(stderr, "surface3d profile: %s %.2f ms\n", what, ms);
  }
}

uint64_t PoolKeep(int device) {
  if (const char* env = std::getenv("TALLY_SURFACE3D_POOL_KEEP_MB"); env != nullptr && std::atoll(env) >= 0) {
    return static_cast<uint64_t>(std::atoll(env)) << 20;
  }
  size_t free_bytes = 0, total_bytes = 0;
  int current = 0;
  uint64_t total = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current == device &&
      cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    total = total_bytes;
  }
  cudaGetLastError();
  return std::min(std::max(total / 32, uint64_t{512} << 20), uint64_t{4} << 30);
}

cudaMemPool_t Pool(int device) {
  static std::vector<cudaMemPool_t> pools;
  static std::vector<bool> tried;
  if (device < 0) return nullptr;
  if (static_cast<size_t>(device) >= pools.size()) {
    pools.resize(device + 1, nullptr);
    tried.resize(device + 1, false);
  }
  if (!tried[device]) {
    tried[device] = true;
    int supported = 0;
    cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (supported && cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      uint64_t keep = PoolKeep(device);
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      pools[device] = pool;
    }
    cudaGetLastError();
  }
  return pools[device];
}

void* PinnedBuffer::Get(size_t need, cudaError_t* err) {
  *err = cudaSuccess;
  if (need <= bytes) return p;
  if (p != nullptr) cudaFreeHost(p);
  p = nullptr;
  bytes = 0;
  *err = cudaHostAlloc(&p, need, cudaHostAllocPortable);
  if (*err == cudaSuccess) bytes = need;
  return p;
}

PinnedBuffer& Staging() {
  static PinnedBuffer b;
  return b;
}

PinnedBuffer& Returning() {
  static PinnedBuffer b;
  return b;
}

std::string Why(cudaError_t e, const char* what) {
  cudaGetLastError();
  return std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e);
}

int BitsFor(uint64_t v) {
  int b = 1;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

}  // namespace surface3d_internal
}  // namespace tally
