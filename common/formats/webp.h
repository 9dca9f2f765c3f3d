// WebP through libwebp (common/formats/image_formats.h): still images; masks only from lossless files
// whose every pixel is grey (R = G = B: the value is the label).
#ifndef TALLY_COMMON_FORMATS_WEBP_H_
#define TALLY_COMMON_FORMATS_WEBP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/image_formats.h"

namespace tally {

const ImageDecoder& WebpDecoder();

// The decoder's parts, for the fuzz targets (tests/fuzz/webp_fuzz.cc).
absl::Status DecodeWebpImage(const std::string& bytes, const std::string& name, int64_t max_pixels, RgbImage* out);
absl::Status DecodeWebpMask(const std::string& bytes, const std::string& name, int64_t max_pixels, LabelMap* out);
absl::Status WebpDimensions(const std::string& bytes, const std::string& name, int* height, int* width);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_WEBP_H_
