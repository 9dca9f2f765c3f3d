#include "worker/scoring/volume_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/sources/row_files.h"

namespace tally {

void VolumeModel::Preprocess(const JobConfig& config, std::vector<float>* channel) {
  std::vector<float>& v = *channel;
  if (config.intensity == JobConfig::Intensity::kZscore) {
    double sum = 0;
    for (float x : v) sum += x;
    const double mean = v.empty() ? 0.0 : sum / static_cast<double>(v.size());
    double sq = 0;
    for (float x : v) sq += (x - mean) * (x - mean);
    double sd = v.empty() ? 0.0 : std::sqrt(sq / static_cast<double>(v.size()));
    if (sd == 0) sd = 1;
    for (float& x : v) x = static_cast<float>((x - mean) / sd);
  } else if (config.intensity == JobConfig::Intensity::kClip) {
    const double lo = config.clip_low, hi = config.clip_high;
    for (float& x : v) x = static_cast<float>((std::fmin(std::fmax(static_cast<double>(x), lo), hi) - lo) / (hi - lo));
  }
}

absl::StatusOr<VolumePrediction> VolumeModel::Predict(const v1::ManifestRow& row, const VolumeGeometry& reference,
                                                      const std::string& mask_path) {
  const std::vector<std::string> files = VolumeChannelFiles(row.image_path());
  if (row.image_path().empty()) return absl::InvalidArgumentError("volume jobs need an 'image' for every row");
  const int64_t voxels = reference.depth * reference.height * reference.width;
  std::vector<uint8_t> data;
  std::string dtype = "float32";
  std::string digests;  // The prediction store's key of the input: the files' bytes.
  for (const std::string& file : files) {
    if (!IsNiftiPath(file)) {
      return absl::InvalidArgumentError(absl::StrCat("image '", file, "' is not a NIfTI volume (.nii, .nii.gz); ",
                                                     "this job's images are volumes"));
    }
    VolumeImage image;
    RETURN_IF_ERROR(LoadNiftiImage(file, config_.max_image_pixels, config_.keep_dtype, &image));
    if (!config_.prediction_store.empty()) {
      ASSIGN_OR_RETURN(const FileFacts facts, DigestFile(file));  // nifti_clib read it: once more, for its digest.
      digests += facts.xxh128;
    }
    RETURN_IF_ERROR(CheckSameGeometry(reference, mask_path, image.geometry, file));
    if (config_.keep_dtype) {
      if (file != files[0] && image.dtype != dtype) {
        return absl::InvalidArgumentError(absl::StrCat("image '", file, "' stores ", image.dtype, " but '", files[0],
                                                       "' stores ", dtype, " (--keep-dtype needs one type)"));
      }
      dtype = image.dtype;
      data.insert(data.end(), image.raw.begin(), image.raw.end());
    } else {
      Preprocess(config_, &image.values);
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(image.values.data());
      data.insert(data.end(), bytes, bytes + image.values.size() * sizeof(float));
    }
  }
  VolumeRequest request;
  request.data = data.data();
  request.dtype = dtype;
  request.channels = static_cast<int>(files.size());
  request.depth = reference.depth;
  request.height = reference.height;
  request.width = reference.width;
  request.spacing = reference.spacing;
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) request.affine[r][c] = reference.affine[r][c];
  }
  request.affine[3] = {0, 0, 0, 1};
  request.index = row.index();
  if (!digests.empty()) request.input_digest = files.size() == 1 ? digests : Xxh128(digests);
  for (int c = 0; c < row.columns_size() && c < static_cast<int>(config_.manifest_columns.size()); ++c) {
    request.row.emplace_back(config_.manifest_columns[c], row.columns(c));
  }
  request.row.emplace_back("id", row.id());
  request.row.emplace_back("image", row.image_path());
  request.row.emplace_back("mask", row.mask_path());
  absl::StatusOr<VolumePrediction> out;
  {
    absl::MutexLock lock(&mu_);
    out = runner_->PredictVolume(request);
  }
  if (!out.ok()) return out.status();
  if (static_cast<int64_t>(out->labels.size()) != voxels) {
    return absl::InternalError(absl::StrCat("the model's labels have ", out->labels.size(), " voxels for a ",
                                            voxels, "-voxel volume"));
  }
  return out;
}

}  // namespace tally
