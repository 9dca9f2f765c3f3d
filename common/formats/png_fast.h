// A fast PNG decoder for the common layouts, built on libdeflate (about twice zlib's inflate speed):
// non-interlaced 8-bit gray, gray+alpha, RGB and RGBA images (to RGB8, alpha dropped), and 8-bit
// gray, 16-bit gray and 8-bit palette masks (to uint16 labels). Anything else (interlaced, other
// bit depths, palette images) returns kUnsupported and the caller falls back to libpng. CRCs of
// IHDR and IDAT and the zlib stream's Adler-32 are verified: corrupt data is an error, not garbage.
#ifndef TALLY_COMMON_FORMATS_PNG_FAST_H_
#define TALLY_COMMON_FORMATS_PNG_FAST_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

enum class PngFastResult { kOk, kUnsupported, kError, kTooLarge };

// On kError, `error` says what is wrong with the file. kTooLarge: the header declares more than
// `max_pixels` pixels; `height` and `width` hold the declared size and nothing was allocated.
PngFastResult DecodePngRgbFast(const std::string& bytes, int64_t max_pixels, int* height, int* width,
                               std::vector<uint8_t>* rgb, std::string* error);
PngFastResult DecodePngLabelsFast(const std::string& bytes, int64_t max_pixels, int* height, int* width,
                                  std::vector<uint16_t>* labels, std::string* error);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_PNG_FAST_H_
