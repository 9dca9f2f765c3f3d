// The worker's data path for prediction jobs (no model): each row's predicted label map and
// reference, 2D PNGs or 3D NIfTI volumes, are read, put through the job's mask conventions and
// scored on the CPU (counts for every class or region, surface distances when selected), one row
// per thread at a time; once no row waits, a volume's classes are spread over the threads left idle
// (metrics/surface_distance.h ClassSurfaceMetrics3D). No device is needed.
//
// Per row: the prediction gets the label map; the reference the label map and then the ignore
// index; both must have the same geometry (size; for volumes also spacing and affine within a
// tolerance), else the row fails naming both. The class count is the job's (--num-classes, or the
// number of regions), or else the row's largest label plus one (the coordinator takes the largest
// over the set and the report pads the rest). Surface distances of volumes use the header spacing
// unless the job sets --spacing z,y,x; a spacing that contradicts a header fails the job (it is a
// usage error, the same on every row) unless --force-spacing.
//
// Memory: each thread holds one row's pair (labels as uint16: 2 bytes per voxel and map, plus the
// file's own data while it is converted) and the edge voxels of one class pair.
// Thread-safe. Callbacks run on scoring threads.
#ifndef TALLY_WORKER_SCORING_SCORING_H_
#define TALLY_WORKER_SCORING_SCORING_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/job/job_config.h"
#include "common/coco/coco_instances.h"
#include "common/formats/thumbnail.h"
#include "common/formats/volume.h"
#include "worker/interfaces/row_evaluator.h"
#include "worker/scoring/row_memory.h"
#include "worker/scoring/volume_model.h"

namespace tally {

class ScoringPipeline : public RowEvaluator {
 public:
  using ResultFn = std::function<void(const LeaseKey&, v1::ImageResult)>;
  using FatalFn = std::function<void(const std::string& message, bool definitive)>;
  using TimeoutFn = std::function<void(const LeaseKey& lease, const std::vector<int64_t>& indices,
                                       const std::string& what, double seconds)>;

  // `coco`: a COCO instance job's annotations and detections (null for other jobs). `volumes`: a
  // volume job's model (worker/scoring/volume_model.h), which gives each row's prediction instead of its
  // `prediction` file; `save_predictions`: where its labels go as <id>.nii.gz (resolved, or empty).
  ScoringPipeline(JobConfig config, int threads, ResultFn on_result, FatalFn on_fatal, TimeoutFn on_timeout,
                  std::shared_ptr<const CocoSource> coco = nullptr,
                  std::shared_ptr<const PanopticSource> panoptic = nullptr,
                  std::shared_ptr<VolumeModel> volumes = nullptr, std::string save_predictions = "");
  ~ScoringPipeline() override;

  // Volumes' surface distances with the GPU doing the voxel work (metrics/gpu/surface3d_kernel.h; the
  // same values) on CUDA device `device`; -1: the CPU. Builds without Tally's CUDA kernels ignore it.
  void UseDeviceForSurfaces(int device) { surface_device_ = device; }
  // The host memory the rows in progress may hold together (worker/scoring/row_memory.h): a row
  // whose estimate passes it fails, naming both; others wait until theirs fits. Call before Submit.
  // <= 0: no limit.
  void SetMemoryBudget(int64_t bytes);

  void Submit(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) override;
  void Drop(int64_t lease_id) override;
  int64_t Backlog() const override;
  bool WaitIdle(absl::Duration limit) override;
  int batch_size() const override { return 1; }
  v1::WorkerStats Stats() const override;


 private:
  // Scores one row. A job-level problem (contradicting spacing) comes back as a non-empty `fatal`.
  // Rows entering the shard's worst get thumbnails (`thumbnails` may be null).
  v1::ImageResult ScoreRow(const v1::ManifestRow& row, ShardThumbnails* thumbnails, std::string* fatal) const;

 public:
  // A label map as read (PNG or NIfTI) with its geometry.
  struct LoadedMap {
    LabelMap labels;
    VolumeGeometry geometry;
    bool volume = false;
    int classes = 0;        // A model's class count (volume jobs); 0: from the labels.
    int64_t nonfinite = 0;  // A model's NaN/Inf scores (volume jobs).
    bool from_store = false;  // A model's labels taken from the prediction store (volume jobs).
    // COCO rows whose every instance's category is below the job's class count: no label can be
    // out of range, so ClassCount's scans are spared and the reference's largest label comes from
    // the counts (LoadCocoPair, ScoreRow).
    bool labels_in_range = false;
    std::string digest;  // The file's XXH128 as read (common/sources/row_files.h); "" for a model's.
    int64_t modified_ns = 0;  // Its modification time as read.
  };

