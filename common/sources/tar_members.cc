// Reading a tar shard's members (common/sources/tar_members.h).
#include "common/sources/tar_members.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security/data_roots.h"

namespace tally {
namespace {

constexpr char kLocatorPrefix[] = "@tar:";

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveCloser>;

// A shard open for reading: the tar itself, or a compressed tar's decompressed bytes in an
// unlinked scratch file, written as far as readers have needed.
struct OpenShard {
  ~OpenShard() {
    if (fd >= 0) close(fd);
    if (source >= 0) close(source);
  }
  struct stat identity {};
  int fd = -1;
  bool compressed = false;
  std::mutex mu;  // Compressed: the decompression below.
  int source = -1;
  ArchivePtr raw;
  int64_t written = 0;
  bool ended = false;
  std::string error;
};

absl::StatusOr<int> ScratchFile() {
  const char* dir = getenv("TMPDIR");
  std::string d = dir != nullptr && *dir != '\0' ? dir : "/tmp";
#ifdef O_TMPFILE
  int fd = open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
#endif
  std::string path = d + "/tally-shard-XXXXXX";
  fd = mkstemp(path.data());
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create a scratch file in '", d, "': ", std::strerror(errno)));
  unlink(path.c_str());
  return fd;
}

// Process-wide: the shards open lately (a worker reads a lease's members from one tar, and may
// hold a few leases at once). At most kOpenShards; compressed ones at most kScratchShards (each
// holds its tar's decompressed bytes on the scratch disk until it is dropped).
constexpr size_t kOpenShards = 16, kScratchShards = 3;
class ShardCache {
 public:
  absl::StatusOr<std::shared_ptr<OpenShard>> Get(const std::string& path, bool compressed) {
    struct stat st;
    const bool stat_ok = stat(path.c_str(), &st) == 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = open_.begin(); it != open_.end(); ++it) {
        if (it->first != path || it->second->compressed != compressed) continue;
        const struct stat& id = it->second->identity;
        if (stat_ok && id.st_ino == st.st_ino && id.st_dev == st.st_dev && id.st_size == st.st_size &&
            id.st_mtim.tv_sec == st.st_mtim.tv_sec && id.st_mtim.tv_nsec == st.st_mtim.tv_nsec) {
          open_.splice(open_.begin(), open_, it);
          return open_.front().second;
        }
        open_.erase(it);  // Changed on disk: opened again below.
        break;
      }
    }
    absl::StatusOr<RegularFile> file = OpenRegularFile(path);
    if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("shard", path);
    if (!file.ok()) {
      return absl::Status(file.status().code(), absl::StrCat("cannot open shard '", path, "': ", file.status().message()));
    }
    auto shard = std::make_shared<OpenShard>();
    fstat(file->fd, &shard->identity);
    shard->compressed = compressed;
    if (!compressed) {
      shard->fd = file->fd;
    } else {
      shard->source = file->fd;
      absl::StatusOr<int> scratch = ScratchFile();
      if (!scratch.ok()) return scratch.status();
      shard->fd = *scratch;
      shard->raw.reset(archive_read_new());
      archive_read_support_filter_all(shard->raw.get());
      archive_read_support_format_raw(shard->raw.get());
      archive_entry* e = nullptr;
      if (archive_read_open_fd(shard->raw.get(), shard->source, 1 << 20) != ARCHIVE_OK ||
          archive_read_next_header(shard->raw.get(), &e) != ARCHIVE_OK) {
        return absl::DataLossError(absl::StrCat("cannot decompress shard '", path, "': ",
                                                archive_error_string(shard->raw.get()) ? archive_error_string(shard->raw.get()) : "unknown"));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_.emplace_front(path, shard);
    size_t scratch = 0;
    for (auto it = open_.begin(); it != open_.end();) {
      const bool drop = std::distance(open_.begin(), it) >= static_cast<long>(kOpenShards) ||
                        (it->second->compressed && ++scratch > kScratchShards);
      it = drop ? open_.erase(it) : std::next(it);
    }
    return shard;
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<OpenShard>>> open_;
};

ShardCache& Cache() {
  static auto* cache = new ShardCache;
  return *cache;
}

// Decompresses `shard` into its scratch file until it holds `end` bytes (or the stream ends).
absl::Status DecompressTo(OpenShard* shard, int64_t end, const std::string& path) {
  std::lock_guard<std::mutex> lock(shard->mu);
  std::string buffer(1 << 20, '\0');
  while (shard->written < end && !shard->ended) {
    const la_ssize_t n = archive_read_data(shard->raw.get(), buffer.data(), buffer.size());
    if (n < 0) {
      shard->ended = true;
      shard->error = archive_error_string(shard->raw.get()) ? archive_error_string(shard->raw.get()) : "corrupt";
      break;
    }
    if (n == 0) {
      shard->ended = true;
      break;
    }
    for (la_ssize_t done = 0; done < n;) {
      const ssize_t w = pwrite(shard->fd, buffer.data() + done, n - done, shard->written + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot write shard '", path, "' decompressed to the scratch ",
                                                         "folder ($TMPDIR): ", std::strerror(errno)));
      }
      done += w;
    }
    shard->written += n;
  }
  if (shard->written < end) {
    return absl::DataLossError(absl::StrCat("shard '", path, "' decompresses to ", shard->written, " bytes, short of ",
                                            end, shard->error.empty() ? "" : absl::StrCat(" (", shard->error, ")")));
  }
  return absl::OkStatus();
}

}  // namespace

