// Small filesystem helpers shared by the three roles.
#ifndef TALLY_BASE_FILE_UTIL_H_
#define TALLY_BASE_FILE_UTIL_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tally {

// Joins `path` onto `base_dir` unless it is absolute; drops leading "./".
std::string ResolvePath(const std::string& base_dir, const std::string& path);

// `path` made absolute against the current working directory.
std::string AbsolutePath(const std::string& path);

// True for names ending in .nii or .nii.gz (case-insensitive).
bool IsNiftiPath(const std::string& path);
// A manifest `image` naming a volume's channels: NIfTI files joined by ';' (T1;T1ce;T2;FLAIR). The
// files in order when every part is a NIfTI name; else the value as one file.
std::vector<std::string> VolumeChannelFiles(const std::string& image);

// Creates `dir` and its missing parents (mkdir -p). Errors name the folder that failed.
absl::Status MakeDirs(const std::string& dir);

// The names in folder `dir` (not "." or ".."), sorted; empty when it cannot be read.
std::vector<std::string> ListDirectory(const std::string& dir);

// Removes `path` and everything under it (rm -rf); a missing path is not an error.
absl::Status RemoveTree(const std::string& path);

// PATH.tmp.HOST.PID.N: a temporary name for `path` no other writer uses, on this host or another
// sharing the folder (N counts this process's names).
std::string UniqueTemporaryPath(const std::string& path);

// A file written under a temporary name and renamed into place by Commit(), so that readers see
// the old file or the whole new one, never a part. Destroyed without Commit(), the temporary file
// is removed. The temporary name is the writer's own (UniqueTemporaryPath): writers of one path on
// several hosts sharing a folder each rename a whole file of their own.
class AtomicFile {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Open(const std::string& path);
  ~AtomicFile();
  std::ostream& out() { return out_; }
  absl::Status Commit();

 private:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(UniqueTemporaryPath(path_)) {}
  std::string path_;
  std::string tmp_;
  std::ofstream out_;
  bool committed_ = false;
};

// Secrets (tokens files): writes `text` to `path`, creating it readable and writable by its owner
// only (0600). `append` adds to an existing file; otherwise the file must be new (O_EXCL: a
// pre-existing file or link there is an error). Errors name the file.
absl::Status WritePrivateFile(const std::string& path, const std::string& text, bool append);

// The whole file (bytes as they are); NOT_FOUND naming the file when it cannot be opened.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// The whole of `content` into `path`, atomically (AtomicFile).
absl::Status WriteFileAtomically(const std::string& path, const std::string& content);

}  // namespace tally

#endif  // TALLY_BASE_FILE_UTIL_H_
