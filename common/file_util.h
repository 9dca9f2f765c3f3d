// Small filesystem helpers shared by the three roles.
#ifndef TALLY_COMMON_FILE_UTIL_H_
#define TALLY_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"

namespace tally {

// Joins `path` onto `base_dir` unless it is absolute; drops leading "./".
std::string ResolvePath(const std::string& base_dir, const std::string& path);

// `path` made absolute against the current working directory.
std::string AbsolutePath(const std::string& path);

// Creates `dir` and its missing parents (mkdir -p). Errors name the folder that failed.
absl::Status MakeDirs(const std::string& dir);

// Removes `path` and everything under it (rm -rf); a missing path is not an error.
absl::Status RemoveTree(const std::string& path);

}  // namespace tally

#endif  // TALLY_COMMON_FILE_UTIL_H_
