#include "common/security/data_roots.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"

namespace tally {
namespace {

DataRoots& Roots() {
  static DataRoots* roots = new DataRoots();
  return *roots;
}

bool RealPath(const std::string& path, std::string* out) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return false;
  *out = buf;
  return true;
}

bool Inside(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (absl::StartsWith(path, root) && path.size() > root.size() && path[root.size()] == '/');
}

}  // namespace

absl::StatusOr<DataRoots> DataRoots::Create(const std::vector<std::string>& dirs) {
  DataRoots r;
  for (const std::string& d : dirs) {
    std::string real;
    struct stat st;
    if (!RealPath(d, &real) || stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("--data-root '", d, "' is not an existing folder"));
    }
    r.roots_.push_back(real);
  }
  return r;
}

absl::StatusOr<std::string> DataRoots::Resolve(const std::string& path) const {
  if (roots_.empty()) return path;
  const std::string abs = AbsolutePath(path);
  std::string real;
  if (!RealPath(abs, &real)) {
    // Missing (or unreadable) file: resolve the nearest existing folder, keep the rest as written.
    std::string base = abs, rest;
    while (true) {
      const size_t slash = base.rfind('/');
      if (slash == std::string::npos || slash == 0) return absl::PermissionDeniedError(kOutsideDataRoots);
      rest = absl::StrCat(base.substr(slash), rest);
      base = base.substr(0, slash);
      if (RealPath(base, &real)) break;
    }
    for (absl::string_view part : absl::StrSplit(rest, '/')) {
      if (part == "..") return absl::PermissionDeniedError(kOutsideDataRoots);
    }
    real += rest;
  }
  for (const std::string& root : roots_) {
    if (Inside(real, root)) return real;
  }
  return absl::PermissionDeniedError(kOutsideDataRoots);
}

void SetProcessDataRoots(DataRoots roots) { Roots() = std::move(roots); }

const DataRoots& ProcessDataRoots() { return Roots(); }

bool IsOutsideDataRoots(const absl::Status& status) {
  return absl::IsPermissionDenied(status) && absl::EndsWith(status.message(), kOutsideDataRoots);
}

absl::Status OutsideDataRootsError(const std::string& what, const std::string& path) {
  return absl::PermissionDeniedError(absl::StrCat(what, what.empty() ? "'" : " '", path, "': ", kOutsideDataRoots));
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path) {
  // With data roots, the resolved path is opened (no symlink is followed after the check).
  absl::StatusOr<std::string> resolved = ProcessDataRoots().Resolve(path);
  if (!resolved.ok()) return resolved.status();
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = open(resolved->c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return err == ENOENT ? absl::NotFoundError(std::strerror(err)) : absl::PermissionDeniedError(std::strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::PermissionDeniedError(std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    const char* kind = S_ISDIR(st.st_mode)                          ? "a directory"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                       : (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) ? "a device"
                                                                      : "not a regular file";
    return absl::InvalidArgumentError(kind);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return RegularFile{fd, static_cast<int64_t>(st.st_size)};
}

absl::StatusOr<std::string> ReadClientFile(const std::string& what, const std::string& path,
                                           const ClientFileLimits& limits, size_t padding) {
  auto named = [&](const absl::Status& s, absl::string_view text) {
    return absl::Status(s.code(), absl::StrCat(what, " '", path, "': ", text));
  };
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError(what, path);
  if (absl::IsInvalidArgument(file.status())) {
    return named(file.status(), absl::StrCat("is ", file.status().message(), ", not a regular file"));
  }
  if (!file.ok()) return named(file.status(), absl::StrCat("cannot open: ", file.status().message()));
  const int fd = file->fd;
  auto too_large = [&](int64_t bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': ", bytes, " bytes, more than the ",
                                                   limits.max_bytes, " allowed (", limits.max_bytes_flag, ")"));
  };
  if (file->size > limits.max_bytes) {
    close(fd);
    return too_large(file->size);
  }
  std::string text;
  text.reserve(static_cast<size_t>(file->size) + padding);
  std::vector<char> piece(size_t{1} << 20);
  absl::Status status;
  while (true) {
    if (absl::Now() > limits.deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(what, " '", path, "': not read in time (", text.size(),
                                                        " bytes read before the submission's deadline)"));
      break;
    }
    const ssize_t n = read(fd, piece.data(), piece.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = named(absl::PermissionDeniedError(""), absl::StrCat("read failed: ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;
    if (static_cast<int64_t>(text.size()) + n > limits.max_bytes) {
      status = too_large(static_cast<int64_t>(text.size()) + n);
      break;
    }
    text.append(piece.data(), static_cast<size_t>(n));
  }
  close(fd);
  if (!status.ok()) return status;
  if (text.capacity() < text.size() + padding) text.reserve(text.size() + padding);
  return text;
}

}  // namespace tally
