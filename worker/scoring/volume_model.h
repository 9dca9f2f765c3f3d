// Volume jobs (docs/volumes.md "Volumes into models"): a row's NIfTI volume (one file per channel, joined by
// ';' in the manifest's `image`) through the job's model, as D x H x W labels at the reference's
// geometry. ScoringPipeline then scores them as it scores a prediction volume: the same counts,
// surface distances and lesions, in 3D.
//
// Per row: every channel is read as float32 (after the header's scaling; --keep-dtype: the stored
// voxels, Python models only) and must have the reference's geometry (dimensions exactly, spacing
// and affine within kGeometryTolerance), else the row fails naming both files. --intensity then
// applies per channel: zscore (x - mean) / std over the channel's voxels, in double precision,
// population std, std 0 -> 1 (MONAI's NormalizeIntensity, channel_wise, nonzero=False); clip:LO,HI
// clamps to [LO, HI] and scales to [0, 1] (MONAI's ScaleIntensityRange with clip=True, the usual CT
// window). The model gets C x D x H x W (z, y, x) with the reference's spacing (z, y, x) and affine.
//
// One volume is on the model at a time (Predict serialises): reading, preprocessing and scoring of
// other rows overlap it on the scoring threads. Thread-safe.
#ifndef TALLY_WORKER_SCORING_VOLUME_MODEL_H_
#define TALLY_WORKER_SCORING_VOLUME_MODEL_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/volume.h"
#include "common/job/job_config.h"
#include "proto/tally.pb.h"
#include "worker/interfaces/model_runner.h"

namespace tally {

class VolumeModel {
 public:
  // `runner` outlives this object.
  VolumeModel(ModelRunner* runner, const JobConfig& config) : runner_(runner), config_(config) {}

  // The row's labels from the model, for a reference of geometry `reference` read from `mask_path`.
  absl::StatusOr<VolumePrediction> Predict(const v1::ManifestRow& row, const VolumeGeometry& reference,
                                           const std::string& mask_path) ABSL_LOCKS_EXCLUDED(mu_);

  RunnerStats runner_stats() const { return runner_->Stats(); }

  // The channels' voxels after --intensity (float32 rows), as the model gets them. For tests.
  static void Preprocess(const JobConfig& config, std::vector<float>* channel);

 private:
  ModelRunner* const runner_;
  const JobConfig config_;
  absl::Mutex mu_;  // One volume on the model at a time.
};

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_VOLUME_MODEL_H_
