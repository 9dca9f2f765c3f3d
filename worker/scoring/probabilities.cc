#include "worker/scoring/probabilities.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/decode.h"
#include "common/formats/png.h"
#include "common/sources/row_files.h"
#include "common/sources/tar_members.h"
#include "base/status_macros.h"
#include "base/file_util.h"
#include "metrics/calibration.h"
#include "metrics/calibration_fine.h"

namespace tally {
namespace {

// A PNG whose header says 16-bit grayscale pixels; else why not.
absl::Status CheckSixteenBitGray(const std::string& path, const std::string& bytes) {
  static const char kSignature[] = "\x89PNG\r\n\x1a\n";
  if (bytes.size() < 33 || bytes.compare(0, 8, kSignature, 8) != 0 || bytes.compare(12, 4, "IHDR") != 0) {
    return absl::InvalidArgumentError(absl::StrCat("probability map '", DisplayPath(path), "' is not a PNG"));
  }
  const int depth = static_cast<unsigned char>(bytes[24]), color = static_cast<unsigned char>(bytes[25]);
  if (depth != 16 || color != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probability map '", DisplayPath(path), "' has ", depth, "-bit ", color == 0 ? "grayscale" : "colour",
        " pixels; expected a 16-bit grayscale PNG of class 1's probability times 65535"));
  }
  return absl::OkStatus();
}

// Class 1's probability of every voxel of a NIfTI map: its reference's geometry, values in [0, 1].
absl::Status ReadVolumeProbabilities(const std::string& path, int64_t max_pixels, const VolumeGeometry& ref_geometry,
                                     const std::string& ref_name, std::vector<float>* out) {
  VolumeImage image;
  RETURN_IF_ERROR(LoadNiftiImage(path, max_pixels, /*keep_raw=*/false, &image));
  RETURN_IF_ERROR(CheckSameGeometry(ref_geometry, ref_name, image.geometry, path));
  for (size_t i = 0; i < image.values.size(); ++i) {
    if (!(image.values[i] >= 0.f && image.values[i] <= 1.f)) {
      return absl::InvalidArgumentError(absl::StrCat("probability map '", DisplayPath(path), "' holds ", image.values[i],
                                                     " at voxel ", i, "; probabilities are in [0, 1]"));
    }
  }
  *out = std::move(image.values);
  return absl::OkStatus();
}

// Class 1's probability of every pixel of a 16-bit grayscale PNG map of the reference's size.
absl::Status ReadPngProbabilities(const std::string& path, int64_t max_pixels, const LabelMap& ref,
                                  std::vector<float>* out) {
  std::string bytes;
  FileFacts facts;
  RETURN_IF_ERROR(ReadFileBytes(path, &bytes, &facts));
  RETURN_IF_ERROR(CheckSixteenBitGray(path, bytes));
  LabelMap values;
  if (absl::Status s = DecodePngWithLibpng(bytes, max_pixels, nullptr, &values); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("probability map '", DisplayPath(path), "': ", s.message()));
  }
  if (values.height != ref.height || values.width != ref.width) {
    return absl::InvalidArgumentError(absl::StrCat("probability map '", DisplayPath(path), "' is ", values.height, "x",
                                                   values.width, " (HxW); the reference is ", ref.height, "x", ref.width));
  }
  out->resize(values.labels.size());
  for (size_t i = 0; i < out->size(); ++i) (*out)[i] = ScoreProbability(values.labels[i]);
  return absl::OkStatus();
}

}  // namespace

absl::Status CountRowProbabilities(const std::string& path, int64_t max_pixels, const LabelMap& ref,
                                   const VolumeGeometry& ref_geometry, const std::string& ref_name,
                                   const LabelMap& pred, int classes, v1::ImageResult* result) {
  if (path.empty()) {
    return absl::InvalidArgumentError("--metrics calibration: the row's 'probabilities' field is empty");
  }
  if (classes != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probability map '", DisplayPath(path), "' gives class 1's probability, for 2 classes; the row has ", classes));
  }
  std::vector<float> one;
  RETURN_IF_ERROR(IsNiftiPath(path) ? ReadVolumeProbabilities(path, max_pixels, ref_geometry, ref_name, &one)
                                    : ReadPngProbabilities(path, max_pixels, ref, &one));
  const size_t hw = one.size();
  if (hw != ref.labels.size() || hw != pred.labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("probability map '", DisplayPath(path), "' has ", hw,
                                                   " values; the reference has ", ref.labels.size()));
  }
  std::vector<int64_t> row(CalibrationRowSize(2), 0), fine(CalibrationFineSize(2), 0);
  CountTwoClassCalibration(one.data(), ref.labels.data(), pred.labels.data(), static_cast<int64_t>(hw), row.data(),
                           fine.data());
  result->mutable_calibration()->Add(row.begin(), row.end());
  SetSparseFine(fine.data(), 2, result->mutable_calibration_fine());
  return absl::OkStatus();
}

}  // namespace tally
