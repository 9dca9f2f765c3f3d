// Reading a tar shard's members (common/sources/tar_members.h).
#include "common/sources/tar_members.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security/data_roots.h"
#include "common/sources/tar_format.h"

namespace tally {
namespace {

constexpr char kLocatorPrefix[] = "@tar:";    // offset:size:z|t:len:shard member
constexpr char kLocatorPrefix2[] = "@tar2:";  // offset:size:z|t:shard size:mtime ns:len:shard member

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveCloser>;

std::string ScratchDir() {
  const char* dir = getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

int64_t FreeBytes(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return -1;
  return static_cast<int64_t>(v.f_bavail) * static_cast<int64_t>(v.f_frsize);
}

// A shard open for reading: the tar itself, or a compressed tar's decompressed bytes in an
// unlinked scratch file, written as far as readers have needed. A scratch copy that failed once
// (`error` set) serves no read again: the cache drops it and a later read starts a fresh one.
struct OpenShard {
  ~OpenShard() {
    if (fd >= 0) close(fd);
    if (source >= 0) close(source);
  }
  ShardIdentity identity;
  int fd = -1;
  bool compressed = false;
  std::mutex mu;  // Compressed: the decompression below.
  int source = -1;
  ArchivePtr raw;
  std::atomic<int64_t> written{0};  // Read by the cache without `mu` (its scratch bytes).
  bool ended = false;
  std::string error;                // Why the copy is broken (under `mu`)...
  std::atomic<bool> broken{false};  // ...and that it is, for the cache.
};

absl::StatusOr<int> ScratchFile(const std::string& d) {
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

// Process-wide: the shards open lately (a worker reads a lease's members from a few tars, and may
// hold a few leases at once). At most kOpenShards; compressed ones at most kScratchShards, their
// scratch bytes together within the scratch limit.
constexpr size_t kOpenShards = 16, kScratchShards = 3;
class ShardCache {
 public:
  absl::StatusOr<std::shared_ptr<OpenShard>> Get(const MemberRef& ref);
  void Drop(const std::shared_ptr<OpenShard>& shard);
  void Clear();
  int64_t Count();
  int64_t ScratchBytes();
  // Room for `shard` to grow to `end` bytes of scratch: other copies not in use are dropped first.
  absl::Status Reserve(OpenShard* shard, int64_t end, const std::string& path);
  void SetLimit(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }

 private:
  int64_t LimitLocked();
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<OpenShard>>> open_;
  int64_t limit_ = 0;  // 0: a quarter of the scratch folder's free space, fixed when first needed.
};

ShardCache& Cache() {
  static auto* cache = new ShardCache;
  return *cache;
}

std::string Changed(const std::string& path, const ShardIdentity& was, const ShardIdentity& now) {
  std::string what;
  if (was.size != now.size) absl::StrAppend(&what, "size ", was.size, " -> ", now.size, " bytes");
  if (was.mtime_ns != now.mtime_ns) {
    absl::StrAppend(&what, what.empty() ? "" : ", ", "modified ", now.mtime_ns / 1000000000, ".",
                    absl::Dec(now.mtime_ns % 1000000000, absl::kZeroPad9), " s, not ", was.mtime_ns / 1000000000, ".",
                    absl::Dec(was.mtime_ns % 1000000000, absl::kZeroPad9));
  }
  return absl::StrCat("shard '", path, "' changed after the job was submitted (", what,
                      "): its rows are not read from it (evaluate the shard again in a new job)");
}

absl::StatusOr<std::shared_ptr<OpenShard>> ShardCache::Get(const MemberRef& ref) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      if (it->first != ref.shard || it->second->compressed != ref.compressed) continue;
      if (!it->second->broken && (ref.identity.size < 0 || (it->second->identity.size == ref.identity.size &&
                                                                   it->second->identity.mtime_ns == ref.identity.mtime_ns))) {
        // Still the file it was when opened? (A path replaced by another file, or rewritten.)
        struct stat st;
        if (stat(ref.shard.c_str(), &st) == 0 && st.st_size == it->second->identity.size &&
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec == it->second->identity.mtime_ns) {
          open_.splice(open_.begin(), open_, it);
          return open_.front().second;
        }
      }
      open_.erase(it);  // Changed, broken or another identity: opened again below.
      break;
    }
  }
  absl::StatusOr<RegularFile> file = OpenRegularFile(ref.shard);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("shard", ref.shard);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot open shard '", ref.shard, "': ", file.status().message()));
  }
  auto shard = std::make_shared<OpenShard>();
  shard->identity = IdentityOf(file->fd);
  shard->compressed = ref.compressed;
  if (ref.identity.size >= 0 &&
      (shard->identity.size != ref.identity.size || shard->identity.mtime_ns != ref.identity.mtime_ns)) {
    close(file->fd);
    return absl::FailedPreconditionError(Changed(ref.shard, ref.identity, shard->identity));
  }
  if (!ref.compressed) {
    shard->fd = file->fd;
  } else {
    shard->source = file->fd;
    absl::StatusOr<int> scratch = ScratchFile(ScratchDir());
    if (!scratch.ok()) return scratch.status();
    shard->fd = *scratch;
    shard->raw.reset(archive_read_new());
    archive_read_support_filter_all(shard->raw.get());
    archive_read_support_format_raw(shard->raw.get());
    archive_entry* e = nullptr;
    if (archive_read_open_fd(shard->raw.get(), shard->source, 1 << 20) != ARCHIVE_OK ||
        archive_read_next_header(shard->raw.get(), &e) != ARCHIVE_OK) {
      return absl::DataLossError(absl::StrCat("cannot decompress shard '", ref.shard, "': ",
                                              archive_error_string(shard->raw.get()) ? archive_error_string(shard->raw.get())
                                                                                     : "unknown"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_.emplace_front(ref.shard, shard);
  size_t scratch = 0;
  for (auto it = open_.begin(); it != open_.end();) {
    const bool drop = std::distance(open_.begin(), it) >= static_cast<long>(kOpenShards) ||
                      (it->second->compressed && ++scratch > kScratchShards);
    it = drop ? open_.erase(it) : std::next(it);
  }
  return shard;
}

void ShardCache::Drop(const std::shared_ptr<OpenShard>& shard) {
  std::lock_guard<std::mutex> lock(mu_);
  open_.remove_if([&](const auto& p) { return p.second == shard; });
}

void ShardCache::Clear() {
  std::list<std::pair<std::string, std::shared_ptr<OpenShard>>> gone;
  std::lock_guard<std::mutex> lock(mu_);
  gone.swap(open_);  // Closed as the last reader lets go.
}

int64_t ShardCache::Count() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(open_.size());
}

int64_t ShardCache::ScratchBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& p : open_) n += p.second->compressed ? p.second->written.load() : int64_t{0};
  return n;
}

int64_t ShardCache::LimitLocked() {
  if (limit_ <= 0) {
    const int64_t free = FreeBytes(ScratchDir());
    limit_ = free > 0 ? free / 4 : (int64_t{4} << 30);
  }
  return limit_;
}

absl::Status ShardCache::Reserve(OpenShard* shard, int64_t end, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t limit = LimitLocked();
  if (end > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard '", path, "' needs ", end, " bytes decompressed in scratch to reach this member, more than the scratch ",
        "limit of ", limit, " (tally-worker --scratch-limit)"));
  }
  int64_t held = 0;
  for (const auto& p : open_) held += p.second->compressed && p.second.get() != shard ? p.second->written.load() : int64_t{0};
  for (auto it = open_.end(); held + end > limit && it != open_.begin();) {
    --it;
    if (!it->second->compressed || it->second.get() == shard || it->second.use_count() > 1) continue;
    held -= it->second->written;
    it = open_.erase(it);
  }
  if (held + end > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard '", path, "' needs ", end, " bytes decompressed in scratch while other shards in use hold ", held,
        "; together more than the scratch limit of ", limit, " (tally-worker --scratch-limit)"));
  }
  return absl::OkStatus();
}

