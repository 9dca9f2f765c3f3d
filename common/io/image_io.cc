#include "common/io/image_io.h"

#include <limits>

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/security/data_roots.h"
#include "common/base/file_util.h"
#include "common/io/image_formats.h"
#include "common/io/tar_shards.h"
#include "common/io/png_fast.h"

namespace tally {
namespace {

constexpr const char* kFormats = "PNG, JPEG, TIFF, WebP or DICOM";

bool IsPng(const std::string& b) {
  return b.size() >= 8 && png_sig_cmp(reinterpret_cast<png_const_bytep>(b.data()), 0, 8) == 0;
}
bool IsJpeg(const std::string& b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8 &&
         static_cast<uint8_t>(b[2]) == 0xFF;
}

// libpng reports errors through longjmp; the message is kept here and the decode returns it.
struct PngReadState {
  const std::string* bytes = nullptr;
  size_t offset = 0;
  char message[256] = {0};
};

void PngError(png_structp png, png_const_charp msg) {
  auto* state = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", msg);
  png_longjmp(png, 1);
}
void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep data, png_size_t length) {
  auto* state = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (state->offset + length > state->bytes->size()) {
    png_error(png, "file is truncated");
    return;
  }
  std::memcpy(data, state->bytes->data() + state->offset, length);
  state->offset += length;
}

enum class PngTarget { kRgb8, kLabels };

// DecodePngRaw's conversions: labels keep their values (packed indices unpacked, 16-bit to native
// order; only gray or palette images are masks); images become RGB8. png_error()s (longjmp) on a
// colour type a mask cannot have, so it holds no object with a destructor.
void SetPngTransforms(png_structp png, png_infop info, PngTarget target, int color, int depth, char* why,
                      size_t why_size) {
  if (target == PngTarget::kLabels) {
    if (color != PNG_COLOR_TYPE_GRAY && color != PNG_COLOR_TYPE_PALETTE) {
      std::snprintf(why, why_size,
                    "mask must be a single-channel PNG (gray or palette) of class indices, got %s",
                    color == PNG_COLOR_TYPE_RGB        ? "RGB"
                    : color == PNG_COLOR_TYPE_RGBA     ? "RGBA"
                    : color == PNG_COLOR_TYPE_GRAY_ALPHA ? "gray+alpha"
                                                       : "an unknown colour type");
      png_error(png, why);
    }
    if (depth < 8) png_set_packing(png);  // 1/2/4-bit indices -> one byte each, values kept.
    if (depth == 16) png_set_swap(png);   // Big-endian file -> native uint16.
  } else {
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (depth == 16) png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);
  }
}

// Reads the pixels into `rgb` or `labels` (8-bit indices through `rgb` as scratch). png_error()s on
// an unexpected row size; holds no object with a destructor.
void ReadPngPixels(png_structp png, PngTarget target, int depth, png_uint_32 h, png_uint_32 w, size_t rowbytes,
                   std::vector<png_bytep>* rows_out, std::vector<uint8_t>* rgb, std::vector<uint16_t>* labels) {
  std::vector<png_bytep>& rows = *rows_out;
  if (target == PngTarget::kRgb8) {
    if (rowbytes != static_cast<size_t>(w) * 3) png_error(png, "unexpected row size after RGB conversion");
    rgb->resize(static_cast<size_t>(h) * w * 3);
    rows.resize(h);
    for (png_uint_32 y = 0; y < h; ++y) rows[y] = rgb->data() + static_cast<size_t>(y) * w * 3;
    png_read_image(png, rows.data());
  } else if (depth == 16) {
    labels->resize(static_cast<size_t>(h) * w);
    rows.resize(h);
    for (png_uint_32 y = 0; y < h; ++y) {
      rows[y] = reinterpret_cast<png_bytep>(labels->data() + static_cast<size_t>(y) * w);
    }
    png_read_image(png, rows.data());
  } else {
    // 8-bit (or packed) indices: read into the upper half of the label buffer, then widen.
    labels->resize(static_cast<size_t>(h) * w);
    std::vector<uint8_t>& tmp = *rgb;
    tmp.resize(static_cast<size_t>(h) * w);
    rows.resize(h);
    for (png_uint_32 y = 0; y < h; ++y) rows[y] = tmp.data() + static_cast<size_t>(y) * w;
    png_read_image(png, rows.data());
    for (size_t i = 0; i < tmp.size(); ++i) (*labels)[i] = tmp[i];
  }
}

