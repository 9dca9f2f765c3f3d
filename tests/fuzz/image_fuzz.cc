// What workers run on every image and mask file: DecodeImage (PNG fast path, libpng, TurboJPEG)
// and DecodeMask on arbitrary bytes.
#include "common/formats/decode.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = FuzzInput(data, size);
  tally::RgbImage rgb;
  if (tally::DecodeImage(bytes, "fuzz", &rgb, kFuzzMaxPixels).ok()) {
    FUZZ_CHECK(rgb.pixels.size() == static_cast<size_t>(rgb.height) * rgb.width * 3);
  }
  tally::LabelMap mask;
  if (tally::DecodeMask(bytes, "fuzz", &mask, kFuzzMaxPixels).ok()) {
    FUZZ_CHECK(mask.labels.size() == static_cast<size_t>(mask.height) * mask.width);
    // A 16-bit mask may hold 65535; rows fail on it later ("mask label 65535 >= number of classes").
    FUZZ_CHECK(mask.max_label >= -1 && mask.max_label <= 65535);
  }
  return 0;
}
