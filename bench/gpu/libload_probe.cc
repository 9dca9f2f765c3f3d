// Where a LibTorch process's time before main() goes (issue 14, goal 4): dlopen()s the libraries
// given, in order, and prints how long each took (mapping, relocation and static initialisers of
// it and of the dependencies it brings in) and how many objects the process then holds.
//   g++ -O2 -o /tmp/libload_probe bench/gpu/libload_probe.cc -ldl
//   /tmp/libload_probe lazy|now LIB.so [LIB.so ...]
#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdio>
#include <cstring>

static int CountObjects() {
  int n = 0;
  dl_iterate_phdr([](dl_phdr_info*, size_t, void* data) { return ++*static_cast<int*>(data), 0; }, &n);
  return n;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s lazy|now LIB.so [LIB.so ...]\n", argv[0]);
    return 2;
  }
  const int mode = (std::strcmp(argv[1], "now") == 0 ? RTLD_NOW : RTLD_LAZY) | RTLD_GLOBAL;
  double total = 0;
  for (int i = 2; i < argc; ++i) {
    const int before = CountObjects();
    const auto t0 = std::chrono::steady_clock::now();
    void* h = dlopen(argv[i], mode);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += s;
    if (!h) {
      std::printf("%-28s FAILED: %s\n", argv[i], dlerror());
      return 1;
    }
    const char* base = std::strrchr(argv[i], '/');
    std::printf("  %-24s %6.3f s  (+%d objects)\n", base ? base + 1 : argv[i], s, CountObjects() - before);
  }
  std::printf("  %-24s %6.3f s  (%s binding, %d objects)\n", "total", total, argv[1], CountObjects());
  return 0;
}
