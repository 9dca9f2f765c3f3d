// DICOM (common/formats/dicom.cc, through DCMTK): the image decoder on arbitrary bytes, with the
// header's window or a given one, the size read, and the attributes --group-by dicom: reads.
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
  std::vector<std::string> tags;
  if (tally::DicomTagValues(bytes, "fuzz", {"Manufacturer", "SliceThickness", "PixelData", "PatientName"}, &tags).ok()) {
    FUZZ_CHECK(tags.size() == 4 && tags[2].empty());
    for (const std::string& t : tags) FUZZ_CHECK(t.size() <= 256);
  }
  return 0;
}
