#include "worker/pipeline/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/flag_util.h"

namespace tally {
namespace {

std::string ReadSmallFile(const std::string& path) { return ReadFileToString(path).value_or(""); }

// The cgroup limit of this process, or -1: v2 (one "0::/path" line), else v1's memory controller.
int64_t CgroupLimitBytes() {
  std::istringstream cgroups(ReadSmallFile("/proc/self/cgroup"));
  for (std::string line; std::getline(cgroups, line);) {
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      // v2: the limit is the smallest memory.max on the way up to the root.
      int64_t limit = -1;
      for (std::string dir = f[2]; !dir.empty(); dir = dir.substr(0, dir.rfind('/'))) {
        const int64_t here = ParseCgroupLimit(ReadSmallFile("/sys/fs/cgroup" + dir + "/memory.max"));
        if (here > 0) limit = limit > 0 ? std::min(limit, here) : here;
        if (dir == "/") break;
      }
      return limit;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c != "memory") continue;
      const int64_t v1 = ParseCgroupLimit(ReadSmallFile("/sys/fs/cgroup/memory" + f[2] + "/memory.limit_in_bytes"));
      // v1 reports "no limit" as a huge number near 2^63.
      return v1 > 0 && v1 < (int64_t{1} << 60) ? v1 : -1;
    }
  }
  return -1;
}

}  // namespace

int64_t MemoryModel::LaunchBytes(const std::vector<int64_t>& pixels) const {
  double total = pixels.empty() ? 0 : model_fixed_bytes;
  for (int64_t p : pixels) {
    const int64_t model_pixels = model_input_pixels > 0 ? model_input_pixels : p;
    total += host_bytes_per_pixel * static_cast<double>(p) + model_bytes_per_pixel * static_cast<double>(model_pixels);
  }
  return static_cast<int64_t>(std::ceil(total));
}

void FitModelBytes(int64_t p1, int64_t bytes1, int64_t p2, int64_t bytes2, MemoryModel* model) {
  if (p2 <= 0 || p2 == p1) {
    model->model_fixed_bytes = std::max<double>(0, static_cast<double>(std::max(bytes1, bytes2)));
    model->model_bytes_per_pixel = 0;
    return;
  }
  const double slope = static_cast<double>(bytes2 - bytes1) / static_cast<double>(p2 - p1);
  model->model_bytes_per_pixel = std::max(0.0, slope);
  model->model_fixed_bytes =
      std::max(0.0, static_cast<double>(bytes1) - model->model_bytes_per_pixel * static_cast<double>(p1));
}

std::string RowTooLarge(const MemoryModel& model, int height, int width, int64_t budget) {
  if (budget <= 0) return "";
  const int64_t need = model.LaunchBytes({static_cast<int64_t>(height) * width});
  if (need <= budget) return "";
  return absl::StrCat("needs about ", FormatBytes(need), " for ", height, "x", width, "; this worker may use ",
                      FormatBytes(budget), " (--max-worker-memory)",
                      model.model_input_pixels > 0 ? "; try a smaller --input-size or a worker with more memory"
                                                   : "; try --input-size, or a worker with more memory");
}

std::vector<size_t> SplitByMemory(const MemoryModel& model, const std::vector<int64_t>& pixels, int64_t budget) {
  std::vector<size_t> ends;
  std::vector<int64_t> launch;
  for (size_t i = 0; i < pixels.size(); ++i) {
    launch.push_back(pixels[i]);
    if (budget > 0 && launch.size() > 1 && model.LaunchBytes(launch) > budget) {
      ends.push_back(i);  // Row i starts the next launch.
      launch.assign(1, pixels[i]);
    }
  }
  if (!pixels.empty()) ends.push_back(pixels.size());
  return ends;
}

int64_t ParseCgroupLimit(const std::string& text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  int64_t v = 0;
  if (t.empty() || t == "max" || !absl::SimpleAtoi(t, &v) || v <= 0) return -1;
  return v;
}

int64_t MemoryLimitBytes() {
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t cgroup = CgroupLimitBytes();
  return cgroup > 0 ? std::min(cgroup, physical) : physical;
}

int64_t ResidentBytes() {
  std::istringstream statm(ReadSmallFile("/proc/self/statm"));
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace tally
