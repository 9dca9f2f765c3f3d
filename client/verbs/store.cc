// tally store stats|ls|gc DIR: the prediction store as a thing people look after
// (docs/prediction-store.md). stats: entries and bytes by model and settings; ls: every entry from
// its header; gc --max-bytes N: drops the least recently used entries (written or scored from last
// longest ago) until the store holds at most N bytes, and temporary files a killed writer left.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flag_util.h"
#include "base/json_writer.h"
#include "client/verbs/verbs.h"
#include "common/store/prediction_store.h"

namespace tally {
namespace {

constexpr int64_t kStaleTemporaryNs = int64_t{3600} * 1000000000;  // A writer's temporary file an hour old.

struct Entry {
  std::string model, settings, path;
  StoreEntryInfo info;
};

std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Every entry under ROOT/v1 (model/settings/xx/input.tps); files that are not entries are named on
// stderr. Temporary files go to `temporaries` with their age in ns.
std::vector<Entry> Walk(const std::string& root, std::vector<std::pair<std::string, int64_t>>* temporaries) {
  std::vector<Entry> out;
  const std::string v1 = root + "/v1";
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  for (const std::string& model : Children(v1)) {
    for (const std::string& settings : Children(v1 + "/" + model)) {
      for (const std::string& shard : Children(v1 + "/" + model + "/" + settings)) {
        const std::string dir = absl::StrCat(v1, "/", model, "/", settings, "/", shard);
        for (const std::string& name : Children(dir)) {
          const std::string path = dir + "/" + name;
          if (name.find(".tmp.") != std::string::npos) {
            struct stat st;
            if (temporaries != nullptr && lstat(path.c_str(), &st) == 0) {
              temporaries->emplace_back(path, now_ns - (static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec));
            }
            continue;
          }
          absl::StatusOr<StoreEntryInfo> info = ReadStoreEntryHeader(path);
          if (!info.ok()) {
            std::cerr << "tally store: " << info.status().message() << "\n";
            continue;
          }
          out.push_back({model, settings, path, *info});
        }
      }
    }
  }
  return out;
}

int Stats(const std::vector<Entry>& entries, bool json) {
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> groups;  // -> (entries, bytes)
  int64_t bytes = 0;
  for (const Entry& e : entries) {
    auto& g = groups[{e.model, e.settings}];
    ++g.first;
    g.second += e.info.file_bytes;
    bytes += e.info.file_bytes;
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("entries", static_cast<int64_t>(entries.size())).Field("bytes", bytes);
    w.Key("groups").BeginArray();
    for (const auto& [key, g] : groups) {
      w.BeginObject().Field("model", key.first).Field("settings", key.second).Field("entries", g.first);
      w.Field("bytes", g.second).EndObject();
    }
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-16s  %-16s  %10s  %14s  %10s\n", "model", "settings", "entries", "bytes", "bytes/entry");
  for (const auto& [key, g] : groups) {
    std::cout << absl::StrFormat("%-16s  %-16s  %10d  %14d  %10d\n", key.first, key.second, g.first, g.second,
                                 g.second / std::max<int64_t>(1, g.first));
  }
  std::cout << absl::StrFormat("%d entries, %d bytes\n", entries.size(), bytes);
  return 0;
}

int List(const std::vector<Entry>& entries, bool json) {
  JsonWriter w;
  if (json) w.BeginArray();
  for (const Entry& e : entries) {
    const std::string input = e.path.substr(e.path.rfind('/') + 1, e.path.size() - e.path.rfind('/') - 5);
    if (json) {
      w.BeginObject().Field("model", e.model).Field("settings", e.settings).Field("input", input);
      w.Field("height", e.info.height).Field("width", e.info.width).Field("classes", e.info.classes);
      w.Field("bytes", e.info.file_bytes).Field("path", e.path).EndObject();
    } else {
      std::cout << absl::StrFormat("%s  %s  %s  %dx%d  %d classes  %d bytes\n", e.model, e.settings, input, e.info.height,
                                   e.info.width, e.info.classes, e.info.file_bytes);
    }
  }
  if (json) std::cout << w.EndArray().str() << "\n";
  return 0;
}

int Collect(std::vector<Entry> entries, const std::vector<std::pair<std::string, int64_t>>& temporaries,
            int64_t max_bytes) {
  int64_t removed_temporaries = 0;
  for (const auto& [path, age] : temporaries) {
    if (age > kStaleTemporaryNs && unlink(path.c_str()) == 0) ++removed_temporaries;
  }
  int64_t bytes = 0;
  for (const Entry& e : entries) bytes += e.info.file_bytes;
  // Least recently used first (ties: by path, so two runs drop the same entries).
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.info.mtime_ns, a.path) < std::tie(b.info.mtime_ns, b.path);
  });
  int64_t dropped = 0, freed = 0;
  for (const Entry& e : entries) {
    if (bytes - freed <= max_bytes) break;
    if (unlink(e.path.c_str()) == 0) {
      ++dropped;
      freed += e.info.file_bytes;
    }
  }
  std::cout << absl::StrFormat("dropped %d of %d entries (%d bytes; %d left), %d stale temporary files\n", dropped,
                               entries.size(), freed, bytes - freed, removed_temporaries);
  return 0;
}

}  // namespace

int StoreVerb(const StoreFlags& flags) {
  const std::vector<std::string>& p = flags.positional;
  if (p.size() != 2 || (p[0] != "stats" && p[0] != "ls" && p[0] != "gc")) {
    std::cerr << "usage: tally store stats|ls|gc DIR [--max-bytes N] [--json]\n";
    return 2;
  }
  struct stat st;
  if (stat((p[1] + "/v1").c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::cerr << "tally store: '" << p[1] << "' is not a prediction store (no v1/ folder in it)\n";
    return 1;
  }
  std::vector<std::pair<std::string, int64_t>> temporaries;
  std::vector<Entry> entries = Walk(p[1], &temporaries);
  if (p[0] == "stats") return Stats(entries, flags.json);
  if (p[0] == "ls") return List(entries, flags.json);
  if (flags.max_bytes.empty()) {
    std::cerr << "tally store gc: --max-bytes N (e.g. 200GiB) says how much the store may keep\n";
    return 2;
  }
  absl::StatusOr<int64_t> max_bytes = ParseByteSize("--max-bytes", flags.max_bytes);
  if (!max_bytes.ok()) {
    std::cerr << "tally store gc: " << max_bytes.status().message() << "\n";
    return 2;
  }
  return Collect(std::move(entries), temporaries, *max_bytes);
}

}  // namespace tally
