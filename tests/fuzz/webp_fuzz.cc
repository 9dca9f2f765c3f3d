// WebP (common/formats/webp.cc, through libwebp): the image and mask decoders on arbitrary bytes.
#include "common/formats/webp.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = FuzzInput(data, size);
  tally::RgbImage rgb;
  if (tally::DecodeWebpImage(bytes, "fuzz", kFuzzMaxPixels, &rgb).ok()) {
    FUZZ_CHECK(rgb.pixels.size() == static_cast<size_t>(rgb.height) * rgb.width * 3);
  }
  tally::LabelMap mask;
  if (tally::DecodeWebpMask(bytes, "fuzz", kFuzzMaxPixels, &mask).ok()) {
    FUZZ_CHECK(mask.labels.size() == static_cast<size_t>(mask.height) * mask.width);
    for (uint16_t v : mask.labels) FUZZ_CHECK(v <= 255);
  }
  return 0;
}
