#include "base/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tally {

namespace {
// `path` without "." components and repeated slashes ("a/./b//c" -> "a/b/c"); ".." stays (what it
// means depends on symbolic links).
std::string WithoutDots(const std::string& path) {
  std::string out;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "." || (part.empty() && !out.empty())) continue;
    if (!out.empty() && out.back() != '/') out.push_back('/');
    if (part.empty()) {
      out = "/";  // The leading slash of an absolute path.
      continue;
    }
    absl::StrAppend(&out, part);
  }
  return out.empty() ? "." : out;
}
}  // namespace

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (base_dir.empty() || base_dir == ".") return WithoutDots(path);
  return WithoutDots(base_dir + "/" + path);
}

bool IsNiftiPath(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  return absl::EndsWith(lower, ".nii") || absl::EndsWith(lower, ".nii.gz");
}

std::vector<std::string> VolumeChannelFiles(const std::string& image) {
  std::vector<std::string> parts = absl::StrSplit(image, ';');
  if (parts.size() < 2) return {image};
  for (const std::string& p : parts) {
    if (!IsNiftiPath(p)) return {image};
  }
  return parts;
}

std::string AbsolutePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char buf[4096];
  if (getcwd(buf, sizeof(buf)) == nullptr) return path;
  return ResolvePath(buf, path);
}

absl::Status MakeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!path.empty() && mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
      }
    }
    if (i < dir.size()) path.push_back(dir[i]);
  }
  return absl::OkStatus();
}

std::string UniqueTemporaryPath(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(path, ".tmp.", host, ".", getpid(), ".", counter.fetch_add(1));
}

std::vector<std::string> ListDirectory(const std::string& dir) {
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

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Open(const std::string& path) {
  std::unique_ptr<AtomicFile> f(new AtomicFile(path));
  f->out_.open(f->tmp_, std::ios::binary | std::ios::trunc);
  if (!f->out_) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write '", f->tmp_, "': ", std::strerror(errno)));
  }
  return f;
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  out_.close();
  unlink(tmp_.c_str());
}

absl::Status AtomicFile::Commit() {
  out_.flush();
  out_.close();
  if (!out_) return absl::DataLossError(absl::StrCat("error writing '", tmp_, "'"));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot rename '", tmp_, "' to '", path_, "': ", std::strerror(errno)));
  }
  committed_ = true;
  return absl::OkStatus();
}

absl::Status WritePrivateFile(const std::string& path, const std::string& text, bool append) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_EXCL), 0600);
  const bool written = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  if (fd >= 0) close(fd);
  if (!written) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "': ", std::strerror(err)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  auto f = AtomicFile::Open(path);
  if (!f.ok()) return f.status();
  (*f)->out() << content;
  return (*f)->Commit();
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  const int rc = nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
  if (rc != 0) return absl::PermissionDeniedError(absl::StrCat("cannot remove '", path, "': ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace tally
