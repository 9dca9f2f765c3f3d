// TIFF through libtiff (common/formats/image_formats.h): the first page (IFD) unless the row's page names
// another; stripped or tiled, contiguous or planar samples, BigTIFF; 1, 8 or 16-bit unsigned integer
// samples (other sample formats are refused naming theirs). Masks: single-channel (1, 8 or 16 bits, or
// palette indices) compressed losslessly (none, LZW, deflate, PackBits, ZSTD, LZMA); a strip or tile is
// checked against the image before it is read. Python models get 16-bit values unreduced (DecodeTiffRaw).
#ifndef TALLY_COMMON_FORMATS_TIFF_H_
#define TALLY_COMMON_FORMATS_TIFF_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/image_formats.h"

namespace tally {

const ImageDecoder& TiffDecoder();

// The decoder's parts, for the fuzz targets (tests/fuzz/tiff_fuzz.cc).
absl::Status DecodeTiffImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                             int64_t max_pixels, RgbImage* out);
absl::Status DecodeTiffMask(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                            LabelMap* out);
// False (nothing done) unless the page's samples are 16-bit.
absl::StatusOr<bool> DecodeTiffRaw(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                   RawImage* out);
absl::Status TiffDimensions(const std::string& bytes, const std::string& name, int page, int* height, int* width);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_TIFF_H_
