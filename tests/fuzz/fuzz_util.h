// Shared by the libFuzzer targets: the input as a string, and a check that aborts (so libFuzzer
// records the input as a crash) when a property the code promises does not hold.
#ifndef TALLY_TESTS_FUZZ_FUZZ_UTIL_H_
#define TALLY_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

inline std::string FuzzInput(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Inputs decode with this pixel limit, so that a fuzzer-made header cannot ask for gigabytes.
constexpr int64_t kFuzzMaxPixels = int64_t{1} << 22;

#endif  // TALLY_TESTS_FUZZ_FUZZ_UTIL_H_
