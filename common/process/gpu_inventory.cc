#include "common/process/gpu_inventory.h"

#include <dirent.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tally {

std::vector<std::string> VisibleGpus() {
  std::vector<std::string> gpus;
  if (const char* env = std::getenv("CUDA_VISIBLE_DEVICES"); env != nullptr) {
    for (absl::string_view part : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
      gpus.emplace_back(absl::StripAsciiWhitespace(part));
    }
    return gpus;
  }
  int count = 0;
  if (DIR* dir = opendir("/proc/driver/nvidia/gpus"); dir != nullptr) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++count;
    }
    closedir(dir);
  }
  if (count == 0) {
    if (FILE* p = popen("nvidia-smi -L 2>/dev/null", "r"); p != nullptr) {
      char line[512];
      while (std::fgets(line, sizeof(line), p) != nullptr) {
        if (absl::StartsWith(line, "GPU ")) ++count;
      }
      pclose(p);
    }
  }
  for (int i = 0; i < count; ++i) gpus.push_back(absl::StrCat(i));
  return gpus;
}

absl::StatusOr<std::vector<std::string>> SelectGpus(const std::string& selection) {
  std::vector<std::string> visible = VisibleGpus();
  if (selection == "all") {
    if (visible.empty()) {
      return absl::FailedPreconditionError(
          "--gpus all: no NVIDIA GPU is visible (no /proc/driver/nvidia/gpus, nvidia-smi found none, "
          "CUDA_VISIBLE_DEVICES unset); use --workers N for CPU workers");
    }
    return visible;
  }
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(selection, ',', absl::SkipWhitespace())) {
    int index = -1;
    if (!absl::SimpleAtoi(part, &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: '", part, "' is not a GPU index (use all or 0,1,...)"));
    }
    if (index >= static_cast<int>(visible.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: GPU ", index, " does not exist; ", visible.size(), " visible"));
    }
    out.push_back(visible[index]);
  }
  if (out.empty()) return absl::InvalidArgumentError("--gpus: empty selection");
  return out;
}

}  // namespace tally

namespace tally {

absl::StatusOr<std::vector<std::string>> GroupGpus(const std::vector<std::string>& gpus, int per_worker) {
  if (per_worker < 1) return absl::InvalidArgumentError("--gpus-per-worker must be >= 1");
  if (gpus.size() % static_cast<size_t>(per_worker) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(gpus.size(), " GPU(s) cannot be split into workers of ", per_worker,
                                                   " (--gpus-per-worker); select a multiple of ", per_worker));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < gpus.size(); i += static_cast<size_t>(per_worker)) {
    std::string group;
    for (int j = 0; j < per_worker; ++j) group += (j ? "," : "") + gpus[i + static_cast<size_t>(j)];
    out.push_back(group);
  }
  return out;
}

}  // namespace tally