// Decodes a PNG into either RGB8 (`rgb`) or uint16 labels (`labels`). Returns false and fills
// `err` on failure. Kept free of objects with destructors between setjmp and longjmp.
// A header declaring more than `max_pixels` pixels sets `*too_large` (with the declared size in
// `height` and `width`) and returns false before any pixel memory is allocated.
bool DecodePngRaw(const std::string& bytes, PngTarget target, int64_t max_pixels, int* height, int* width,
                  std::vector<uint8_t>* rgb, std::vector<uint16_t>* labels, std::string* err, bool* too_large) {
  PngReadState state;
  state.bytes = &bytes;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, PngError, PngWarning);
  if (png == nullptr) {
    *err = "out of memory";
    return false;
  }
  png_infop info = png_create_info_struct(png);
#ifdef TALLY_FUZZING
  // As OSS-Fuzz's libpng target: mutated chunks and zlib streams reach the decoder.
  png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
#ifdef PNG_IGNORE_ADLER32
  png_set_option(png, PNG_IGNORE_ADLER32, PNG_OPTION_ON);
#endif
#endif
  std::vector<png_bytep> rows;
  char why[200] = {0};
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    *err = state.message[0] ? state.message : "corrupt PNG";
    return false;
  }
  png_set_read_fn(png, &state, PngRead);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info);
  const png_uint_32 h = png_get_image_height(png, info);
  const int depth = png_get_bit_depth(png, info);
  const int color = png_get_color_type(png, info);
  if (static_cast<int64_t>(w) * h > max_pixels) {
    *height = static_cast<int>(h);
    *width = static_cast<int>(w);
    *too_large = true;
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  SetPngTransforms(png, info, target, color, depth, why, sizeof(why));
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  *height = static_cast<int>(h);
  *width = static_cast<int>(w);
  ReadPngPixels(png, target, depth, h, w, rowbytes, &rows, rgb, labels);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};

// One TurboJPEG handle per thread. After a failed decode a handle is left in a state where the
// next header read "succeeds" with a 0x0 image, so a failure replaces it.
std::unique_ptr<void, TjDeleter>& ThreadDecompressorSlot() {
  thread_local std::unique_ptr<void, TjDeleter> handle;
  return handle;
}

tjhandle ThreadDecompressor() {
  auto& slot = ThreadDecompressorSlot();
  if (!slot) slot.reset(tjInitDecompress());
  return slot.get();
}

absl::Status JpegError(tjhandle tj, const std::string& name) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not a valid JPEG: ", tjGetErrorStr2(tj)));
  ThreadDecompressorSlot().reset();
  return s;
}

}  // namespace

ImageFormat DetectImageFormat(const std::string& b) {
  if (IsPng(b)) return ImageFormat::kPng;
  if (IsJpeg(b)) return ImageFormat::kJpeg;
  if (b.size() >= 4 && (b.compare(0, 4, "II*\0", 4) == 0 || b.compare(0, 4, "MM\0*", 4) == 0 ||
                        b.compare(0, 4, "II+\0", 4) == 0 || b.compare(0, 4, "MM\0+", 4) == 0)) {
    return ImageFormat::kTiff;
  }
  if (b.size() >= 12 && b.compare(0, 4, "RIFF") == 0 && b.compare(8, 4, "WEBP") == 0) return ImageFormat::kWebp;
  if (b.size() >= 132 && b.compare(128, 4, "DICM") == 0) return ImageFormat::kDicom;
  return ImageFormat::kUnknown;
}

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kTiff: return "TIFF";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kDicom: return "DICOM";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

