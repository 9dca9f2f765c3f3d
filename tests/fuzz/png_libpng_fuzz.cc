// The libpng fallback decoder (common/formats/png.cc) on arbitrary bytes, as RGB and as labels.
#include "common/formats/decode.h"
#include "fuzz_util.h"
#include "common/formats/png.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = FuzzInput(data, size);
  tally::RgbImage rgb;
  if (tally::DecodePngWithLibpng(bytes, kFuzzMaxPixels, &rgb, nullptr).ok()) {
    FUZZ_CHECK(rgb.pixels.size() == static_cast<size_t>(rgb.height) * rgb.width * 3);
  }
  tally::LabelMap labels;
  if (tally::DecodePngWithLibpng(bytes, kFuzzMaxPixels, nullptr, &labels).ok()) {
    FUZZ_CHECK(labels.labels.size() == static_cast<size_t>(labels.height) * labels.width);
  }
  return 0;
}
