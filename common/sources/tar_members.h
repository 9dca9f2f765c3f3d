// A tar shard's members as workers read them (docs/data.md "Tar shards"). The index
// (common/sources/tar_shards.h) names each member of a row by a locator that carries the shard's
// path and identity (size and modification time, as tallyd saw them at submission), the member's
// data offset and size: a worker reads it with one pread from the tar, or, for a compressed tar,
// from the tar decompressed once into an unlinked scratch file as far as the lease needs.
//
// Nothing read is used before it is proved to be the row's own: the shard must still be the one
// indexed (else every read fails: "shard X changed after the job was submitted"; Tally does not
// re-index a changed shard, whose samples may have moved between rows), and the 512 bytes before
// the member's data must be the member's own tar header (name and size: tar_format.h
// MemberHeaderMatches), which also catches a shard repacked under the same size and time. A declared
// size past the member limit or the process's input limit fails the row before anything is read.
//
// Scratch (compressed tars): decompressed front to back into an unlinked file in $TMPDIR; any failed
// or short write ("scratch full: needed N bytes, M free in DIR") or a scratch limit exceeded fails
// the rows that need it and drops the copy, which is never used again. All the process's scratch
// files together stay under the scratch limit (SetScratchLimit; default a quarter of the free space
// of $TMPDIR when the first is made); CloseShards() closes every open shard (a job's end).
#ifndef TALLY_COMMON_SOURCES_TAR_MEMBERS_H_
#define TALLY_COMMON_SOURCES_TAR_MEMBERS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// What a shard was when it was indexed. size -1: unknown (locators of earlier versions).
struct ShardIdentity {
  int64_t size = -1;
  int64_t mtime_ns = 0;
};
// The identity of the open file `fd`.
ShardIdentity IdentityOf(int fd);

// A member's locator, stored as the row's image/mask/prediction path. It starts with '@', which no
// resolved manifest path does (those are absolute). Reading one still opens the shard through the
// data roots (OpenRegularFile), so a forged locator reaches nothing a path could not.
std::string MemberLocator(const std::string& shard, int64_t offset, int64_t size, bool compressed,
                          const std::string& member, const ShardIdentity& identity = {});
bool IsMemberLocator(absl::string_view path);
struct MemberRef {
  std::string shard;
  int64_t offset = 0;
  int64_t size = 0;
  bool compressed = false;
  std::string member;
  ShardIdentity identity;
};
absl::StatusOr<MemberRef> ParseMemberLocator(absl::string_view locator);
// "<shard>:<member>" for a locator; the path itself otherwise (for messages).
std::string DisplayPath(const std::string& path);

// The member's bytes, checked as above; `max_bytes` (the caller's budget) bounds its declared size
// besides the member limit. Errors name the shard and the member.
absl::Status ReadMemberBytes(const std::string& locator, std::string* out, int64_t max_bytes = -1);

// The limit on the scratch bytes of all compressed shards open in this process (0: the default).
void SetScratchLimit(int64_t bytes);
// Closes every shard this process holds open and removes their scratch copies.
void CloseShards();
// Shards and scratch bytes held now (tests).
int64_t OpenShardCount();
int64_t ScratchBytesHeld();

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_TAR_MEMBERS_H_