// Appends `n` bytes to the scratch copy: the whole of them, or the copy is broken for good (a short
// write would leave every later member read from the wrong place).
bool WriteScratch(OpenShard* shard, const char* data, int64_t n, int* err) {
  for (int64_t done = 0; done < n;) {
    const ssize_t w = pwrite(shard->fd, data + done, static_cast<size_t>(n - done), shard->written + done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err = w < 0 ? errno : ENOSPC;
      return false;
    }
    done += w;
  }
  shard->written += n;
  return true;
}

// Decompresses `shard` into its scratch file until it holds `end` bytes (or the stream ends).
absl::Status DecompressTo(OpenShard* shard, int64_t end, const std::string& path) {
  std::lock_guard<std::mutex> lock(shard->mu);
  if (shard->broken) return absl::ResourceExhaustedError(shard->error);
  if (shard->written < end) {
    if (absl::Status s = Cache().Reserve(shard, end, path); !s.ok()) return s;
  }
  std::string buffer(1 << 20, '\0');
  while (shard->written < end && !shard->ended) {
    const la_ssize_t n = archive_read_data(shard->raw.get(), buffer.data(), buffer.size());
    if (n <= 0) {
      shard->ended = true;
      if (n < 0) shard->error = archive_error_string(shard->raw.get()) ? archive_error_string(shard->raw.get()) : "corrupt";
      break;
    }
    int err = 0;
    if (!WriteScratch(shard, buffer.data(), n, &err)) {
      const std::string dir = ScratchDir();
      shard->error = absl::StrCat(err == ENOSPC ? "scratch full" : "scratch write failed", ": shard '", path,
                                  "' needed ", end, " bytes decompressed, ", FreeBytes(dir), " free in '", dir, "' (",
                                  std::strerror(err), "; $TMPDIR)");
      shard->broken = true;
      return absl::ResourceExhaustedError(shard->error);
    }
  }
  if (shard->written < end) {
    const std::string why = absl::StrCat("shard '", path, "' decompresses to ", shard->written.load(), " bytes, short of ", end,
                                         shard->error.empty() ? "" : absl::StrCat(" (", shard->error, ")"));
    return absl::DataLossError(why);  // What was written stays right: earlier members still read.
  }
  return absl::OkStatus();
}

