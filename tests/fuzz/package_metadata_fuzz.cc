// An AOTInductor package's metadata as the worker reads it (worker/torch/package_metadata.cc): the
// values `tally export` wrote decide what shape of batch the package's unchecked code is handed.
// The input is "key=value" lines (the package's metadata map). Whatever they say, a parsed result
// stays within the stated bounds and a refusal names the package.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_split.h"
#include "fuzz_util.h"
#include "worker/torch/package_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unordered_map<std::string, std::string> meta;
  for (absl::string_view line : absl::StrSplit(FuzzInput(data, size), '\n')) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    meta[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  absl::StatusOr<tally::PackageMetadata> m = tally::ParsePackageMetadata("net.pt2", meta);
  if (!m.ok()) {
    FUZZ_CHECK(m.status().message().find("'net.pt2'") != absl::string_view::npos);
    return 0;
  }
  FUZZ_CHECK(m->height >= 1 && m->height <= tally::kPackageMaxSide);
  FUZZ_CHECK(m->width >= 1 && m->width <= tally::kPackageMaxSide);
  FUZZ_CHECK(m->batch_max >= 1 && m->batch_max <= tally::kPackageMaxBatch);
  FUZZ_CHECK(!m->precision.empty());
  // The padded batch a fixed-size package is handed stays within 4096 x 3 x 65536 x 65536 floats'
  // indices: no overflow of int64 in the element count.
  FUZZ_CHECK(m->batch_max * 3 * m->height <= INT64_MAX / m->width);
  return 0;
}
