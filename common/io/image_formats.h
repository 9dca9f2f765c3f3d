// The image formats beyond PNG and JPEG (README "Where your data can be"): TIFF through libtiff,
// WebP through libwebp, DICOM through DCMTK. common/io/image_io.h's DecodeImage, DecodeMask and
// ImageDimensions detect the format from the bytes and come here; these are the decoders.
//
// What a model gets (one rule for every format, so that the same pixels give the same numbers):
//   8-bit samples as they are; 16-bit samples reduced to their high byte (v >> 8, as a 16-bit PNG
//   is), unless a window is given (--window CENTRE,WIDTH), which maps them linearly to 0..255 by
//   DICOM's VOI rule (PS3.3 C.11.2.1.2.1). DICOM: the stored values times the rescale slope plus the
//   intercept, windowed by --window, else by the header's first window, else by the window that
//   spans the stored type's whole range (rescaled); MONOCHROME1 is inverted after windowing (white
//   is low). Grey images are replicated to RGB, alpha is dropped, palettes are looked up.
// Masks: single-channel TIFF (1, 8 or 16 bits, or palette indices) compressed losslessly (none, LZW,
// deflate, PackBits, ZSTD, LZMA) and lossless WebP (every pixel grey: R = G = B, the value is the
// label); JPEG-compressed TIFF, lossy WebP and DICOM masks are refused, as JPEG masks are.
// TIFF: the first page (IFD) unless options.page names another; stripped or tiled, contiguous or
// planar samples, BigTIFF; 1, 8 or 16-bit unsigned integer samples (other sample formats are
// refused naming theirs). WebP: still images only. DICOM: single-frame MONOCHROME1, MONOCHROME2
// (8-16 bits, signed or not) or RGB (8 bits), any transfer syntax DCMTK decodes (JPEG, JPEG-LS, RLE;
// not JPEG 2000). Python models get 16-bit TIFF and DICOM values unreduced (DecodeTiffRaw,
// DecodeDicomRaw: common/io/image_io.h RawImage).
// All limits are checked before pixel memory is allocated: the declared pixels against max_pixels,
// a TIFF's strip or tile against the image, a DICOM's pixel data against its dimensions.
#ifndef TALLY_COMMON_IO_IMAGE_FORMATS_H_
#define TALLY_COMMON_IO_IMAGE_FORMATS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/io/image_io.h"

namespace tally {

absl::Status DecodeTiffImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                             int64_t max_pixels, RgbImage* out);
absl::Status DecodeTiffMask(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                            LabelMap* out);
// False (nothing done) unless the page's samples are 16-bit.
absl::StatusOr<bool> DecodeTiffRaw(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                   RawImage* out);
absl::Status TiffDimensions(const std::string& bytes, const std::string& name, int page, int* height, int* width);

absl::Status DecodeWebpImage(const std::string& bytes, const std::string& name, int64_t max_pixels, RgbImage* out);
absl::Status DecodeWebpMask(const std::string& bytes, const std::string& name, int64_t max_pixels, LabelMap* out);
absl::Status WebpDimensions(const std::string& bytes, const std::string& name, int* height, int* width);

absl::Status DecodeDicomImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                              int64_t max_pixels, RgbImage* out);
absl::Status DecodeDicomRaw(const std::string& bytes, const std::string& name, int64_t max_pixels, RawImage* out);
absl::Status DicomDimensions(const std::string& bytes, const std::string& name, int* height, int* width);

}  // namespace tally

#endif  // TALLY_COMMON_IO_IMAGE_FORMATS_H_
