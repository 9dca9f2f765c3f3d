// The tar format as Tally reads it, with every declared size checked against a stated limit before
// anything is read, allocated or skipped (SECURITY.md "Limits"): POSIX ustar, GNU (long names
// 'L'/'K', base-256 sizes) and pax ('x' records: path, size) headers. Sparse members, GNU
// multi-volume and other special entries are listed but never read. One 512-byte header at a
// time from a TarStream: a plain file (members skipped by seeking) or a decompressed stream.
//
// The same header parse checks, when a worker reads a member, that the 512 bytes before the
// member's data are its own header (MemberHeaderMatches): a shard repacked in another order under
// the same names is caught there even where its size and time did not change.
#ifndef TALLY_COMMON_SOURCES_TAR_FORMAT_H_
#define TALLY_COMMON_SOURCES_TAR_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tally {

inline constexpr int64_t kTarBlock = 512;
// A member's name (a GNU long name or a pax path) longer than this fails its sample, named.
inline constexpr int64_t kMaxMemberNameBytes = 4096;
// A pax extended header longer than this (or with more records) fails the member it describes.
inline constexpr int64_t kMaxPaxHeaderBytes = 64 << 10;
inline constexpr int kMaxPaxRecords = 256;
// Default limit on one member's declared size: a larger one fails its sample when its header is
// read (a compressed tar's index stops there: its later samples cannot be reached without
// decompressing it). Workers also hold a member to their memory budget before reading it.
inline constexpr int64_t kDefaultMaxMemberBytes = int64_t{1} << 30;
// Members of one shard past this end its index (a million samples a shard is far more than any
// convention writes; 512 bytes of header each bound them in a plain tar, nothing in a compressed one).
inline constexpr int64_t kMaxMembersPerShard = 4'000'000;

// One header block's fields, parsed. `valid` is false when the block is not a tar header (its
// checksum does not match); `zero` when it is all zero bytes (the archive's end).
struct TarHeader {
  bool valid = false;
  bool zero = false;
  char type = '0';
  std::string name;      // ustar prefix + "/" + name, or the name field alone (GNU, v7).
  std::string linkname;
  int64_t size = -1;     // -1: the size field is not a number.
};
TarHeader ParseTarHeader(const char* block);

// A tar's bytes, uncompressed, front to back.
class TarStream {
 public:
  virtual ~TarStream() = default;
  // Reads up to `n` bytes: the count (fewer only at the end), -1 on an error (error()).
  virtual int64_t Read(char* out, int64_t n) = 0;
  // Skips `n` bytes: false when the stream ends first or fails.
  virtual bool Skip(int64_t n) = 0;
  virtual int64_t position() const = 0;
  // Whether Skip seeks (a plain file) rather than reads through (a decompressed stream).
  virtual bool seekable() const = 0;
  virtual std::string error() const = 0;
};

// Whether the block before a member's data (`header`, 512 bytes) is that member's own: a valid
// header of a regular member, its size `size`, its name `member` (or, where the name is longer than
// the header holds, the header's name a part of it). On a mismatch, `why` says what differs.
bool MemberHeaderMatches(const char* header, const std::string& member, int64_t size, std::string* why);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_TAR_FORMAT_H_
