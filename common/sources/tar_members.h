// A tar shard's members as workers read them (docs/data.md "Tar shards"). The index
// (common/sources/tar_shards.h) names each member of a row by a locator that carries the shard's
// path, the member's data offset and size; a worker reads it with one pread from the tar, or, for a
// compressed tar, from the tar decompressed once into an unlinked scratch file as far as the lease
// needs. Shards stay open in a small process-wide cache (a lease's rows are one tar's, in order).
#ifndef TALLY_COMMON_SOURCES_TAR_MEMBERS_H_
#define TALLY_COMMON_SOURCES_TAR_MEMBERS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// A member's locator, stored as the row's image/mask/prediction path. It starts with '@', which no
// resolved manifest path does (those are absolute). Reading one still opens the shard through the
// data roots (OpenRegularFile), so a forged locator reaches nothing a path could not.
std::string MemberLocator(const std::string& shard, int64_t offset, int64_t size, bool compressed,
                          const std::string& member);
bool IsMemberLocator(absl::string_view path);
struct MemberRef {
  std::string shard;
  int64_t offset = 0;
  int64_t size = 0;
  bool compressed = false;
  std::string member;
};
absl::StatusOr<MemberRef> ParseMemberLocator(absl::string_view locator);
// "<shard>:<member>" for a locator; the path itself otherwise (for messages).
std::string DisplayPath(const std::string& path);
// The member's bytes. Errors name the shard and the member.
absl::Status ReadMemberBytes(const std::string& locator, std::string* out);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_TAR_MEMBERS_H_
