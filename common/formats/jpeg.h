// JPEG through libjpeg-turbo (common/formats/image_formats.h): images only (a lossy mask would corrupt
// class indices), and the encoder the report thumbnails and benchmarks use.
#ifndef TALLY_COMMON_FORMATS_JPEG_H_
#define TALLY_COMMON_FORMATS_JPEG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/image_formats.h"

namespace tally {

const ImageDecoder& JpegDecoder();

// JPEG signature check (FF D8 FF), and the header checks the decoder makes before decoding (valid
// header, size, pixel limit, not CMYK), with the same errors; sets the declared size. For decoders
// other than libjpeg-turbo (worker/pipeline/gpu_jpeg.h), which must refuse what it refuses.
bool LooksLikeJpeg(const std::string& bytes);
absl::Status InspectJpeg(const std::string& bytes, const std::string& name, int64_t max_pixels, int* height,
                         int* width);

// JPEG encoder and writer (RGB input, 4:2:0, or 4:4:4 with `full_chroma`): thumbnails, benchmarks.
absl::StatusOr<std::string> EncodeJpeg(const uint8_t* rgb, int height, int width, int quality,
                                       bool full_chroma = false);
absl::Status WriteJpeg(const std::string& path, int height, int width, const uint8_t* rgb, int quality);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_JPEG_H_
