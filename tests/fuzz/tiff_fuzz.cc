// TIFF (common/formats/tiff.cc, through libtiff): the image and mask decoders on arbitrary bytes, at
// the page and window the input's first byte picks, and the header-only size read.
#include "common/formats/tiff.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int page = data[0] & 3;
  tally::DecodeOptions options;
  options.page = page;
  if (data[0] & 4) options.window = tally::Window{1000.0, 2000.0};
  const std::string bytes = FuzzInput(data + 1, size - 1);
  tally::RgbImage rgb;
  if (tally::DecodeTiffImage(bytes, "fuzz", options, kFuzzMaxPixels, &rgb).ok()) {
    FUZZ_CHECK(rgb.pixels.size() == static_cast<size_t>(rgb.height) * rgb.width * 3);
  }
  tally::LabelMap mask;
  if (tally::DecodeTiffMask(bytes, "fuzz", page, kFuzzMaxPixels, &mask).ok()) {
    FUZZ_CHECK(mask.labels.size() == static_cast<size_t>(mask.height) * mask.width);
  }
  int h = 0, w = 0;
  if (tally::TiffDimensions(bytes, "fuzz", page, &h, &w).ok()) FUZZ_CHECK(h >= 0 && w >= 0);
  return 0;
}