absl::StatusOr<DecodeOptions> RowDecodeOptions(const std::string& text, const Window& window) {
  DecodeOptions o;
  o.window = window;
  if (text.empty()) return o;
  if (!absl::SimpleAtoi(text, &o.page) || o.page < 0 || o.page > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("column 'page': '", text.substr(0, 40),
                                                   "' is not a page number (0 for a TIFF's first page)"));
  }
  return o;
}

uint8_t ApplyWindow(double v, const Window& w) {
  const double c = w.center - 0.5, half = (w.width - 1) / 2;
  if (!(v > c - half)) return 0;  // NaN too.
  if (v > c + half) return 255;
  const double y = ((v - c) / (w.width - 1) + 0.5) * 255;
  return static_cast<uint8_t>(std::clamp(std::lround(y), 0L, 255L));
}

absl::Status ReadFileBytes(const std::string& path, std::string* out) {
  if (IsMemberLocator(path)) return ReadMemberBytes(path, out);  // A tar shard's member.
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("", path);
  if (absl::IsInvalidArgument(file.status())) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is ", file.status().message(), ", not a regular file"));
  }
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot open '", path, "': ", file.status().message()));
  }
  const int fd = file->fd;
  out->resize(static_cast<size_t>(file->size));
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = read(fd, out->data() + done, out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return absl::DataLossError(absl::StrCat("error reading '", path, "': ", n == 0 ? "short read" : std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

std::string TooManyPixels(const std::string& what, const std::string& name, int64_t height, int64_t width,
                          int64_t max_pixels) {
  return absl::StrCat(what, " '", name, "' declares ", height, "x", width, " pixels (", height * width,
                      "), more than the limit of ", max_pixels,
                      " (--max-image-pixels; a guard against decompression bombs)");
}

bool LooksLikeJpeg(const std::string& bytes) { return IsJpeg(bytes); }

absl::Status InspectJpeg(const std::string& bytes, const std::string& name, int64_t max_pixels, int* height,
                         int* width) {
  tjhandle tj = ThreadDecompressor();
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  if (tjDecompressHeader3(tj, data, bytes.size(), &w, &h, &subsamp, &colorspace) != 0) return JpegError(tj, name);
  if (w <= 0 || h <= 0) {
    ThreadDecompressorSlot().reset();
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a JPEG of size ", h, "x", w));
  }
  if (static_cast<int64_t>(w) * h > max_pixels) {
    return absl::InvalidArgumentError(TooManyPixels("image", name, h, w, max_pixels));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a CMYK JPEG; convert it to RGB"));
  }
  *height = h;
  *width = w;
  return absl::OkStatus();
}

absl::Status ImageDimensions(const std::string& bytes, const std::string& name, int* height, int* width, int page) {
  if (IsPng(bytes)) {
    // The IHDR chunk comes first: its width and height, big-endian, at bytes 16 and 20.
    if (bytes.size() < 24 || bytes.compare(12, 4, "IHDR") != 0) {
      return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not a valid PNG: no IHDR chunk first"));
    }
    auto be32 = [&](size_t at) {
      return (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at])) << 24) |
             (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 1])) << 16) |
             (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 2])) << 8) |
             static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 3]));
    };
    const uint32_t w = be32(16), h = be32(20);
    if (w == 0 || h == 0 || w > (1u << 30) || h > (1u << 30)) {
      return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a PNG of size ", h, "x", w));
    }
    *height = static_cast<int>(h);
    *width = static_cast<int>(w);
    return absl::OkStatus();
  }
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kJpeg: return InspectJpeg(bytes, name, std::numeric_limits<int64_t>::max(), height, width);
    case ImageFormat::kTiff: return TiffDimensions(bytes, name, page, height, width);
    case ImageFormat::kWebp: return WebpDimensions(bytes, name, height, width);
    case ImageFormat::kDicom: return DicomDimensions(bytes, name, height, width);
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not an image Tally reads (", kFormats, ")"));
}

