// The format of a file's bytes and the call to its decoder (common/formats/decode.h).
#include "common/formats/decode.h"

#include "absl/strings/str_cat.h"
#include "common/formats/dicom.h"
#include "common/formats/jpeg.h"
#include "common/formats/png.h"
#include "common/formats/tiff.h"
#include "common/formats/webp.h"

namespace tally {
namespace {

constexpr const char* kFormats = "PNG, JPEG, TIFF, WebP or DICOM";

// The decoder of the bytes' format; null for bytes no decoder reads.
const ImageDecoder* DecoderOf(const std::string& bytes) {
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kPng: return &PngDecoder();
    case ImageFormat::kJpeg: return &JpegDecoder();
    case ImageFormat::kTiff: return &TiffDecoder();
    case ImageFormat::kWebp: return &WebpDecoder();
    case ImageFormat::kDicom: return &DicomDecoder();
    case ImageFormat::kUnknown: break;
  }
  return nullptr;
}

}  // namespace

absl::Status ImageDimensions(const std::string& bytes, const std::string& name, int* height, int* width, int page) {
  const ImageDecoder* decoder = DecoderOf(bytes);
  if (decoder == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not an image Tally reads (", kFormats, ")"));
  }
  return decoder->dimensions(bytes, name, page, height, width);
}

absl::StatusOr<bool> DecodeRawImage(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                    RawImage* out) {
  const ImageDecoder* decoder = DecoderOf(bytes);
  if (decoder == nullptr || decoder->decode_raw == nullptr) return false;
  return decoder->decode_raw(bytes, name, page, max_pixels, out);
}

absl::Status DecodeImage(const std::string& bytes, const std::string& name, RgbImage* out, int64_t max_pixels,
                         const DecodeOptions& options) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is empty (0 bytes)"));
  const ImageDecoder* decoder = DecoderOf(bytes);
  if (decoder == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("image '", name, "' is not an image Tally reads (unrecognised file signature; ", kFormats, ")"));
  }
  out->windowed = false;  // Set by the decoders that apply --window.
  return decoder->decode_image(bytes, name, options, max_pixels, out);
}

absl::Status DecodeMask(const std::string& bytes, const std::string& name, LabelMap* out, int64_t max_pixels,
                        int page) {
  out->depth = 1;
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat("mask '", name, "' is empty (0 bytes)"));
  const ImageDecoder* decoder = DecoderOf(bytes);
  if (decoder == nullptr || decoder->decode_mask == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask '", name, "' is ", decoder == nullptr ? "not a PNG, TIFF or WebP" : decoder->no_masks,
        "; masks must be single-channel PNG, lossless TIFF or lossless WebP files of class indices"));
  }
  if (absl::Status s = decoder->decode_mask(bytes, name, page, max_pixels, out); !s.ok()) return s;
  int64_t ignored = 0;
  out->max_label = ScanMaxLabel(out->labels.data(), out->labels.size(), kIgnoreLabel, &ignored);
  return absl::OkStatus();
}

}  // namespace tally
