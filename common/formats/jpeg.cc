// JPEG through libjpeg-turbo's TurboJPEG API (common/formats/jpeg.h).
#include "common/formats/jpeg.h"

#include <turbojpeg.h>

#include <cstdio>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"

namespace tally {
namespace {

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

absl::Status JpegDimensions(const std::string& bytes, const std::string& name, int /*page*/, int* height, int* width) {
  return InspectJpeg(bytes, name, std::numeric_limits<int64_t>::max(), height, width);
}

absl::Status DecodeJpegImage(const std::string& bytes, const std::string& name, const DecodeOptions& /*options*/,
                             int64_t max_pixels, RgbImage* out) {
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

}  // namespace

const ImageDecoder& JpegDecoder() {
  static const ImageDecoder decoder{ImageFormat::kJpeg, JpegDimensions, DecodeJpegImage, nullptr,
                                    "a JPEG, which is lossy and would corrupt class indices", nullptr};
  return decoder;
}

bool LooksLikeJpeg(const std::string& bytes) { return DetectImageFormat(bytes) == ImageFormat::kJpeg; }

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
