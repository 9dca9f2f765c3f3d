#include "common/sources/row_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/formats/decode.h"
#include "common/security/data_roots.h"
#include "common/sources/tar_members.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tally {
namespace {

std::atomic<int64_t> input_limit{int64_t{4} << 30};

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string Canonical(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
}

// Opens `path` as ReadFileBytes does, its errors phrased the same way.
absl::StatusOr<RegularFile> Open(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("", path);
  if (absl::IsInvalidArgument(file.status())) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is ", file.status().message(), ", not a regular file"));
  }
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot open '", path, "': ", file.status().message()));
  }
  return file;
}

// Whether the open file is still what it was when opened (size and time).
absl::Status Unchanged(int fd, const std::string& path, const struct stat& before) {
  struct stat after;
  if (fstat(fd, &after) != 0 || after.st_size != before.st_size || MtimeNs(after) != MtimeNs(before)) {
    return absl::DataLossError(absl::StrCat("'", path, "' changed while it was read (its size or modification time ",
                                            "moved); the row is not scored from it"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Xxh128(absl::string_view bytes) { return Canonical(XXH3_128bits(bytes.data(), bytes.size())); }
std::string Hex128(absl::string_view digest) { return absl::BytesToHexString(digest); }

void SetInputFileLimit(int64_t bytes) { input_limit = bytes > 0 ? bytes : int64_t{4} << 30; }
int64_t InputFileLimit() { return input_limit; }

absl::Status ReadFileBytes(const std::string& path, std::string* out, FileFacts* facts) {
  if (IsMemberLocator(path)) {  // A tar shard's member.
    absl::Status s = ReadMemberBytes(path, out, InputFileLimit());
    if (s.ok() && facts != nullptr) {
      absl::StatusOr<MemberRef> ref = ParseMemberLocator(path);
      facts->size = static_cast<int64_t>(out->size());
      facts->mtime_ns = ref.ok() ? ref->identity.mtime_ns : 0;
      facts->xxh128 = Xxh128(*out);
    }
    return s;
  }
  absl::StatusOr<RegularFile> file = Open(path);
  if (!file.ok()) return file.status();
  const int fd = file->fd;
  struct stat before;
  fstat(fd, &before);
  if (file->size > InputFileLimit()) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("'", path, "' is ", file->size, " bytes, more than the limit of ",
                                                     InputFileLimit(), " for one input (the worker's memory budget)"));
  }
  out->resize(static_cast<size_t>(file->size));
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = read(fd, out->data() + done, out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return absl::DataLossError(absl::StrCat("error reading '", path, "': ", n == 0 ? "short read" : std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  absl::Status same = Unchanged(fd, path, before);
  close(fd);
  if (!same.ok()) return same;
  if (facts != nullptr) {
    facts->size = static_cast<int64_t>(out->size());
    facts->mtime_ns = MtimeNs(before);
    facts->xxh128 = Xxh128(*out);
  }
  return absl::OkStatus();
}

absl::StatusOr<FileFacts> DigestFile(const std::string& path) {
  if (IsMemberLocator(path)) {
    std::string bytes;
    FileFacts facts;
    if (absl::Status s = ReadFileBytes(path, &bytes, &facts); !s.ok()) return s;
    return facts;
  }
  absl::StatusOr<RegularFile> file = Open(path);
  if (!file.ok()) return file.status();
  const int fd = file->fd;
  struct stat before;
  fstat(fd, &before);
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::string buffer(1 << 20, '\0');
  absl::Status s;
  while (true) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s = absl::DataLossError(absl::StrCat("error reading '", path, "': ", std::strerror(errno)));
    if (n <= 0) break;
    XXH3_128bits_update(state, buffer.data(), static_cast<size_t>(n));
  }
  if (s.ok()) s = Unchanged(fd, path, before);
  close(fd);
  FileFacts facts;
  facts.size = before.st_size;
  facts.mtime_ns = MtimeNs(before);
  facts.xxh128 = Canonical(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  if (!s.ok()) return s;
  return facts;
}

namespace {
// Reads `path` into a per-thread buffer (released again after an outlier) and decodes it. Read
// errors are prefixed with `what` ("image: cannot open ...").
template <typename DecodeFn>
absl::Status ReadAndDecode(const char* what, const std::string& path, FileFacts* facts, DecodeFn decode) {
  thread_local std::string bytes;
  absl::Status s = ReadFileBytes(path, &bytes, facts);
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  } else {
    s = decode(bytes);
  }
  if (bytes.capacity() > kKeepBufferBytes) std::string().swap(bytes);
  return s;
}
}  // namespace

absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels, const DecodeOptions& options,
                       FileFacts* facts) {
  return ReadAndDecode("image", path, facts, [&](const std::string& bytes) {
    return DecodeImage(bytes, DisplayPath(path), out, max_pixels, options);
  });
}

absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels, int page, FileFacts* facts) {
  return ReadAndDecode("mask", path, facts, [&](const std::string& bytes) {
    return DecodeMask(bytes, DisplayPath(path), out, max_pixels, page);
  });
}

}  // namespace tally
