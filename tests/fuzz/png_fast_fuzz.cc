// The libdeflate PNG decoder (common/formats/png_fast.cc) on arbitrary bytes, as RGB and as labels: no
// crash, and on success exactly height x width pixels.
#include "common/formats/png_fast.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = FuzzInput(data, size);
  int h = 0, w = 0;
  std::vector<uint8_t> rgb;
  std::string err;
  if (tally::DecodePngRgbFast(bytes, kFuzzMaxPixels, &h, &w, &rgb, &err) == tally::PngFastResult::kOk) {
    FUZZ_CHECK(h > 0 && w > 0 && rgb.size() == static_cast<size_t>(h) * w * 3);
  }
  std::vector<uint16_t> labels;
  if (tally::DecodePngLabelsFast(bytes, kFuzzMaxPixels, &h, &w, &labels, &err) == tally::PngFastResult::kOk) {
    FUZZ_CHECK(h > 0 && w > 0 && labels.size() == static_cast<size_t>(h) * w);
  }
  return 0;
}
