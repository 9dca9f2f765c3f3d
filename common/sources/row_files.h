// The bytes of a row's files, wherever a row source put them: a path (a manifest's, a folder's, a
// COCO file's image) or a tar shard's member (common/sources/tar_members.h MemberLocator). Files are
// opened through the data roots (common/security/data_roots.h OpenRegularFile), never followed
// into a FIFO or a device. LoadImage and LoadMask read and decode (common/formats/decode.h).
#ifndef TALLY_COMMON_SOURCES_ROW_FILES_H_
#define TALLY_COMMON_SOURCES_ROW_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/formats/image_formats.h"

namespace tally {

// Reads a whole regular file (or a tar member) into `out`. NOT_FOUND names the path when it does not
// exist; a FIFO, device, socket or directory is refused before it is opened for reading (opening a
// FIFO would block forever).
absl::Status ReadFileBytes(const std::string& path, std::string* out);

// Read + decode. Errors name the file and say what is wrong with it.
absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels = kDefaultMaxImagePixels,
                       const DecodeOptions& options = {});
absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels = kDefaultMaxImagePixels,
                      int page = 0);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_ROW_FILES_H_