 private:
  // ScoreRow's steps: both maps read and checked against each other, the mask conventions applied;
  // the row's class (or region) count, checked against both maps; the spacing for surface
  // distances (FAILED_PRECONDITION: the job's --spacing cannot apply, which fails the job).
  absl::Status LoadPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred) const;
  // Volume jobs: the reference read, the prediction from the model (and saved when asked).
  absl::Status PredictPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred) const;
  // COCO instance jobs: the row's instances evaluated into `result`, and painted as both maps.
  // Rows among the shard's lowest instance F1 get a thumbnail of the matching (`thumbnails` may be null).
  absl::Status LoadCocoPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred, v1::ImageResult* result,
                            ShardThumbnails* thumbnails, int64_t spare = -1) const;
  absl::StatusOr<int> ClassCount(const v1::ManifestRow& row, const LoadedMap& ref, const LoadedMap& pred) const;
  // What the row will hold at its peak, from the sizes its files declare (row_memory.h), and its
  // size in words ("512x512x300 voxels with lesion metrics"). 0 where a file cannot be read: loading
  // it then fails the row with the reason.
  int64_t EstimateRow(const v1::ManifestRow& row, std::string* what) const;
  // The row admitted at the memory gate: `held` what it holds there (release it), `spare` what
  // polygons and lesion components may take beyond it (-1: no limit). Non-empty: why it cannot run.
  std::string Admit(const v1::ManifestRow& row, int64_t* held, int64_t* spare) const;
  // The surface distances of every class or region of a row.
  void Surfaces(const uint16_t* p, const uint16_t* r, int depth, int height, int width, int classes,
                const SurfaceOptions3D& spacing, std::vector<SurfaceValues>* surface) const;
  // The lesion-wise metrics of every class or region of a row into `result`.
  absl::Status Lesions(const uint16_t* p, const uint16_t* r, int depth, int height, int width,
                       const SurfaceOptions3D& spacing, int64_t spare, v1::ImageResult* result) const;
  absl::StatusOr<SurfaceOptions3D> SpacingOf(const v1::ManifestRow& row, const LoadedMap& ref) const;
  // A volume's spacing into its result (ImageResult.spacing).
  void RecordSpacing(const LoadedMap& ref, const SurfaceOptions3D& spacing, v1::ImageResult* result) const;
  void AddThumbnails(const v1::ManifestRow& row, const uint16_t* prediction, const uint16_t* reference, int depth,
                     int height, int width, ShardThumbnails* thumbnails, v1::ImageResult* result) const;

  struct Shard {
    LeaseKey lease;
    std::vector<v1::ManifestRow> rows;
    size_t next = 0;
    bool dropped = false;
    std::shared_ptr<ShardThumbnails> thumbnails;  // Null when the job has none.
    // --metrics calibration: rows scored, and the evaluated ones held until the shard's last, which
    // goes out first with the shard's fine histogram (covering them all).
    size_t done = 0;
    int64_t first_index = 0;  // rows' first, before they are taken: the shard's batch (calibration_batch).
    std::vector<v1::ImageResult> held;
    std::vector<int64_t> fine;
  };
  struct Activity {
    double since = 0;  // 0: idle.
    LeaseKey lease;
    int64_t index = 0;
  };

  // The threads one row may use for its classes: its share of the scoring threads once no row waits
  // (a last few volumes, each with many classes, then use every core).
  int SpareThreads() const ABSL_LOCKS_EXCLUDED(mu_);
  void Loop(size_t slot);
  // --metrics calibration of a prediction row: its probability map counted (worker/scoring/probabilities.h);
  // the row has at least 2 classes then. OK at once for other jobs.
  absl::Status Probabilities(const v1::ManifestRow& row, const LoadedMap& ref, const LoadedMap& pred, int* classes,
                             v1::ImageResult* result) const;
  // Calibration: holds an evaluated row's result in its shard (its fine histogram added to the
  // shard's); returns the rows to deliver now (the shard's, with the histogram on the first, once
  // its last row is scored). Under mu_.
  std::vector<v1::ImageResult> HoldCalibrated(Shard* shard, v1::ImageResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchdogLoop();
  bool WorkOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobConfig config_;
  const std::shared_ptr<const CocoSource> coco_;
  const std::shared_ptr<const PanopticSource> panoptic_;  // Panoptic jobs.
  const std::shared_ptr<VolumeModel> volumes_;             // Volume jobs.
  const std::string save_predictions_;                     // Volume jobs: resolved folder, or empty.
  mutable std::atomic<int> surface_device_{-1};            // UseDeviceForSurfaces; -1 once it failed.
  std::unique_ptr<MemoryGate> memory_;                     // SetMemoryBudget; null: no limit.
  // Panoptic jobs: the row's segments evaluated into `result`, and their categories as both maps.
  absl::Status LoadPanopticPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred,
                                v1::ImageResult* result) const;
  // Instance jobs: the lowest instance F1 over every row this worker scored. A row among the job's
  // worst is among these too (common/formats/thumbnail.h), so only rows in both get rendered.
  mutable absl::Mutex worst_mu_;
  mutable RunningWorst worker_worst_ ABSL_GUARDED_BY(worst_mu_);
  const std::vector<uint16_t> label_lut_;  // From config_.label_map, built once; empty = identity.
  const ResultFn on_result_;
  const FatalFn on_fatal_;
  const TimeoutFn on_timeout_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  int64_t backlog_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Activity> activity_ ABSL_GUARDED_BY(mu_);
  int64_t images_done_ ABSL_GUARDED_BY(mu_) = 0;
  double clock_start_ ABSL_GUARDED_BY(mu_) = 0;
  double last_result_ ABSL_GUARDED_BY(mu_) = 0;
  double first_result_unix_ ABSL_GUARDED_BY(mu_) = 0;
  int threads_count_ = 1;
  std::vector<std::thread> threads_;
};

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_SCORING_H_
