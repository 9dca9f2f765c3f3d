#include "common/formats/image_formats.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tally {

ImageFormat DetectImageFormat(const std::string& b) {
  if (b.size() >= 8 && b.compare(0, 8, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  if (b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8 &&
      static_cast<uint8_t>(b[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
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

std::string TooManyPixels(const std::string& what, const std::string& name, int64_t height, int64_t width,
                          int64_t max_pixels) {
  return absl::StrCat(what, " '", name, "' declares ", height, "x", width, " pixels (", height * width,
                      "), more than the limit of ", max_pixels,
                      " (--max-image-pixels; a guard against decompression bombs)");
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

int ScanMaxLabel(const uint16_t* labels, size_t n, int ignore, int64_t* ignored) {
  // kMark is false: nothing is written through the pointer.
  return ScanLabels<false>(const_cast<uint16_t*>(labels), n, ignore, ignored);
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

std::string DescribeLabelOutOfRange(const LabelMap& mask, int num_classes) {
  return DescribeLabelOutOfRange(mask.labels.data(), mask.height, mask.width, num_classes);
}

}  // namespace tally
