// What `tally export` writes into an AOTInductor package's metadata (python/tally/export.py) and
// the worker reads before it trusts the package with a batch: the input shape (3 x H x W), the
// batch sizes it takes, its precision. The package's generated code does not check its inputs, so
// these values decide what the worker hands it; they come from a file, so they are bounded here.
// No LibTorch: the fuzz targets and the CPU tests build it.
#ifndef TALLY_WORKER_TORCH_PACKAGE_METADATA_H_
#define TALLY_WORKER_TORCH_PACKAGE_METADATA_H_

#include <cstdint>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"

namespace tally {

inline constexpr int64_t kPackageMaxSide = 65536;  // H and W of tally.input.
inline constexpr int64_t kPackageMaxBatch = 4096;  // tally.batch_max: a fixed-batch package pads up to it.

struct PackageMetadata {
  int64_t height = 0, width = 0, batch_max = 0;
  bool batch_dynamic = true;  // Else exactly batch_max: a smaller batch is padded with zeros.
  std::string precision;      // The export's --precision; the job's must be the same.
  std::string torch_version;  // "" where the export did not say.
};

// Reads tally.input ("3xHxW", 1 <= H, W <= kPackageMaxSide), tally.batch_max (1..kPackageMaxBatch),
// tally.batch_dynamic ("0": fixed) and tally.precision from a package's metadata. `path` names the
// package in the errors.
absl::StatusOr<PackageMetadata> ParsePackageMetadata(const std::string& path,
                                                     const std::unordered_map<std::string, std::string>& meta);

}  // namespace tally

#endif  // TALLY_WORKER_TORCH_PACKAGE_METADATA_H_
