// PNG through the fast decoder (png_fast.h) and libpng (common/formats/png.h).
#include "common/formats/png.h"

#include <png.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/png_fast.h"

namespace tally {
namespace {

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

// The IHDR chunk comes first: its width and height, big-endian, at bytes 16 and 20.
absl::Status PngDimensions(const std::string& bytes, const std::string& name, int /*page*/, int* height, int* width) {
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

absl::Status DecodePngImage(const std::string& bytes, const std::string& name, const DecodeOptions& /*options*/,
                            int64_t max_pixels, RgbImage* out) {
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

absl::Status DecodePngMask(const std::string& bytes, const std::string& name, int /*page*/, int64_t max_pixels,
                           LabelMap* out) {
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
  return absl::OkStatus();
}

}  // namespace

const ImageDecoder& PngDecoder() {
  static const ImageDecoder decoder{ImageFormat::kPng, PngDimensions, DecodePngImage, DecodePngMask, "", nullptr};
  return decoder;
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

}  // namespace tally
