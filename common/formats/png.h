// PNG (common/formats/image_formats.h): the fast decoder (png_fast.h) for the common layouts, libpng
// for the rest (interlaced, 16-bit RGB, palette images...), and the PNG writer.
#ifndef TALLY_COMMON_FORMATS_PNG_H_
#define TALLY_COMMON_FORMATS_PNG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/formats/image_formats.h"

namespace tally {

const ImageDecoder& PngDecoder();

// The libpng decoder alone, which the PNG decoder falls back on for layouts the fast decoder leaves;
// exactly one of `rgb` and `labels` is non-null. For tests and the fuzz targets (tests/fuzz), which
// must reach it with every input.
absl::Status DecodePngWithLibpng(const std::string& bytes, int64_t max_pixels, RgbImage* rgb, LabelMap* labels);

// PNG writer used by tests, benchmarks and the demo generator. `channels` 1 (gray), 3 (RGB) or
// 4 (RGBA); `bit_depth` 8 or 16 (16: data holds native-endian uint16 values).
absl::Status WritePng(const std::string& path, int height, int width, int channels, int bit_depth,
                      const void* data, int compression_level = 6);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_PNG_H_