absl::StatusOr<bool> DecodeRawImage(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                    RawImage* out) {
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kTiff: return DecodeTiffRaw(bytes, name, page, max_pixels, out);
    case ImageFormat::kDicom: {
      absl::Status s = DecodeDicomRaw(bytes, name, max_pixels, out);
      if (!s.ok()) return s;
      return true;
    }
    default: return false;
  }
}

absl::Status DecodeImage(const std::string& bytes, const std::string& name, RgbImage* out, int64_t max_pixels,
                         const DecodeOptions& options) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is empty (0 bytes)"));
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kTiff: return DecodeTiffImage(bytes, name, options, max_pixels, out);
    case ImageFormat::kWebp: return DecodeWebpImage(bytes, name, max_pixels, out);
    case ImageFormat::kDicom: return DecodeDicomImage(bytes, name, options, max_pixels, out);
    default: break;
  }
  if (IsPng(bytes)) {
    std::string err;
    int h = 0, w = 0;
    switch (DecodePngRgbFast(bytes, max_pixels, &h, &w, &out->pixels, &err)) {
      case PngFastResult::kOk:
        out->height = h;
        out->width = w;
        return absl::OkStatus();
      case PngFastResult::kError:
        return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not a valid PNG: ", err));
      case PngFastResult::kTooLarge:
        return absl::InvalidArgumentError(TooManyPixels("image", name, h, w, max_pixels));
      case PngFastResult::kUnsupported:
        break;  // Interlaced, palette, 16-bit...: libpng.
    }
    bool too_large = false;
    if (!DecodePngRaw(bytes, PngTarget::kRgb8, max_pixels, &h, &w, &out->pixels, nullptr, &err, &too_large)) {
      if (too_large) return absl::InvalidArgumentError(TooManyPixels("image", name, h, w, max_pixels));
      return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not a valid PNG: ", err));
    }
    out->height = h;
    out->width = w;
    return absl::OkStatus();
  }
  if (IsJpeg(bytes)) {
    int w = 0, h = 0;
    absl::Status header = InspectJpeg(bytes, name, max_pixels, &h, &w);
    if (!header.ok()) return header;
    tjhandle tj = ThreadDecompressor();
    auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
    out->height = h;
    out->width = w;
    out->pixels.resize(static_cast<size_t>(h) * w * 3);
    // Warnings (a truncated file, corrupt data) fail too: the decoded pixels would be wrong.
    if (tjDecompress2(tj, data, bytes.size(), out->pixels.data(), w, 0, h, TJPF_RGB, 0) != 0) {
      return JpegError(tj, name);
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("image '", name, "' is not an image Tally reads (unrecognised file signature; ", kFormats, ")"));
}

absl::Status DecodePngWithLibpng(const std::string& bytes, int64_t max_pixels, RgbImage* rgb, LabelMap* labels) {
  std::vector<uint8_t> scratch;
  std::string err;
  bool too_large = false;
  int h = 0, w = 0;
  const bool ok = rgb != nullptr
                      ? DecodePngRaw(bytes, PngTarget::kRgb8, max_pixels, &h, &w, &rgb->pixels, nullptr, &err, &too_large)
                      : DecodePngRaw(bytes, PngTarget::kLabels, max_pixels, &h, &w, &scratch, &labels->labels, &err,
                                     &too_large);
  if (too_large) return absl::InvalidArgumentError(TooManyPixels("png", "input", h, w, max_pixels));
  if (!ok) return absl::InvalidArgumentError(err);
  if (rgb != nullptr) {
    rgb->height = h;
    rgb->width = w;
  } else {
    labels->height = h;
    labels->width = w;
  }
  return absl::OkStatus();
}