std::string MemberLocator(const std::string& shard, int64_t offset, int64_t size, bool compressed,
                          const std::string& member) {
  return absl::StrCat(kLocatorPrefix, offset, ":", size, ":", compressed ? "z" : "t", ":", shard.size(), ":", shard,
                      member);
}

bool IsMemberLocator(absl::string_view path) { return absl::StartsWith(path, kLocatorPrefix); }

absl::StatusOr<MemberRef> ParseMemberLocator(absl::string_view locator) {
  auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat("malformed member locator '", locator.substr(0, 256), "'")); };
  if (!IsMemberLocator(locator)) return bad();
  absl::string_view rest = locator.substr(sizeof(kLocatorPrefix) - 1);
  std::vector<absl::string_view> parts = absl::StrSplit(rest, absl::MaxSplits(':', 4));
  if (parts.size() != 5) return bad();
  MemberRef ref;
  uint64_t shard_len = 0;
  if (!absl::SimpleAtoi(parts[0], &ref.offset) || !absl::SimpleAtoi(parts[1], &ref.size) ||
      !absl::SimpleAtoi(parts[3], &shard_len) || ref.offset < 0 || ref.size < 0 || (parts[2] != "z" && parts[2] != "t") ||
      shard_len > parts[4].size()) {
    return bad();
  }
  ref.compressed = parts[2] == "z";
  ref.shard = std::string(parts[4].substr(0, shard_len));
  ref.member = std::string(parts[4].substr(shard_len));
  return ref;
}

std::string DisplayPath(const std::string& path) {
  if (!IsMemberLocator(path)) return path;
  absl::StatusOr<MemberRef> ref = ParseMemberLocator(path);
  return ref.ok() ? absl::StrCat(ref->shard, ":", ref->member) : path;
}

absl::Status ReadMemberBytes(const std::string& locator, std::string* out) {
  absl::StatusOr<MemberRef> ref = ParseMemberLocator(locator);
  if (!ref.ok()) return ref.status();
  absl::StatusOr<std::shared_ptr<OpenShard>> shard = Cache().Get(ref->shard, ref->compressed);
  if (!shard.ok()) return shard.status();
  if (ref->compressed) {
    if (absl::Status s = DecompressTo(shard->get(), ref->offset + ref->size, ref->shard); !s.ok()) return s;
  }
  out->resize(static_cast<size_t>(ref->size));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = pread((*shard)->fd, out->data() + done, out->size() - done, ref->offset + static_cast<int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat("member '", ref->member, "' of shard '", ref->shard, "': ",
                                              n == 0 ? "the shard ends before the member does" : std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace tally