// Reads `n` bytes at `at` of `fd`: false with `why` set when the file ends first or fails.
bool ReadAt(int fd, char* out, int64_t n, int64_t at, std::string* why) {
  for (int64_t done = 0; done < n;) {
    const ssize_t r = pread(fd, out + done, static_cast<size_t>(n - done), at + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *why = r == 0 ? "the shard ends before the member does" : std::strerror(errno);
      return false;
    }
    done += r;
  }
  return true;
}

}  // namespace

ShardIdentity IdentityOf(int fd) {
  ShardIdentity id;
  struct stat st;
  if (fstat(fd, &st) != 0) return id;
  id.size = st.st_size;
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

std::string MemberLocator(const std::string& shard, int64_t offset, int64_t size, bool compressed,
                          const std::string& member, const ShardIdentity& identity) {
  if (identity.size < 0) {
    return absl::StrCat(kLocatorPrefix, offset, ":", size, ":", compressed ? "z" : "t", ":", shard.size(), ":", shard,
                        member);
  }
  return absl::StrCat(kLocatorPrefix2, offset, ":", size, ":", compressed ? "z" : "t", ":", identity.size, ":",
                      identity.mtime_ns, ":", shard.size(), ":", shard, member);
}

bool IsMemberLocator(absl::string_view path) {
  return absl::StartsWith(path, kLocatorPrefix) || absl::StartsWith(path, kLocatorPrefix2);
}

absl::StatusOr<MemberRef> ParseMemberLocator(absl::string_view locator) {
  auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat("malformed member locator '", locator.substr(0, 256), "'")); };
  const bool v2 = absl::StartsWith(locator, kLocatorPrefix2);
  if (!v2 && !absl::StartsWith(locator, kLocatorPrefix)) return bad();
  absl::string_view rest = locator.substr(v2 ? sizeof(kLocatorPrefix2) - 1 : sizeof(kLocatorPrefix) - 1);
  const int fields = v2 ? 7 : 5;
  std::vector<absl::string_view> parts = absl::StrSplit(rest, absl::MaxSplits(':', fields - 1));
  if (static_cast<int>(parts.size()) != fields) return bad();
  MemberRef ref;
  uint64_t shard_len = 0;
  const absl::string_view tail = parts[fields - 1];
  if (!absl::SimpleAtoi(parts[0], &ref.offset) || !absl::SimpleAtoi(parts[1], &ref.size) ||
      !absl::SimpleAtoi(parts[fields - 2], &shard_len) || ref.offset < 0 || ref.size < 0 ||
      (parts[2] != "z" && parts[2] != "t") || shard_len > tail.size()) {
    return bad();
  }
  if (v2 && (!absl::SimpleAtoi(parts[3], &ref.identity.size) || !absl::SimpleAtoi(parts[4], &ref.identity.mtime_ns) ||
             ref.identity.size < 0)) {
    return bad();
  }
  ref.compressed = parts[2] == "z";
  ref.shard = std::string(tail.substr(0, shard_len));
  ref.member = std::string(tail.substr(shard_len));
  return ref;
}

