#include "worker/torch/package_metadata.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tally {
namespace {

// "3xHxW"; false when it is not that, or H or W is out of bounds.
bool ParseInput(const std::string& text, int64_t* height, int64_t* width) {
  const std::vector<std::string> parts = absl::StrSplit(text, 'x');
  int64_t c = 0;
  return parts.size() == 3 && absl::SimpleAtoi(parts[0], &c) && c == 3 && absl::SimpleAtoi(parts[1], height) &&
         absl::SimpleAtoi(parts[2], width) && *height >= 1 && *height <= kPackageMaxSide && *width >= 1 &&
         *width <= kPackageMaxSide;
}

}  // namespace

absl::StatusOr<PackageMetadata> ParsePackageMetadata(const std::string& path,
                                                     const std::unordered_map<std::string, std::string>& meta) {
  auto get = [&meta](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  PackageMetadata m;
  const std::string input = get("tally.input");
  m.precision = get("tally.precision");
  if (input.empty() || m.precision.empty() || !absl::SimpleAtoi(get("tally.batch_max"), &m.batch_max)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", path, "' was not made by tally export: its metadata lacks tally.input, tally.batch_max or "
        "tally.precision, which say what inputs it may be given (the package's code does not check them); make it "
        "with `tally export --model ... --input-size HxW --out ", path, "`"));
  }
  if (!ParseInput(input, &m.height, &m.width) || m.batch_max < 1 || m.batch_max > kPackageMaxBatch) {
    return absl::FailedPreconditionError(absl::StrCat("model '", path, "': its metadata says tally.input '", input,
                                                      "' and tally.batch_max '", get("tally.batch_max"),
                                                      "'; expected 3xHxW (H, W 1..", kPackageMaxSide, ") and 1..",
                                                      kPackageMaxBatch));
  }
  m.batch_dynamic = get("tally.batch_dynamic") != "0";
  m.torch_version = get("tally.torch");
  return m;
}

}  // namespace tally
