// Data roots (SECURITY.md): folders whose files a client may name. With roots set, a manifest,
// model, image, mask or prediction path is used only if it resolves, symlinks followed
// (realpath), inside one of them; any other path fails with "outside the allowed data roots" and
// nothing more, whether or not the file exists. Without roots every readable path is allowed.
#ifndef TALLY_COMMON_SECURITY_DATA_ROOTS_H_
#define TALLY_COMMON_SECURITY_DATA_ROOTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tally {

inline constexpr char kOutsideDataRoots[] = "outside the allowed data roots";

class DataRoots {
 public:
  DataRoots() = default;
  // Each folder must exist; they are kept resolved (realpath). Errors name the folder.
  static absl::StatusOr<DataRoots> Create(const std::vector<std::string>& dirs);

  bool empty() const { return roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }
  // `path` (absolute, or relative to the working directory) with every symlink resolved, if it
  // lies inside a root; PERMISSION_DENIED kOutsideDataRoots otherwise. The file need not exist:
  // then its nearest existing folder is resolved and the rest may not contain "..". Without
  // roots, `path` unchanged.
  absl::StatusOr<std::string> Resolve(const std::string& path) const;

 private:
  std::vector<std::string> roots_;
};

// The roots this process enforces in OpenRegularFile (below) and for model files.
// Set once in main() before any thread starts; empty by default.
void SetProcessDataRoots(DataRoots roots);
const DataRoots& ProcessDataRoots();

// A regular file opened for reading, and its size.
struct RegularFile {
  int fd = -1;  // The caller closes it.
  int64_t size = 0;
};
// Opens `path` for reading only if it is a regular file, without ever blocking: a FIFO is checked
// (O_NONBLOCK) before anything reads it. Errors carry no path, for the caller to word: NOT_FOUND or
// PERMISSION_DENIED with strerror's text when it cannot be opened; INVALID_ARGUMENT whose message
// says what it is instead ("a directory", "a FIFO", "a socket", "a device", "not a regular file").
// With process data roots (below), a path outside them is PERMISSION_DENIED
// kOutsideDataRoots before anything else is looked at.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path);

// The largest client-named JSON file (COCO annotations, results, panoptic) read whole by default:
// LVIS's training annotations are 1.1 GB, COCO's 448 MB. tallyd's --max-json-file-size sets it
// per job (JobSpec.max_json_file_bytes), workers read with the job's.
inline constexpr int64_t kDefaultMaxJsonFileBytes = int64_t{2} << 30;

// Limits on reading a client-named file whole.
struct ClientFileLimits {
  int64_t max_bytes = kDefaultMaxJsonFileBytes;
  // When reading must have ended (a submission's deadline); InfiniteFuture: none.
  absl::Time deadline = absl::InfiniteFuture();
  // The flag that sets max_bytes, named in the error.
  std::string max_bytes_flag = "--max-json-file-size";
};
// A client-named file read whole: opened with OpenRegularFile (regular files only, never waiting on
// a FIFO, data roots enforced), refused before reading when it holds more than `max_bytes` (and when
// it grows past them while read), read in pieces with the deadline checked between them. The
// string has `padding` spare bytes of capacity after its text (simdjson reads up to 64 bytes past
// the end). Errors name `what` and the path: NOT_FOUND / PERMISSION_DENIED when it cannot be
// opened, INVALID_ARGUMENT when it is not a regular file or too large, DEADLINE_EXCEEDED.
absl::StatusOr<std::string> ReadClientFile(const std::string& what, const std::string& path,
                                           const ClientFileLimits& limits, size_t padding = 0);

// True for the error Resolve (and OpenRegularFile) return for a path outside the roots.
bool IsOutsideDataRoots(const absl::Status& status);
// "<what> '<path>': outside the allowed data roots" (PERMISSION_DENIED), for callers that name a
// file; `what` may be empty.
absl::Status OutsideDataRootsError(const std::string& what, const std::string& path);

}  // namespace tally

#endif  // TALLY_COMMON_SECURITY_DATA_ROOTS_H_
