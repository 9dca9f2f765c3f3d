// The one interface every image format implements (docs/formats.md "Where your data can be"), and the
// ground they share: the decoded types, the signature check, the pixel limit, the window rule and the
// mask conventions. Each format is a file of this folder (png, jpeg, tiff, webp, dicom) that includes
// this header and no other format; decode.h detects the format from the bytes and calls its decoder.
// Nothing here calls a decoder, so calls run one way: decode -> a format -> this file.
//
// What a model gets (one rule for every format, so that the same pixels give the same numbers):
//   8-bit samples as they are; 16-bit samples reduced to their high byte (v >> 8, as a 16-bit PNG
//   is), unless a window is given (--window CENTRE,WIDTH), which maps them linearly to 0..255 by
//   DICOM's VOI rule (PS3.3 C.11.2.1.2.1). DICOM: the stored values times the rescale slope plus the
//   intercept, windowed by --window, else by the header's first window, else by the window that
//   spans the stored type's whole range (rescaled); MONOCHROME1 is inverted after windowing (white
//   is low). Grey images are replicated to RGB, alpha is dropped, palettes are looked up.
// Masks: single-channel PNG of class indices (1/2/4/8/16-bit grey or palette: palette indices are the
// labels, as in Pascal VOC), single-channel TIFF compressed losslessly and lossless WebP (every pixel
// grey). JPEG masks, JPEG-compressed TIFF, lossy WebP and DICOM masks are refused.
// All limits are checked before pixel memory is allocated: the declared pixels against max_pixels.
#ifndef TALLY_COMMON_FORMATS_IMAGE_FORMATS_H_
#define TALLY_COMMON_FORMATS_IMAGE_FORMATS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/label_counts.h"

