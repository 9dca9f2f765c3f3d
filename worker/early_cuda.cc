// See early_cuda.h. Runs before libstdc++ and every other shared library is initialised: plain C
// and POSIX calls only until main().
#include "worker/early_cuda.h"

#include <cstdlib>
#include <cstring>

#if TALLY_WITH_CUDA
#include <dlfcn.h>
#include <pthread.h>
#endif

namespace tally {

int EarlyCudaOrdinal(int argc, char** argv) {
  const char* value = nullptr;
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--") == 0) break;
    while (*a == '-') ++a;
    if (a == argv[i]) continue;
    if (std::strcmp(a, "version") == 0 || std::strncmp(a, "help", 4) == 0) return -1;
    if (std::strncmp(a, "device=", 7) == 0) {
      value = a + 7;
    } else if (std::strcmp(a, "device") == 0 && i + 1 < argc) {
      value = argv[++i];
    }
  }
  if (value == nullptr || std::strncmp(value, "cuda", 4) != 0) return -1;
  if (value[4] == '\0') return 0;
  if (value[4] != ':' || value[5] < '0' || value[5] > '9') return -1;
  char* end = nullptr;
  const long n = std::strtol(value + 5, &end, 10);
  return *end == '\0' && n < 1024 ? static_cast<int>(n) : -1;
}

#if TALLY_WITH_CUDA
namespace {

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_t g_thread;
bool g_running = false;  // Guarded by g_mu: a thread was started and not yet joined.
int g_ordinal = 0;

void* InitializeCuda(void*) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return nullptr;
  using InitFn = int (*)(unsigned int);
  using DeviceGetFn = int (*)(int*, int);
  using RetainFn = int (*)(void**, int);
  auto init = reinterpret_cast<InitFn>(dlsym(driver, "cuInit"));
  auto device_get = reinterpret_cast<DeviceGetFn>(dlsym(driver, "cuDeviceGet"));
  auto retain = reinterpret_cast<RetainFn>(dlsym(driver, "cuDevicePrimaryCtxRetain"));
  int device = 0;
  void* context = nullptr;
  // The retained context stays for the process's life, as the runtime's own retain does.
  if (init != nullptr && device_get != nullptr && retain != nullptr && init(0) == 0 &&
      device_get(&device, g_ordinal) == 0) {
    retain(&context, device);
  }
  return nullptr;
}

void StartEarlyCuda(int argc, char** argv, char** envp) {
  // getenv() cannot be used yet: libc has not set environ up.
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    if (std::strcmp(*e, "TALLY_EARLY_CUDA=0") == 0) return;
  }
  const int ordinal = EarlyCudaOrdinal(argc, argv);
  if (ordinal < 0) return;
  pthread_mutex_lock(&g_mu);
  g_ordinal = ordinal;
  g_running = pthread_create(&g_thread, nullptr, InitializeCuda, nullptr) == 0;
  pthread_mutex_unlock(&g_mu);
}

}  // namespace

// Run by the dynamic loader before any shared library's initialiser (the ELF .preinit_array,
// honoured for executables only), with the process's argc, argv and environment.
__attribute__((section(".preinit_array"), used)) void (*const kStartEarlyCuda)(int, char**, char**) = StartEarlyCuda;

void JoinEarlyCuda() {
  pthread_mutex_lock(&g_mu);
  if (g_running) {
    pthread_join(g_thread, nullptr);
    g_running = false;
  }
  pthread_mutex_unlock(&g_mu);
}

#else

void JoinEarlyCuda() {}

#endif

}  // namespace tally
