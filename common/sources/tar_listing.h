// One tar's members as their headers give them (common/sources/tar_format.h), for the index a job's
// rows are made from. Every declared size, name and count is held to a stated limit as its header is
// read (TarListOptions; SECURITY.md "Limits"): a member past one is listed with a problem that
// fails its sample, by name, and its data is never read; in a compressed tar (read front to back)
// a member too large to pass ends the listing there, saying so, rather than be decompressed. The
// reading keeps to the submission's deadline (tallyd --submit-read-timeout).
#ifndef TALLY_COMMON_SOURCES_TAR_LISTING_H_
#define TALLY_COMMON_SOURCES_TAR_LISTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/sources/tar_format.h"

namespace tally {

struct TarMember {
  std::string name;
  int64_t offset = -1;  // Where its data starts in the uncompressed tar; -1: not reachable.
  int64_t size = 0;
  bool regular = true;
  std::string kind;     // For a non-regular member: "a symbolic link to 'x'", "a directory", ...
  std::string data;     // JSON members when read.
  std::string problem;  // Why its data cannot be read ("" when it can).
  bool name_lost = false;  // Its name was over the limit: `name` is the header's short stand-in.
};
struct TarListing {
  std::vector<TarMember> members;
  bool compressed = false;
  std::string ended_early;  // Why the listing ended before the archive's end, "" when it did not.
};

// JSON members read for their fields are at most this large.
inline constexpr int64_t kMaxJsonMemberBytes = 1 << 20;

struct TarListOptions {
  bool read_json = false;                            // Read members whose extension is "json".
  int64_t max_member_bytes = kDefaultMaxMemberBytes;  // A member declaring more fails its sample.
  absl::Time deadline = absl::InfiniteFuture();       // DEADLINE_EXCEEDED past it, naming the shard.
};

// Lists a tar, plain or compressed (gzip, zstd, xz, bzip2, lz4: libarchive decompresses) from an
// open file of `file_size` bytes, or from bytes in memory. Fails only when the bytes are no tar at
// all, or past the deadline.
absl::StatusOr<TarListing> ListTarFd(int fd, const std::string& name, int64_t file_size, const TarListOptions& options);
absl::StatusOr<TarListing> ListTarBytes(absl::string_view bytes, const std::string& name,
                                        const TarListOptions& options);
// Whether the file at `path` starts as a compressed stream (false where it cannot be read): such a
// shard is read front to back only.
bool IsCompressedFile(const std::string& path);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_TAR_LISTING_H_
