// WebP through libwebp (common/formats/webp.h): still images; masks only from lossless files.
#include <webp/decode.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/formats/webp.h"

namespace tally {
namespace {

absl::Status Features(const std::string& bytes, const std::string& name, const char* what,
                      WebPBitstreamFeatures* f) {
  const VP8StatusCode code = WebPGetFeatures(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), f);
  if (code != VP8_STATUS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' is not a valid WebP (libwebp status ", code, ")"));
  }
  if (f->has_animation) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' is an animated WebP; Tally reads still images"));
  }
  if (f->width <= 0 || f->height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' is a WebP of size ", f->height, "x", f->width));
  }
  return absl::OkStatus();
}

absl::Status DecodeRgb(const std::string& bytes, const std::string& name, const char* what,
                       const WebPBitstreamFeatures& f, std::vector<uint8_t>* rgb) {
  rgb->resize(static_cast<size_t>(f.height) * f.width * 3);
  const int stride = f.width * 3;
  if (WebPDecodeRGBInto(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), rgb->data(), rgb->size(),
                        stride) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' is a WebP that cannot be decoded (truncated or "
                                                   "corrupt)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WebpDimensions(const std::string& bytes, const std::string& name, int* height, int* width) {
  WebPBitstreamFeatures f;
  absl::Status s = Features(bytes, name, "image", &f);
  if (!s.ok()) return s;
  *height = f.height;
  *width = f.width;
  return absl::OkStatus();
}

absl::Status DecodeWebpImage(const std::string& bytes, const std::string& name, int64_t max_pixels, RgbImage* out) {
  WebPBitstreamFeatures f;
  absl::Status s = Features(bytes, name, "image", &f);
  if (!s.ok()) return s;
  if (static_cast<int64_t>(f.width) * f.height > max_pixels) {
    return absl::InvalidArgumentError(TooManyPixels("image", name, f.height, f.width, max_pixels));
  }
  out->height = f.height;
  out->width = f.width;
  return DecodeRgb(bytes, name, "image", f, &out->pixels);  // Alpha dropped, as PIL's convert("RGB").
}

absl::Status DecodeWebpMask(const std::string& bytes, const std::string& name, int64_t max_pixels, LabelMap* out) {
  WebPBitstreamFeatures f;
  absl::Status s = Features(bytes, name, "mask", &f);
  if (!s.ok()) return s;
  if (f.format != 2) {
    return absl::InvalidArgumentError(absl::StrCat("mask '", name, "' is a lossy WebP, which would corrupt class "
                                                   "indices; masks must be lossless WebP (or PNG, TIFF)"));
  }
  if (static_cast<int64_t>(f.width) * f.height > max_pixels) {
    return absl::InvalidArgumentError(TooManyPixels("mask", name, f.height, f.width, max_pixels));
  }
  thread_local std::vector<uint8_t> rgb;
  // Released at the end if an outlier grew it, also when decoding fails; after the return value
  // (whose message may read a pixel of it) is made.
  absl::Cleanup release = [] { ShrinkIfLarger(&rgb, kKeepBufferBytes); };
  s = DecodeRgb(bytes, name, "mask", f, &rgb);
  if (!s.ok()) return s;
  out->height = f.height;
  out->width = f.width;
  out->depth = 1;
  const size_t n = static_cast<size_t>(f.height) * f.width;
  out->labels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* px = rgb.data() + 3 * i;
    if (px[0] != px[1] || px[0] != px[2]) {
      const size_t y = i / f.width, x = i % f.width;
      return absl::InvalidArgumentError(
          absl::StrCat("mask '", name, "' is a colour WebP (pixel (y=", y, ", x=", x, ") is ", int{px[0]}, ",",
                       int{px[1]}, ",", int{px[2]}, "); a WebP mask must be grey, its value the class index"));
    }
    out->labels[i] = px[0];
  }
  return absl::OkStatus();
}

const ImageDecoder& WebpDecoder() {
  static const ImageDecoder decoder{
      ImageFormat::kWebp,
      [](const std::string& bytes, const std::string& name, int, int* height, int* width) {
        return WebpDimensions(bytes, name, height, width);
      },
      [](const std::string& bytes, const std::string& name, const DecodeOptions&, int64_t max_pixels, RgbImage* out) {
        return DecodeWebpImage(bytes, name, max_pixels, out);
      },
      [](const std::string& bytes, const std::string& name, int, int64_t max_pixels, LabelMap* out) {
        return DecodeWebpMask(bytes, name, max_pixels, out);
      },
      "", nullptr};
  return decoder;
}

}  // namespace tally