namespace {
// One pass over a label map: the largest label other than `ignore` (-1 if there is none) and the
// number of pixels equal to `ignore`; with kMark those pixels become kIgnoredPixel. In blocks of a
// fixed 64 labels, compared as int: a loop GCC vectorises even under its -O2 cost model (the plain
// loops this replaces ran scalar and cost a quarter of a JPEG row's decoding).
template <bool kMark>
int ScanLabels(uint16_t* labels, size_t n, int ignore, int64_t* ignored) {
  constexpr size_t kBlock = 64;
  int max_label = -1;
  int64_t count = 0;
  auto one = [ignore, &max_label](uint16_t* p) {
    const int v = *p;
    const bool ignored_here = v == ignore;
    if (kMark) *p = ignored_here ? kIgnoredPixel : static_cast<uint16_t>(v);
    max_label = std::max(max_label, ignored_here ? -1 : v);
    return ignored_here ? 1 : 0;
  };
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int block = 0;
    for (size_t k = 0; k < kBlock; ++k) block += one(labels + i + k);
    count += block;
  }
  for (; i < n; ++i) count += one(labels + i);
  *ignored = count;
  return max_label;
}
}  // namespace

absl::Status DecodeMask(const std::string& bytes, const std::string& name, LabelMap* out, int64_t max_pixels,
                        int page) {
  out->depth = 1;
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat("mask '", name, "' is empty (0 bytes)"));
  const ImageFormat format = DetectImageFormat(bytes);
  if (format == ImageFormat::kTiff || format == ImageFormat::kWebp) {
    absl::Status s = format == ImageFormat::kTiff ? DecodeTiffMask(bytes, name, page, max_pixels, out)
                                                  : DecodeWebpMask(bytes, name, max_pixels, out);
    if (!s.ok()) return s;
    int64_t ignored = 0;
    out->max_label = ScanLabels<false>(out->labels.data(), out->labels.size(), kIgnoreLabel, &ignored);
    return absl::OkStatus();
  }
  if (format != ImageFormat::kPng) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask '", name, "' is ",
        format == ImageFormat::kJpeg    ? "a JPEG, which is lossy and would corrupt class indices"
        : format == ImageFormat::kDicom ? "a DICOM image, not a label map"
                                        : "not a PNG, TIFF or WebP",
        "; masks must be single-channel PNG, lossless TIFF or lossless WebP files of class indices"));
  }
  std::string err;
  thread_local std::vector<uint8_t> scratch;
  int h = 0, w = 0;
  const PngFastResult fast = DecodePngLabelsFast(bytes, max_pixels, &h, &w, &out->labels, &err);
  if (fast == PngFastResult::kError) return absl::InvalidArgumentError(absl::StrCat("mask '", name, "': ", err));
  bool too_large = fast == PngFastResult::kTooLarge;
  if (fast == PngFastResult::kUnsupported &&
      !DecodePngRaw(bytes, PngTarget::kLabels, max_pixels, &h, &w, &scratch, &out->labels, &err, &too_large)) {
    ShrinkIfLarger(&scratch, kKeepBufferBytes);
    if (too_large) return absl::InvalidArgumentError(TooManyPixels("mask", name, h, w, max_pixels));
    return absl::InvalidArgumentError(absl::StrCat("mask '", name, "': ", err));
  }
  ShrinkIfLarger(&scratch, kKeepBufferBytes);
  if (too_large) return absl::InvalidArgumentError(TooManyPixels("mask", name, h, w, max_pixels));
  out->height = h;
  out->width = w;
  int64_t ignored = 0;
  out->max_label = ScanLabels<false>(out->labels.data(), out->labels.size(), kIgnoreLabel, &ignored);
  return absl::OkStatus();
}

namespace {
// Reads `path` into a per-thread buffer (released again after an outlier) and decodes it. Read
// errors are prefixed with `what` ("image: cannot open ...").
template <typename DecodeFn>
absl::Status ReadAndDecode(const char* what, const std::string& path, DecodeFn decode) {
  thread_local std::string bytes;
  absl::Status s = ReadFileBytes(path, &bytes);
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  } else {
    s = decode(bytes);
  }
  if (bytes.capacity() > kKeepBufferBytes) std::string().swap(bytes);
  return s;
}
}  // namespace

absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels, const DecodeOptions& options) {
  return ReadAndDecode("image", path, [&](const std::string& bytes) {
    return DecodeImage(bytes, DisplayPath(path), out, max_pixels, options);
  });
}

absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels, int page) {
  return ReadAndDecode("mask", path,
                       [&](const std::string& bytes) { return DecodeMask(bytes, DisplayPath(path), out, max_pixels, page); });
}

std::string DescribeLabelOutOfRange(const uint16_t* labels, int height, int width, int num_classes) {
  const size_t n = static_cast<size_t>(height) * width;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t v = labels[i];
    if (v != kIgnoredPixel && v >= num_classes) {
      return absl::StrCat("mask value ", v, " at (y=", i / width, ", x=", i % width, ") >= number of classes ",
                          num_classes, " (values are labels after --label-map; the ignore value is set by "
                          "--ignore-index)");
    }
  }
  return "";
}

std::vector<uint16_t> MakeLabelLut(const std::vector<std::pair<int, int>>& label_map) {
  std::vector<uint16_t> lut;
  if (label_map.empty()) return lut;
  lut.resize(65536);
  for (size_t v = 0; v < lut.size(); ++v) lut[v] = static_cast<uint16_t>(v);
  for (const auto& [from, to] : label_map) lut[from] = static_cast<uint16_t>(to);
  return lut;
}

void PrepareMask(LabelMap* mask, const std::vector<uint16_t>& lut, int ignore_index) {
  if (!lut.empty()) {
    for (uint16_t& v : mask->labels) v = lut[v];
  }
  // ignore_index -1 (none) equals no uint16 label: nothing to mark, the labels are only read.
  mask->max_label = ignore_index < 0 || ignore_index > 0xFFFF
                        ? ScanLabels<false>(mask->labels.data(), mask->labels.size(), ignore_index, &mask->ignored)
                        : ScanLabels<true>(mask->labels.data(), mask->labels.size(), ignore_index, &mask->ignored);
}

std::string DescribeLabelOutOfRange(const LabelMap& mask, int num_classes) {
  return DescribeLabelOutOfRange(mask.labels.data(), mask.height, mask.width, num_classes);
}

absl::Status WritePng(const std::string& path, int height, int width, int channels, int bit_depth,
                      const void* data, int compression_level) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  PngReadState state;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &state, PngError, PngWarning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  std::vector<png_bytep> rows(height);
  if (png == nullptr || info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    std::fclose(f);
    return absl::InternalError(absl::StrCat("writing PNG '", path, "' failed: ", state.message));
  }
  png_init_io(png, f);
  const int color = channels == 1 ? PNG_COLOR_TYPE_GRAY : channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_RGBA;
  png_set_IHDR(png, info, width, height, bit_depth, color, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(png, compression_level);
  png_write_info(png, info);
  if (bit_depth == 16) png_set_swap(png);
  const size_t stride = static_cast<size_t>(width) * channels * (bit_depth / 8);
  for (int y = 0; y < height; ++y) {
    rows[y] = const_cast<png_bytep>(static_cast<const uint8_t*>(data) + stride * y);
  }
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fclose(f) != 0) return absl::DataLossError(absl::StrCat("closing '", path, "' failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeJpeg(const uint8_t* rgb, int height, int width, int quality, bool full_chroma) {
  std::unique_ptr<void, TjDeleter> tj(tjInitCompress());
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj.get(), rgb, width, 0, height, TJPF_RGB, &buf, &size, full_chroma ? TJSAMP_444 : TJSAMP_420,
                  quality, 0) != 0) {
    return absl::InternalError(absl::StrCat("JPEG encode failed: ", tjGetErrorStr2(tj.get())));
  }
  std::string out(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  return out;
}

absl::Status WriteJpeg(const std::string& path, int height, int width, const uint8_t* rgb, int quality) {
  absl::StatusOr<std::string> jpeg = EncodeJpeg(rgb, height, width, quality);
  if (!jpeg.ok()) return jpeg.status();
  FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(jpeg->data(), 1, jpeg->size(), f) == jpeg->size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace tally
