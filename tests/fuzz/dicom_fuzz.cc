// DICOM (common/formats/dicom.cc, through DCMTK): the image decoder on arbitrary bytes, with the
// header's window or a given one, and the size read.
#include "common/formats/dicom.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  tally::DecodeOptions options;
  if (data[0] & 1) options.window = tally::Window{40.0, 400.0};
  const std::string bytes = FuzzInput(data + 1, size - 1);
  tally::RgbImage rgb;
  if (tally::DecodeDicomImage(bytes, "fuzz", options, kFuzzMaxPixels, &rgb).ok()) {
    FUZZ_CHECK(rgb.pixels.size() == static_cast<size_t>(rgb.height) * rgb.width * 3);
  }
  int h = 0, w = 0;
  if (tally::DicomDimensions(bytes, "fuzz", &h, &w).ok()) FUZZ_CHECK(h > 0 && w > 0);
  return 0;
}