std::string DisplayPath(const std::string& path) {
  if (!IsMemberLocator(path)) return path;
  absl::StatusOr<MemberRef> ref = ParseMemberLocator(path);
  return ref.ok() ? absl::StrCat(ref->shard, ":", ref->member) : path;
}

absl::Status ReadMemberBytes(const std::string& locator, std::string* out, int64_t max_bytes) {
  absl::StatusOr<MemberRef> ref = ParseMemberLocator(locator);
  if (!ref.ok()) return ref.status();
  auto fail = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("member '", ref->member, "' of shard '", ref->shard, "': ", why));
  };
  const int64_t limit = max_bytes >= 0 ? std::min(max_bytes, kDefaultMaxMemberBytes) : kDefaultMaxMemberBytes;
  if (ref->size > limit) {
    return absl::ResourceExhaustedError(absl::StrCat("member '", ref->member, "' of shard '", ref->shard, "' declares ",
                                                     ref->size, " bytes, more than the limit of ", limit,
                                                     " for one input (the member limit and the worker's memory)"));
  }
  if (ref->offset < kTarBlock) return fail("its offset leaves no room for its header");
  absl::StatusOr<std::shared_ptr<OpenShard>> shard = Cache().Get(*ref);
  if (!shard.ok()) return shard.status();
  if (ref->compressed) {
    if (absl::Status s = DecompressTo(shard->get(), ref->offset + ref->size, ref->shard); !s.ok()) {
      if ((*shard)->broken) Cache().Drop(*shard);
      return s;
    }
  }
  char header[kTarBlock];
  std::string why;
  if (!ReadAt((*shard)->fd, header, kTarBlock, ref->offset - kTarBlock, &why)) return fail(why);
  if (!MemberHeaderMatches(header, ref->member, ref->size, &why)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "member '", ref->member, "' of shard '", ref->shard, "': ", why,
        "; the shard is not the one indexed when the job was submitted, and its rows are not read from it"));
  }
  out->resize(static_cast<size_t>(ref->size));
  if (!ReadAt((*shard)->fd, out->data(), ref->size, ref->offset, &why)) return fail(why);
  return absl::OkStatus();
}

void SetScratchLimit(int64_t bytes) { Cache().SetLimit(bytes); }
void CloseShards() { Cache().Clear(); }
int64_t OpenShardCount() { return Cache().Count(); }
int64_t ScratchBytesHeld() { return Cache().ScratchBytes(); }

}  // namespace tally
