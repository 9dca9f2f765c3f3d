// Decoding any image or mask Tally reads (docs/data.md "Formats"): the format is detected from the
// bytes, not the extension (common/formats/image_formats.h DetectImageFormat), and its decoder is
// called (png.h, jpeg.h, tiff.h, webp.h, dicom.h; image_formats.h says what every one returns).
//
// Images: PNG, JPEG, TIFF, WebP or DICOM, 8-bit gray, RGB or RGBA, palette and gray+alpha too;
// always returned as interleaved 8-bit RGB (alpha dropped, as PIL's convert("RGB") does). 16-bit
// images are reduced to their high byte, or mapped by a window (DecodeOptions::window; DICOM always).
// Masks: PNG, lossless TIFF and WebP label maps, returned as uint16 labels.
// All functions are thread-safe; each call may reuse the memory of `out`.
#ifndef TALLY_COMMON_FORMATS_DECODE_H_
#define TALLY_COMMON_FORMATS_DECODE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/image_formats.h"

namespace tally {

// `name` is used in error messages (usually the path). A header declaring more than `max_pixels`
// pixels fails (INVALID_ARGUMENT, naming the declared size) before pixels are allocated.
absl::Status DecodeImage(const std::string& bytes, const std::string& name, RgbImage* out,
                         int64_t max_pixels = kDefaultMaxImagePixels, const DecodeOptions& options = {});
// The stored values of a TIFF of 16-bit samples or of a DICOM image: true and `out` filled; false
// for every other image (its 8-bit values are what DecodeImage gives). Errors as DecodeImage's.
absl::StatusOr<bool> DecodeRawImage(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                    RawImage* out);
// Sets max_label (the ignore value kIgnoreLabel aside) and depth 1.
absl::Status DecodeMask(const std::string& bytes, const std::string& name, LabelMap* out,
                        int64_t max_pixels = kDefaultMaxImagePixels, int page = 0);

// The size an image declares in its header, without decoding its pixels: what a worker checks
// against its memory budget before it allocates them. INVALID_ARGUMENT for an unknown format.
absl::Status ImageDimensions(const std::string& bytes, const std::string& name, int* height, int* width,
                             int page = 0);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_DECODE_H_
