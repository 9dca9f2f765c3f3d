// DICOM through DCMTK (common/formats/image_formats.h): single-frame MONOCHROME1, MONOCHROME2 (8-16 bits,
// signed or not) or RGB (8 bits), any transfer syntax DCMTK decodes (JPEG, JPEG-LS, RLE; not JPEG
// 2000). A DICOM file is never a mask. Python models get the stored values unreduced (DecodeDicomRaw);
// a DICOM's pixel data is checked against its dimensions before it is read.
#ifndef TALLY_COMMON_FORMATS_DICOM_H_
#define TALLY_COMMON_FORMATS_DICOM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/image_formats.h"

namespace tally {

const ImageDecoder& DicomDecoder();

// Bounds on a file's structure, checked by walking it before DCMTK parses it (SECURITY.md "Limits").
inline constexpr int kMaxDicomDepth = 64;            // Sequences and items nested.
inline constexpr int64_t kMaxDicomElements = 1000000;  // Elements of the whole file.

// The decoder's parts, for the fuzz targets (tests/fuzz/dicom_fuzz.cc).
absl::Status DecodeDicomImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                              int64_t max_pixels, RgbImage* out);
absl::Status DecodeDicomRaw(const std::string& bytes, const std::string& name, int64_t max_pixels, RawImage* out);
absl::Status DicomDimensions(const std::string& bytes, const std::string& name, int* height, int* width);

// Whether `keyword` names an attribute of DCMTK's data dictionary ("Manufacturer", "SliceThickness").
bool IsDicomKeyword(const std::string& keyword);
// The values of the attributes named by `keywords` (each IsDicomKeyword) in a DICOM image, as DCMTK
// writes them as text (several values joined by '\\'), at most 256 bytes each; "" where the file has
// none. Errors as the decoder's when the file is not a DICOM image it reads.
absl::Status DicomTagValues(const std::string& bytes, const std::string& name, const std::vector<std::string>& keywords,
                            std::vector<std::string>* values);

}  // namespace tally

#endif  // TALLY_COMMON_FORMATS_DICOM_H_
