// A job's settings, typed and with every default applied: what workers and the report writer read
// instead of the wire's JobSpec. The coordinator completes and validates a submitted spec once
// (common/job/job_spec_validation.h); JobConfigFromSpec reads such a spec.
//
// The exact-results rule, stated once: batches are blocks of the rows' positions in the job's order
// (manifest indices; with random_order, positions in its permutation) aligned to multiples of the
// batch size, never crossing a shard; shards are multiples of `batch_alignment` rows; the
// batch size divides `batch_alignment`. So the same images are always evaluated together, with the
// same tensor shapes, whichever worker runs a shard. `batch_alignment` travels in the spec, so the
// rule does not rest on constants agreeing across processes: a worker whose batch size does not
// divide it refuses the job.
#ifndef TALLY_COMMON_JOB_JOB_CONFIG_H_
#define TALLY_COMMON_JOB_JOB_CONFIG_H_

#include <array>
#include <cstdint>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/decode.h"
#include "common/security/data_roots.h"
#include "metrics/catalogue.h"
#include "metrics/label_counts.h"
#include "metrics/lesion.h"
#include "metrics/overlap.h"
#include "metrics/surface_distance.h"
#include "proto/tally.pb.h"

namespace tally {

enum class Precision { kFp32, kBf16, kFp16 };
enum class NonfinitePolicy { kFail, kWarn };

// Where a job's model lives and which backend runs it: `PATH.py` or `PATH.py:ClassName` is a Python
// model (class `Model` by default), anything else TorchScript.
struct ModelRef {
  std::string path;        // The file, without ":ClassName".
  std::string class_name;  // Python models only.
  bool python = false;
};
ModelRef ParseModelRef(const std::string& model);
// `model` with its file made absolute (AbsolutePath), keeping a class name other than the default.
std::string AbsoluteModel(const std::string& model);

// JobConfig::batch_size values besides a fixed size.
inline constexpr int kBatchWorkerDefault = 0;  // Each worker's own (8 on CPU, 32 on CUDA, --batch-size).
inline constexpr int kBatchAuto = -1;          // The largest that fits under max_memory.
// Alignment of jobs that leave the batch size to the workers (or pick it automatically): the
// workers' default batch sizes must divide it.
inline constexpr int kDefaultBatchAlignment = 32;
inline constexpr double kDefaultBatchTimeoutSeconds = 600;

// One --group-by term (docs/reports.md "Groups"): a manifest column, a derived row property
// ("derived:fg_fraction") or a DICOM image's attribute ("dicom:Manufacturer"), each optionally binned into `bins` quantile bins ("NAME:4").
struct GroupBy {
  std::string text;     // As given: the table's name.
  std::string column;   // A manifest column's name, or
  std::string derived;  // a derived property (kDerivedProperties), or
  std::string dicom;    // a DICOM attribute of the image, by keyword ("Manufacturer").
  int bins = 0;         // 0: each value its own group.
};
// The derived row properties (per_image.csv's columns of jobs with groups or slices; ece and
// confidence, the top label's calibration of the row, those of --metrics calibration jobs).
inline constexpr const char* kDerivedProperties[] = {"fg_fraction", "volume_ratio", "components", "pixels",
                                                      "mean_intensity", "ece", "confidence"};
inline constexpr int kFirstCalibrationProperty = 5;
// Prediction manifests with --metrics calibration: the column of each row's probability map.
inline constexpr char kProbabilitiesColumn[] = "probabilities";
// Parses --group-by terms ("site", "derived:fg_fraction:4"); derived properties without a bin count
// are continuous ones binned into 4, except components (a count: each value its own group).
absl::StatusOr<std::vector<GroupBy>> ParseGroupBy(const std::vector<std::string>& terms);

struct JobConfig {
  std::string model;     // Absolute path.
  std::string manifest;  // Absolute path.
  std::string name;
  std::vector<Metric> metrics;  // Canonical order; always holds dice and iou.
  bool calibration = false;     // "calibration" among the metrics (metrics/calibration.h).
  Precision precision = Precision::kFp32;
  // The layout to run: channels_last once fixed ("on"/"off", or "auto" resolved by the coordinator);
  // channels_last_auto while "auto" waits for a worker's trial (worker/pipeline/pipeline.cc).
  bool channels_last = false;
  bool channels_last_auto = false;
  std::string channels_last_mode = "auto";  // As asked: auto | on | off.
  std::string channels_last_trial;          // The trial that resolved "auto".
  // Where JPEG images are decoded (worker/pipeline/gpu_jpeg.h): decode_gpu once fixed ("cpu"/"gpu", or
  // "auto" resolved by the coordinator); decode_auto while "auto" waits for a worker's trial.
  bool decode_gpu = false;
  bool decode_auto = false;
  std::string decode_mode = "cpu";  // As asked: cpu | gpu | auto.
  std::string decode_trial;         // The trial that resolved "auto".
  int batch_size = kBatchWorkerDefault;  // > 0, kBatchWorkerDefault or kBatchAuto.
  int batch_alignment = kDefaultBatchAlignment;
  double max_memory = 0;                 // For kBatchAuto: fraction (<= 1) or GiB (> 1); 0 = 0.9.
  std::vector<float> mean;               // 0 or 3 values (R, G, B) on [0, 1] inputs.
  std::vector<float> std;
  int input_height = 0;                  // > 0: inputs are resized to this size.
  int input_width = 0;
  double spacing_y = 1.0;
  double spacing_x = 1.0;
  double nsd_tolerance = 1.0;
  bool include_background = false;
  int64_t max_image_pixels = int64_t{1} << 28;
  int64_t max_json_file_bytes = kDefaultMaxJsonFileBytes;  // COCO/panoptic JSON files (JobSpec's).
  double batch_timeout_seconds = 600;
  NonfinitePolicy nonfinite = NonfinitePolicy::kFail;
  int ignore_index = 255;                        // kNoIgnoreIndex: every value is a label.
  std::vector<std::pair<int, int>> label_map;    // Stored value -> label, sorted; applied first.
  // Prediction jobs (empty model): the manifest's `prediction` column is scored instead.
  bool predictions() const { return model.empty(); }
  // The 2D surface-distance settings (spacing, nsd tolerance).
  SurfaceOptions surface_options() const { return SurfaceOptions{spacing_y, spacing_x, nsd_tolerance}; }
  // The layout the job runs as the report shows it: "on" or "off", or "auto" while unresolved.
  std::string channels_last_ran() const {
    return channels_last_mode == "auto" && channels_last_auto ? "auto" : channels_last ? "on" : "off";
  }
  // The decoder the job runs as the report shows it: "cpu" or "gpu", or "auto" while unresolved.
  std::string decode_ran() const { return decode_auto ? "auto" : decode_gpu ? "gpu" : "cpu"; }
  int num_classes = 0;                 // Prediction jobs: fixed class count; 0 = from the data.
  double spacing_z = 0;                // > 0: --spacing z,y,x overrides the volumes' headers.
  bool force_spacing = false;          // Use spacing_z/y/x even where it contradicts a header.
  bool spacing_given = false;          // --spacing was given (2 or 3 values).
  std::vector<std::vector<int>> regions;  // Each region: sorted, distinct labels. Empty: classes.
  bool nnunet_summary = false;
  bool json_infinity_string = false;             // report.json writes infinity as "inf".
  // Python model backend.
  std::string python;                            // Interpreter; empty = python3.
  std::vector<std::pair<std::string, std::string>> model_options;  // Sorted by key.
  bool compile = false;                          // Python models: torch.compile (JobSpec.compile).
  std::string compile_resolved;                  // "on" | "off" (declined) once a worker's trial ran.
  v1::CompileTrial compile_trial;                // What that trial measured.
  std::string prediction_store;                  // Absolute folder, or empty (JobSpec.prediction_store).
  bool rescore = false;                          // No model: rows from the store alone (JobSpec.rescore).
  std::string store_model;                       // JobSpec.store_model, store_settings (rescore).
  std::vector<std::string> store_settings;
  int64_t store_max_bytes = 0;                   // JobSpec.store_max_bytes.
  std::vector<std::string> manifest_columns;     // Extra manifest columns the rows carry.
  std::vector<GroupBy> group_by;                 // JobSpec.group_by, parsed.
  int min_group_rows = 20;                       // Smaller groups are marked.
  bool find_slices = false;                      // JobSpec.find_slices.
  // Workers measure each row's properties (ImageResult.properties) and per_image.csv shows them.
  bool row_properties() const { return !group_by.empty() || find_slices; }
  // The DICOM keywords grouped by, in the terms' order (RowProperties.tags holds their values).
  std::vector<std::string> dicom_tags() const {
    std::vector<std::string> out;
    for (const GroupBy& g : group_by) {
      if (!g.dicom.empty() && std::find(out.begin(), out.end(), g.dicom) == out.end()) out.push_back(g.dicom);
    }
    return out;
  }
  bool python_model() const { return ParseModelRef(model).python; }
  // Single-score outputs: the count metrics at each of these thresholds too (sorted, in (0, 1)).
  std::vector<double> thresholds;
  EmptyScore empty_score = EmptyScore::kNaN;
  std::vector<double> iou_thresholds;            // Sorted, in [0, 1].
  double max_failed_fraction = 0;                // In [0, 1]; more failed rows is a warning.
  bool TooManyFailed(int64_t failed, int64_t total) const;
  // Report thumbnails: the worst rows of each class that get one (common/formats/thumbnail.h); 0 = none.
  int thumbnails = 5;
  // Non-empty: workers write every predicted label map into this folder (absolute) as <id>.png.
  std::string save_predictions;
  // COCO jobs (docs/instances.md "Instances"): the instance annotations; rows made from its images
  // (instance_job) or a manifest whose coco_ann_ids name references (referring); detections from
  // coco_results instead of a model. Categories by id, as the coordinator read them at submission.
  std::string coco;
  std::string coco_images;
  std::string coco_results;
  std::string coco_sha256, coco_results_sha256;
  bool coco_results_in_rows = false;  // The rows carry the detections: the file is not read.
  struct CocoCategory {
    int64_t id = 0;
    std::string name;
    bool isthing = true;
  };
  std::vector<CocoCategory> coco_categories;
  // Rows are the annotation file's images and the results are instances (COCO AP).
  bool instance_job() const { return !coco.empty() && manifest.empty(); }
  // Panoptic jobs: rows are the reference panoptic file's annotations (PQ); categories as above.
  std::string coco_panoptic, panoptic_dir, panoptic_predictions, panoptic_predictions_dir;
  bool panoptic_job() const { return !coco_panoptic.empty(); }
  // Lesion-wise metrics (a lesion_ metric selected): connectivity, dilation, min_volume, max_hd95,
  // iou_threshold as metrics/lesion.h; the spacing comes from each row.
  LesionOptions lesion;
  // Volume jobs (docs/volumes.md "Volumes into models"): NIfTI images into a model.
  bool volume_inputs = false;
  bool volume_job() const { return volume_inputs && !model.empty(); }
  std::array<int, 3> sliding_window{};  // z, y, x; all 0: whole volumes.
  double overlap = 0.5;
  int sw_batch_size = 4;
  enum class Intensity { kNone, kZscore, kClip };
  Intensity intensity = Intensity::kNone;
  double clip_low = 0, clip_high = 0;
  std::string intensity_name = "none";  // As given: none | zscore | clip:LO,HI.
  bool keep_dtype = false;
  // 16-bit and DICOM images: --window (docs/data.md "Where your data can be"); not given: NaN.
  Window window;
  // The manifest's 'page' column among manifest_columns (TIFF pages), or -1.
  int page_column = -1;
  // Classes the report treats as foreground: regions all, class 0 only with include_background.
  bool IsForegroundClass(int c) const { return c != 0 || include_background || !regions.empty(); }
};

// True when `failed` of `total` rows is more than `max_failed_fraction` allows (the report's
// warning and `tally`'s exit code 3 both ask this).
bool TooManyFailedRows(int64_t failed, int64_t total, double max_failed_fraction);

// File name of row `index`'s saved prediction (--save-predictions): "<id>.png" when the id is a
// plain file name (no '/', no control character, not "." or "..", at most 200 bytes), else
// "row<index>.png"; volume jobs' end in ".nii.gz".
std::string PredictionFileName(const std::string& id, int64_t index, absl::string_view extension = ".png");

// Reads a spec as the coordinator stored it. Specs stored before a field existed read as its
// default. Errors name the field.
absl::StatusOr<JobConfig> JobConfigFromSpec(const v1::JobSpec& spec);

absl::string_view PrecisionName(Precision p);  // fp32 | bf16 | fp16
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);
absl::string_view NonfiniteName(NonfinitePolicy p);  // fail | warn
absl::StatusOr<NonfinitePolicy> ParseNonfinite(absl::string_view name);

// The batch size a worker uses for `config` given its own default: a fixed size, kBatchAuto, or the
// worker's default when it divides the job's alignment; else FAILED_PRECONDITION saying so.
absl::StatusOr<int> WorkerBatchSize(const JobConfig& config, int worker_default);

}  // namespace tally

#endif  // TALLY_COMMON_JOB_JOB_CONFIG_H_
