// The bytes of a row's files, wherever a row source put them: a path (a manifest's, a folder's, a
// COCO file's image) or a tar shard's member (common/sources/tar_members.h MemberLocator). Files are
// opened through the data roots (common/security/data_roots.h OpenRegularFile), never followed
// into a FIFO or a device, and held to the process's input limit before anything is allocated.
// LoadImage and LoadMask read and decode (common/formats/decode.h).
//
// Every read can say what it read (FileFacts): the size, the modification time and the XXH3
// 128-bit digest of the bytes (XXH128, printed as `xxhsum -H2` prints it: 32 hex digits). XXH3
// rather than a cryptographic hash: it runs at memory speed (tens of GB/s a core), so digesting
// every input costs nothing beside decoding it, and 128 bits make an accidental collision among
// the rows of any dataset vanishingly unlikely; it is no defence against someone forging inputs
// (data roots and tokens are: SECURITY.md). A file that changes while it is read fails its row.
#ifndef TALLY_COMMON_SOURCES_ROW_FILES_H_
#define TALLY_COMMON_SOURCES_ROW_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/image_formats.h"

namespace tally {

// What a read found: size in bytes, modification time (a tar member: its shard's), and the digest.
struct FileFacts {
  int64_t size = -1;
  int64_t mtime_ns = 0;
  std::string xxh128;  // 16 bytes, big-endian as XXH128's canonical form; Hex128 prints it.
};
// The XXH128 of `bytes` (16 bytes), and its 32-digit hex form as xxhsum prints it.
std::string Xxh128(absl::string_view bytes);
std::string Hex128(absl::string_view digest);

// The most bytes one input file may have in this process (its memory budget's share; default 4
// GiB): a larger file or member fails its row before it is read.
void SetInputFileLimit(int64_t bytes);
int64_t InputFileLimit();

// Reads a whole regular file (or a tar member) into `out`; with `facts`, says what it read. NOT_FOUND
// names the path when it does not exist; a FIFO, device, socket or directory is refused before it is
// opened for reading (opening a FIFO would block forever); a file past the input limit is refused
// before it is read (RESOURCE_EXHAUSTED); one whose size or time changed while it was read fails
// (DATA_LOSS).
absl::Status ReadFileBytes(const std::string& path, std::string* out, FileFacts* facts = nullptr);
// Reads a file front to back without keeping it, for its facts (volumes, which their decoder reads
// itself).
absl::StatusOr<FileFacts> DigestFile(const std::string& path);

// Read + decode. Errors name the file and say what is wrong with it.
absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels = kDefaultMaxImagePixels,
                       const DecodeOptions& options = {}, FileFacts* facts = nullptr);
absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels = kDefaultMaxImagePixels,
                      int page = 0, FileFacts* facts = nullptr);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_ROW_FILES_H_
