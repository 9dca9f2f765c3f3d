#include "common/process/cpu_placement.h"

#include <dirent.h>

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"

namespace tally {
namespace {

std::string ReadSmallFile(const std::string& path) { return ReadFileToString(path).value_or(""); }

// `count` workers over `cpus` (already in core order): contiguous runs of whole cores, as even as
// the counts allow (the first workers get the extra core); round-robin CPUs when there are fewer
// cores than workers.
std::vector<std::vector<int>> Split(int count, const std::vector<int>& cpus, const std::map<int, int>& core_of) {
  std::vector<std::vector<int>> cores;  // CPUs grouped by core, in order.
  int last_key = -1;
  for (int c : cpus) {
    auto it = core_of.find(c);
    const int key = it == core_of.end() ? c : it->second;
    if (cores.empty() || key != last_key) cores.emplace_back();
    cores.back().push_back(c);
    last_key = key;
  }
  std::vector<std::vector<int>> out(count);
  const int n = static_cast<int>(cores.size());
  if (n >= count) {
    for (int i = 0; i < count; ++i) {
      for (int k = i * n / count; k < (i + 1) * n / count; ++k) out[i].insert(out[i].end(), cores[k].begin(), cores[k].end());
    }
  } else if (!cpus.empty()) {
    for (int i = 0; i < count; ++i) out[i].push_back(cpus[i % cpus.size()]);
  }
  return out;
}

// `cpus` sorted so that hyperthread siblings are adjacent: by core key, then CPU number.
std::vector<int> CoreOrder(std::vector<int> cpus, const std::map<int, int>& core_of) {
  auto key = [&](int c) {
    auto it = core_of.find(c);
    return std::make_pair(it == core_of.end() ? c : it->second, c);
  };
  std::sort(cpus.begin(), cpus.end(), [&](int a, int b) { return key(a) < key(b); });
  return cpus;
}

}  // namespace

std::vector<int> ParseCpuList(absl::string_view text) {
  std::set<int> out;
  for (absl::string_view part : absl::StrSplit(absl::StripAsciiWhitespace(text), ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int a = 0, b = 0;
    if (!absl::SimpleAtoi(ends[0], &a) || a < 0) return {};
    b = a;
    if (ends.size() == 2 && (!absl::SimpleAtoi(ends[1], &b) || b < a || b - a > 65536)) return {};
    for (int c = a; c <= b; ++c) out.insert(c);
  }
  return std::vector<int>(out.begin(), out.end());
}

std::vector<std::vector<int>> PlaceWorkers(int workers, const std::vector<int>& allowed,
                                           const std::vector<std::vector<int>>& near,
                                           const std::map<int, int>& core_of) {
  if (workers <= 0) return {};
  const std::vector<int> ordered = CoreOrder(allowed, core_of);
  const std::set<int> allowed_set(allowed.begin(), allowed.end());
  // Each worker's node: its GPU's local CPUs that this process may use.
  std::vector<std::vector<int>> node(workers);
  bool known = static_cast<int>(near.size()) >= workers;
  for (int i = 0; known && i < workers; ++i) {
    for (int c : ordered) {
      if (std::binary_search(near[i].begin(), near[i].end(), c)) node[i].push_back(c);
    }
    known = !node[i].empty();
  }
  // The distinct nodes must not overlap (else the topology is not one of NUMA nodes).
  std::vector<std::vector<int>> distinct;
  for (int i = 0; known && i < workers; ++i) {
    if (std::find(distinct.begin(), distinct.end(), node[i]) != distinct.end()) continue;
    for (const auto& d : distinct) {
      for (int c : node[i]) known = known && std::find(d.begin(), d.end(), c) == d.end();
    }
    distinct.push_back(node[i]);
  }
  if (!known) return Split(workers, ordered, core_of);
  std::vector<std::vector<int>> out(workers);
  for (const auto& d : distinct) {
    std::vector<int> members;
    for (int i = 0; i < workers; ++i) {
      if (node[i] == d) members.push_back(i);
    }
    std::vector<std::vector<int>> parts = Split(static_cast<int>(members.size()), d, core_of);
    for (size_t k = 0; k < members.size(); ++k) out[members[k]] = std::move(parts[k]);
  }
  return out;
}

std::vector<int> GpuLocalCpus(const std::string& cuda_visible_device, const std::string& root) {
  const std::string dir = root + "/proc/driver/nvidia/gpus";
  std::vector<std::string> buses;
  if (DIR* d = opendir(dir.c_str()); d != nullptr) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') buses.emplace_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(buses.begin(), buses.end());  // PCI bus order: nvidia-smi's (and NVML's) indices.
  const std::string want = std::string(absl::StripAsciiWhitespace(cuda_visible_device));
  std::string bus;
  int index = -1;
  if (absl::SimpleAtoi(want, &index)) {
    if (index >= 0 && index < static_cast<int>(buses.size())) bus = buses[index];
  } else if (absl::StartsWith(want, "GPU-")) {
    for (const std::string& b : buses) {
      const std::string info = ReadSmallFile(absl::StrCat(dir, "/", b, "/information"));
      for (absl::string_view line : absl::StrSplit(info, '\n')) {
        if (absl::StartsWith(line, "GPU UUID:") && absl::StrContains(line, want)) bus = b;
      }
    }
  }
  if (bus.empty()) return {};
  return ParseCpuList(ReadSmallFile(absl::StrCat(root, "/sys/bus/pci/devices/", absl::AsciiStrToLower(bus),
                                                 "/local_cpulist")));
}

std::map<int, int> CoreOfCpus(const std::vector<int>& cpus, const std::string& root) {
  std::map<int, int> out;
  for (int c : cpus) {
    const std::vector<int> siblings = ParseCpuList(
        ReadSmallFile(absl::StrCat(root, "/sys/devices/system/cpu/cpu", c, "/topology/thread_siblings_list")));
    if (!siblings.empty()) out[c] = siblings.front();
  }
  return out;
}

}  // namespace tally
