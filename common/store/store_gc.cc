#include "common/store/store_gc.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"

namespace tally {
namespace {

constexpr int64_t kStaleTemporaryNs = int64_t{3600} * 1000000000;  // A writer's temporary file an hour old.

int64_t NowNs() {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

}  // namespace

StoreWalk WalkStore(const std::string& root) {
  StoreWalk out;
  const std::string v1 = root + "/v1";
  const int64_t now_ns = NowNs();
  for (const std::string& model : ListDirectory(v1)) {
    for (const std::string& settings : ListDirectory(v1 + "/" + model)) {
      for (const std::string& shard : ListDirectory(absl::StrCat(v1, "/", model, "/", settings))) {
        const std::string dir = absl::StrCat(v1, "/", model, "/", settings, "/", shard);
        for (const std::string& name : ListDirectory(dir)) {
          const std::string path = dir + "/" + name;
          if (name.find(".tmp.") != std::string::npos) {
            struct stat st;
            if (lstat(path.c_str(), &st) == 0) {
              out.temporaries.emplace_back(
                  path, now_ns - (static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec));
            }
            continue;
          }
          absl::StatusOr<StoreEntryInfo> info = ReadStoreEntryHeader(path);
          if (!info.ok()) {
            out.errors.emplace_back(info.status().message());
            continue;
          }
          out.bytes += info->file_bytes;
          out.entries.push_back({model, settings, path, name.substr(0, name.rfind('.')), *info});
        }
      }
    }
  }
  return out;
}

StoreCollection CollectStore(StoreWalk walk, int64_t max_bytes) {
  StoreCollection c;
  for (const auto& [path, age] : walk.temporaries) {
    if (age > kStaleTemporaryNs && unlink(path.c_str()) == 0) ++c.temporaries;
  }
  std::sort(walk.entries.begin(), walk.entries.end(), [](const StoreFile& a, const StoreFile& b) {
    return std::tie(a.info.mtime_ns, a.path) < std::tie(b.info.mtime_ns, b.path);
  });
  for (const StoreFile& e : walk.entries) {
    if (walk.bytes - c.freed <= max_bytes) break;
    if (unlink(e.path.c_str()) == 0) {
      ++c.dropped;
      c.freed += e.info.file_bytes;
    }
  }
  c.left = walk.bytes - c.freed;
  return c;
}

}  // namespace tally