namespace tally {

inline constexpr uint16_t kIgnoreLabel = 255;

enum class ImageFormat { kUnknown, kPng, kJpeg, kTiff, kWebp, kDicom };
// From the bytes' signature (PNG: its 8-byte signature; JPEG: FF D8 FF; TIFF: II*\0, MM\0*, BigTIFF
// II+\0 / MM\0+; WebP: RIFF....WEBP; DICOM: DICM at offset 128).
ImageFormat DetectImageFormat(const std::string& bytes);
const char* ImageFormatName(ImageFormat format);

// A window (centre, width) maps value v to 0..255 by DICOM's linear VOI rule (PS3.3 C.11.2.1.2.1):
// v <= c - 0.5 - (w - 1) / 2 -> 0, v > c - 0.5 + (w - 1) / 2 -> 255, else
// ((v - (c - 0.5)) / (w - 1) + 0.5) * 255, rounded to the nearest integer. Width >= 1.
struct Window {
  double center = std::numeric_limits<double>::quiet_NaN();
  double width = std::numeric_limits<double>::quiet_NaN();
  bool given() const { return !std::isnan(center) && !std::isnan(width); }
};
uint8_t ApplyWindow(double value, const Window& window);

// What a row says about decoding its image beyond the bytes.
struct DecodeOptions {
  int page = 0;   // TIFF: the page (IFD, from 0) to read (the manifest's 'page' column).
  Window window;  // --window: 16-bit TIFF and DICOM images.
};
// A row's decode options: its 'page' column's text (empty: page 0) must be a page number
// 0..1000000; otherwise the row fails with the reason.
absl::StatusOr<DecodeOptions> RowDecodeOptions(const std::string& page, const Window& window);

// Default bound on the pixels an image or mask may declare (width x height), checked against the
// header before any pixel memory is allocated: a guard against decompression bombs (a 74-byte PNG
// can declare 60000x60000), like PIL's MAX_IMAGE_PIXELS. Jobs set their own (--max-image-pixels).
inline constexpr int64_t kDefaultMaxImagePixels = int64_t{1} << 28;

// Error text for a file whose header declares more than `max_pixels` pixels.
std::string TooManyPixels(const std::string& what, const std::string& name, int64_t height, int64_t width,
                          int64_t max_pixels);

// Releases the memory of a reusable buffer that grew past `keep_bytes` for an outlier image, so
// that one large image does not pin its memory for the rest of the process.
template <typename T>
void ShrinkIfLarger(std::vector<T>* buffer, size_t keep_bytes) {
  if (buffer->capacity() * sizeof(T) > keep_bytes) std::vector<T>().swap(*buffer);
}
// Reusable buffers larger than this are released after use (16 MiB: a 2300x2300 RGB image; staging
// buffers keep up to 4x what their batch needs, see Pipeline::Stage).
inline constexpr size_t kKeepBufferBytes = size_t{16} << 20;

struct RgbImage {
  int height = 0;
  int width = 0;
  std::vector<uint8_t> pixels;  // height * width * 3, row-major HWC.
  // Its values went through --window (16-bit TIFF, grey DICOM); false where a window given does not
  // apply (8-bit formats), so that reports can say so.
  bool windowed = false;
};

// An image's stored values where a byte does not hold them (16-bit TIFF, DICOM), as Python models
// get them (docs "What a model gets"): height x width x channels samples of `dtype` ("uint8",
// "int8", "uint16", "int16"), native byte order, row-major; `header`: what the file says about
// reading them (DICOM: rescale_slope, rescale_intercept, window_center, window_width, photometric,
// bits_stored; TIFF: photometric, bits_per_sample), for rows[i].
struct RawImage {
  std::string dtype;
  int height = 0;
  int width = 0;
  int channels = 1;
  std::vector<uint8_t> data;
  std::vector<std::pair<std::string, std::string>> header;
};

struct LabelMap {
  int height = 0;
  int width = 0;
  int depth = 1;                 // Slices of a 3D volume (common/formats/volume.h).
  std::vector<uint16_t> labels;  // depth * height * width, row-major.
  int max_label = -1;            // Largest label other than the ignore value; -1 if none.
  int64_t ignored = 0;           // Pixels equal to the ignore value.
};

// Largest value a mask label (or the ignore index) may have: 65535 (kIgnoredPixel,
// metrics/label_counts.h) is reserved for ignored pixels.
inline constexpr int kMaxMaskValue = 65534;

// The largest label of `n` labels other than `ignore` (-1 if none), and in `ignored` how many equal it.
int ScanMaxLabel(const uint16_t* labels, size_t n, int ignore, int64_t* ignored);
// A lookup table for PrepareMask from value -> label pairs (empty for no mapping).
std::vector<uint16_t> MakeLabelLut(const std::vector<std::pair<int, int>>& label_map);
// Applies a job's mask conventions in place: the label lookup table first (empty: identity), then
// pixels equal to `ignore_index` (none when it is -1) become kIgnoredPixel. Sets max_label and
// ignored.
void PrepareMask(LabelMap* mask, const std::vector<uint16_t>& label_lut, int ignore_index);
// Describes the first pixel of a prepared mask (PrepareMask) whose label is >= num_classes and not
// kIgnoredPixel, e.g. "mask value 7 at (y=3, x=10) >= number of classes 3"; empty if none.
std::string DescribeLabelOutOfRange(const LabelMap& mask, int num_classes);
std::string DescribeLabelOutOfRange(const uint16_t* labels, int height, int width, int num_classes);

// What each format implements. `name` is used in error messages (usually the path); every error is
// INVALID_ARGUMENT and names the file. A header declaring more than `max_pixels` pixels fails before
// pixels are allocated. Decoders are thread-safe and may reuse the memory of `out`.
struct ImageDecoder {
  ImageFormat format;
  // The size the header declares, without decoding pixels (`page`: TIFF's page; others ignore it).
  absl::Status (*dimensions)(const std::string& bytes, const std::string& name, int page, int* height, int* width);
  absl::Status (*decode_image)(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                               int64_t max_pixels, RgbImage* out);
  // Label maps of class indices; null where the format cannot hold them exactly (`no_masks` says why).
  absl::Status (*decode_mask)(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                              LabelMap* out);
  const char* no_masks;
  // The stored values where a byte does not hold them: true and `out` filled; false for an image
  // whose values DecodeImage gives as they are. Null where every image's values fit a byte.
  absl::StatusOr<bool> (*decode_raw)(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                     RawImage* out);
};

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_IMAGE_FORMATS_H_
