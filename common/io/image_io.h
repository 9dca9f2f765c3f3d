// Image and mask decoding (libpng, libjpeg-turbo; TIFF, WebP and DICOM in common/io/image_formats.h)
// into reusable buffers.
//
// Images: PNG, JPEG, TIFF, WebP or DICOM (format detected from the bytes, not the extension), 8-bit
// gray, RGB or RGBA, palette and gray+alpha too; always returned as interleaved 8-bit RGB (alpha
// dropped, as PIL's convert("RGB") does). 16-bit images are reduced to their high byte, or mapped by
// a window (DecodeOptions::window; DICOM always: image_formats.h says how).
// Masks: single-channel PNG of class indices, 1/2/4/8/16-bit gray or palette (palette indices
// are the labels, as in Pascal VOC); lossless TIFF and WebP likewise. Returned as uint16 labels.
// All functions are thread-safe; each call may reuse the memory of `out`.
#ifndef TALLY_COMMON_IO_IMAGE_IO_H_
#define TALLY_COMMON_IO_IMAGE_IO_H_

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
// From the bytes' signature (TIFF: II*\0, MM\0*, BigTIFF II+\0 / MM\0+; WebP: RIFF....WEBP;
// DICOM: DICM at offset 128).
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
};

// An image's stored values where a byte does not hold them (16-bit TIFF, DICOM), as Python models
// get them (README "What a model gets"): height x width x channels samples of `dtype` ("uint8",
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
  int depth = 1;                 // Slices of a 3D volume (common/io/volume_io.h).
  std::vector<uint16_t> labels;  // depth * height * width, row-major.
  int max_label = -1;            // Largest label other than the ignore value; -1 if none.
  int64_t ignored = 0;           // Pixels equal to the ignore value.
};

// Largest value a mask label (or the ignore index) may have: 65535 (kIgnoredPixel,
// metrics/label_counts.h) is reserved for ignored pixels.
inline constexpr int kMaxMaskValue = 65534;

// A lookup table for PrepareMask from value -> label pairs (empty for no mapping).
std::vector<uint16_t> MakeLabelLut(const std::vector<std::pair<int, int>>& label_map);
// Applies a job's mask conventions in place: the label lookup table first (empty: identity), then
// pixels equal to `ignore_index` (none when it is -1) become kIgnoredPixel. Sets max_label and
// ignored.
void PrepareMask(LabelMap* mask, const std::vector<uint16_t>& label_lut, int ignore_index);

// Reads a whole regular file into `out`. NOT_FOUND names the path when it does not exist; a FIFO,
// device, socket or directory is refused before it is opened for reading (opening a FIFO would
// block forever).
absl::Status ReadFileBytes(const std::string& path, std::string* out);

// Decoders. `name` is used in error messages (usually the path). A header declaring more than
// `max_pixels` pixels fails (INVALID_ARGUMENT, naming the declared size) before pixels are allocated.
absl::Status DecodeImage(const std::string& bytes, const std::string& name, RgbImage* out,
                         int64_t max_pixels = kDefaultMaxImagePixels, const DecodeOptions& options = {});
// The stored values of a TIFF of 16-bit samples or of a DICOM image: true and `out` filled; false
// for every other image (its 8-bit values are what DecodeImage gives). Errors as DecodeImage's.
absl::StatusOr<bool> DecodeRawImage(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                    RawImage* out);
absl::Status DecodeMask(const std::string& bytes, const std::string& name, LabelMap* out,
                        int64_t max_pixels = kDefaultMaxImagePixels, int page = 0);

// JPEG signature check (FF D8 FF), and the header checks DecodeImage makes before decoding a JPEG
// (valid header, size, pixel limit, not CMYK), with the same errors; sets the declared size. For
// decoders other than libjpeg-turbo (worker/pipeline/gpu_jpeg.h), which must refuse what it refuses.
bool LooksLikeJpeg(const std::string& bytes);
absl::Status InspectJpeg(const std::string& bytes, const std::string& name, int64_t max_pixels, int* height,
                         int* width);

// The size an image declares in its header, without decoding its pixels: what a worker checks
// against its memory budget before it allocates them. INVALID_ARGUMENT for an unknown format.
absl::Status ImageDimensions(const std::string& bytes, const std::string& name, int* height, int* width,
                             int page = 0);

// The libpng decoder alone, which DecodeImage/DecodeMask fall back on for layouts the fast decoder
// leaves (interlaced, 16-bit RGB, palette images...); exactly one of `rgb` and `labels` is non-null.
// For tests and the fuzz targets (tests/fuzz), which must reach it with every input.
absl::Status DecodePngWithLibpng(const std::string& bytes, int64_t max_pixels, RgbImage* rgb, LabelMap* labels);

// Convenience: read + decode. Errors name the file and say what is wrong with it.
absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels = kDefaultMaxImagePixels,
                       const DecodeOptions& options = {});
absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels = kDefaultMaxImagePixels,
                      int page = 0);

// Describes the first pixel of a prepared mask (PrepareMask) whose label is >= num_classes and not
// kIgnoredPixel, e.g. "mask value 7 at (y=3, x=10) >= number of classes 3"; empty if none.
std::string DescribeLabelOutOfRange(const LabelMap& mask, int num_classes);
std::string DescribeLabelOutOfRange(const uint16_t* labels, int height, int width, int num_classes);

// PNG writer used by tests, benchmarks and the demo generator. `channels` 1 (gray), 3 (RGB) or
// 4 (RGBA); `bit_depth` 8 or 16 (16: data holds native-endian uint16 values).
absl::Status WritePng(const std::string& path, int height, int width, int channels, int bit_depth,
                      const void* data, int compression_level = 6);
// JPEG encoder and writer (RGB input, 4:2:0, or 4:4:4 with `full_chroma`): thumbnails, benchmarks.
absl::StatusOr<std::string> EncodeJpeg(const uint8_t* rgb, int height, int width, int quality,
                                       bool full_chroma = false);
absl::Status WriteJpeg(const std::string& path, int height, int width, const uint8_t* rgb, int quality);

}  // namespace tally

#endif  // TALLY_COMMON_IO_IMAGE_IO_H_
