#include "common/job/job_spec_validation.h"

#include <sys/stat.h>

#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "common/formats/decode.h"
#include "common/security/data_roots.h"
#include "common/job/job_config.h"
#include "metrics/overlap.h"
#include "base/status_macros.h"

namespace tally {

namespace {

// Names and paths within their size limits.
absl::Status CheckSizes(const v1::JobSpec& spec) {
  if (spec.name().size() > kMaxJobNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: 'name' is ", spec.name().size(),
                                                   " bytes; the limit is ", kMaxJobNameBytes));
  }
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"model", &spec.model()},
                                     {"manifest", &spec.manifest()},
                                     {"save_predictions", &spec.save_predictions()},
                                     {"prediction_store", &spec.prediction_store()}}) {
    if (value->size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat("job spec: '", field, "' is ", value->size(),
                                                     " bytes; the limit is ", kMaxPathBytes));
    }
  }
  // rescore: a model digest and up to 64 settings digests, each 64 hex digits.
  if (spec.store_settings_size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", spec.store_settings_size(), " store_settings; the limit is 64"));
  }
  std::vector<const std::string*> digests = {&spec.store_model()};
  for (const std::string& s : spec.store_settings()) digests.push_back(&s);
  for (const std::string* d : digests) {
    if (!d->empty() && (d->size() != 64 || d->find_first_not_of("0123456789abcdef") != std::string::npos)) {
      return absl::InvalidArgumentError("job spec: store_model and store_settings are SHA-256 digests (64 hex digits)");
    }
  }
  return absl::OkStatus();
}

// The model file: inside the data roots, present, a file; Python options only for Python models.
// No model: a prediction job, scoring the manifest's `prediction` column (checked with the
// manifest's header).
absl::Status CheckModel(v1::JobSpec* spec, bool check_files) {
  if (!spec->model().empty()) {
    spec->set_model(AbsoluteModel(spec->model()));
    const ModelRef ref = ParseModelRef(spec->model());
    const std::string& path = ref.path;
    // Before anything about the file is looked at: outside the roots, its existence is not told.
    if (check_files && !ProcessDataRoots().Resolve(path).ok()) return OutsideDataRootsError("model", path);
    struct stat st;
    if (!check_files) {
      st.st_mode = S_IFREG;
    } else if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("model file '", path, "' does not exist"));
    }
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("model '", path, "' is a directory, not a ",
                                                     ref.python ? "Python file" : "TorchScript file"));
    }
    if (!ref.python && spec->compile()) {
      return absl::InvalidArgumentError(absl::StrCat("job spec: --compile applies to Python models (PATH.py); '", path,
                                                     "' is TorchScript"));
    }
    if (!ref.python && (!spec->python().empty() || !spec->model_options().empty())) {
      return absl::InvalidArgumentError(absl::StrCat("job spec: --python and --model-option are for Python models "
                                                     "(PATH.py); '", path, "' is TorchScript"));
    }
  } else if (spec->num_classes() == 1) {
    return absl::InvalidArgumentError("job spec: num_classes must be >= 2 (background and one class) or 0 (from the data)");
  }
  return absl::OkStatus();
}

// Labels, normalisation, input size and the numeric settings; defaults filled in.
absl::Status CheckSettings(v1::JobSpec* spec) {
  if (spec->labels_size() > 32) return absl::InvalidArgumentError("job spec: at most 32 labels");
  for (const auto& [key, value] : spec->labels()) {
    if (key.empty() || key.size() > 64 || value.size() > 256) {
      return absl::InvalidArgumentError("job spec: label keys are 1-64 bytes, values at most 256");
    }
  }
  for (auto* field : {spec->mutable_mean(), spec->mutable_std()}) {
    if (field->size() == 1) {
      const float v = field->Get(0);
      field->Add(v);
      field->Add(v);
    }
    if (field->size() != 0 && field->size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: mean/std need 1 or 3 values (R,G,B), got ", field->size()));
    }
  }
  for (float s : spec->std()) {
    if (!(s > 0)) return absl::InvalidArgumentError("job spec: every std value must be > 0");
  }
  if ((spec->input_height() > 0) != (spec->input_width() > 0) || spec->input_height() < 0 || spec->input_width() < 0) {
    return absl::InvalidArgumentError("job spec: input size needs both a height and a width > 0");
  }
  if (spec->batch_size() < -1) return absl::InvalidArgumentError("job spec: batch_size must be >= 1, 0 (default) or -1 (auto)");
  if (spec->shard_size() < 0) return absl::InvalidArgumentError("job spec: shard_size must be >= 0");
  if (spec->spacing_y() < 0 || spec->spacing_x() < 0 || spec->spacing_z() < 0) return absl::InvalidArgumentError("job spec: spacing must be > 0");
  // Spacing stays 0 when not given (JobConfig reads it as 1 for 2D, the header's for volumes).
  if (spec->nsd_tolerance() < 0) return absl::InvalidArgumentError("job spec: nsd_tolerance must be >= 0");
  if (spec->max_memory() < 0) return absl::InvalidArgumentError("job spec: max_memory must be >= 0");
  if (spec->max_image_pixels() < 0) return absl::InvalidArgumentError("job spec: max_image_pixels must be >= 0");
  if (spec->max_image_pixels() == 0) spec->set_max_image_pixels(kDefaultMaxImagePixels);
  if (spec->batch_timeout_seconds() < 0) return absl::InvalidArgumentError("job spec: batch_timeout_seconds must be >= 0");
  if (spec->batch_timeout_seconds() == 0) spec->set_batch_timeout_seconds(kDefaultBatchTimeoutSeconds);
  return absl::OkStatus();
}

// Names (metrics, precision, the non-finite policy) are parsed in one place, JobConfigFromSpec;
// the stored spec gets their canonical forms.
absl::Status Canonicalise(v1::JobSpec* spec, bool check_files) {
  absl::StatusOr<JobConfig> config = JobConfigFromSpec(*spec);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat("job spec: ", config.status().message()));
  spec->clear_metrics();
  for (Metric m : config->metrics) spec->add_metrics(std::string(MetricName(m)));
  if (config->calibration) spec->add_metrics(kCalibrationMetric);
  spec->set_precision(std::string(PrecisionName(config->precision)));
  spec->set_channels_last_mode(config->channels_last_mode);
  spec->set_channels_last(config->channels_last_mode == "on");
  if (config->predictions() && config->decode_mode != "cpu") {
    return absl::InvalidArgumentError("job spec: --decode is for jobs with a model (a prediction job decodes no images)");
  }
  spec->set_decode(config->decode_mode);
  spec->set_nonfinite(std::string(NonfiniteName(config->nonfinite)));
  spec->set_ignore_index(config->ignore_index);
  spec->set_empty_score(std::string(EmptyScoreName(config->empty_score)));
  spec->clear_thresholds();
  for (double t : config->thresholds) spec->add_thresholds(t);
  spec->clear_iou_thresholds();
  for (double t : config->iou_thresholds) spec->add_iou_thresholds(t);
  spec->clear_manifest_columns();  // The coordinator fills it from the manifest's header.
  spec->set_thumbnails(config->thumbnails);
  // Workers write there: with data roots, only inside them (checked again where the files are written).
  if (check_files && !config->save_predictions.empty() && !ProcessDataRoots().Resolve(config->save_predictions).ok()) {
    return OutsideDataRootsError("save_predictions", config->save_predictions);
  }
  if (check_files && !config->prediction_store.empty() && !ProcessDataRoots().Resolve(config->prediction_store).ok()) {
    return OutsideDataRootsError("prediction_store", config->prediction_store);
  }
  return absl::OkStatus();
}

// COCO jobs (docs/instances.md "Instances"): the annotation file (and results) inside the data roots and
// present; rows from its images need an image folder, and a model or a results file.
// Paths a COCO job names: absolute, inside the data roots, present.
absl::Status CheckCocoPaths(std::initializer_list<std::pair<const char*, std::string*>> paths, bool check_files) {
  for (auto [field, value] : paths) {
    if (value->empty()) continue;
    if (value->size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat("job spec: '", field, "' is ", value->size(), " bytes; the limit is ",
                                                     kMaxPathBytes));
    }
    *value = AbsolutePath(*value);
    if (!check_files) continue;
    if (!ProcessDataRoots().Resolve(*value).ok()) return OutsideDataRootsError(field, *value);
    struct stat st;
    if (stat(value->c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("'", *value, "' (", field, ") does not exist"));
    }
  }
  return absl::OkStatus();
}

// The counting metrics by default: a surface distance per category and image costs far more than
// the instances or segments themselves (--metrics adds them).
void CountingMetricsByDefault(v1::JobSpec* spec) {
  if (!spec->metrics().empty()) return;
  for (const char* m : {"dice", "iou", "precision", "recall"}) spec->add_metrics(m);
}

// Panoptic jobs (docs/instances.md "Panoptic quality"): reference and predictions in COCO's panoptic format.
absl::Status CheckPanoptic(v1::JobSpec* spec, bool check_files) {
  if (!spec->model().empty() || !spec->manifest().empty() || !spec->coco().empty()) {
    return absl::InvalidArgumentError(
        "job spec: --coco-panoptic scores panoptic predictions on disk (--panoptic-predictions): no --model, "
        "--manifest or --coco");
  }
  if (spec->panoptic_dir().empty() || spec->panoptic_predictions().empty()) {
    return absl::InvalidArgumentError(
        "job spec: --coco-panoptic needs --panoptic-dir (its PNGs) and --panoptic-predictions (a panoptic JSON)");
  }
  if (spec->panoptic_predictions_dir().empty()) {
    // panopticapi's convention: the PNGs in a folder named as the JSON without ".json".
    std::string dir = spec->panoptic_predictions();
    if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".json") == 0) dir.resize(dir.size() - 5);
    spec->set_panoptic_predictions_dir(dir);
  }
  RETURN_IF_ERROR(CheckCocoPaths({{"coco_panoptic", spec->mutable_coco_panoptic()},
                                  {"panoptic_dir", spec->mutable_panoptic_dir()},
                                  {"panoptic_predictions", spec->mutable_panoptic_predictions()},
                                  {"panoptic_predictions_dir", spec->mutable_panoptic_predictions_dir()}},
                                 check_files));
  CountingMetricsByDefault(spec);
  return absl::OkStatus();
}

// Where a (non-COCO) job's rows come from: a manifest, tar shards or two folders, exactly one.
absl::Status CheckRowSource(v1::JobSpec* spec) {
  spec->clear_tar_starts();  // The coordinator's to set.
  spec->clear_tar_compressed();
  const bool folders = !spec->images_dir().empty() || !spec->masks_dir().empty();
  const int sources = static_cast<int>(!spec->manifest().empty()) + static_cast<int>(spec->shards_size() > 0) +
                      static_cast<int>(folders);
  if (sources == 0) return absl::InvalidArgumentError("job spec: 'manifest' is required (or shards, or images_dir and masks_dir)");
  if (sources > 1) return absl::InvalidArgumentError("job spec: give one of manifest, shards and images_dir/masks_dir");
  if (folders && (spec->images_dir().empty() || spec->masks_dir().empty())) {
    return absl::InvalidArgumentError("job spec: images_dir and masks_dir go together (--images DIR --masks DIR)");
  }
  if (folders && spec->model().empty()) {
    return absl::InvalidArgumentError("job spec: --images/--masks pairs images with masks for a model (--model); to score "
                                      "predictions on disk, use tally run --predictions DIR --references DIR");
  }
  if (spec->shards_size() > 64) return absl::InvalidArgumentError("job spec: more than 64 shard patterns");
  for (const auto* list : {&spec->image_extensions(), &spec->mask_extensions(), &spec->prediction_extensions()}) {
    if (list->size() > 64) return absl::InvalidArgumentError("job spec: more than 64 member extensions");
    for (const std::string& e : *list) {
      if (e.empty() || e.size() > 64 || e.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("job spec: member extension '", e.substr(0, 64),
                                                       "' (expected text like seg.png, without '/')"));
      }
    }
  }
  if (spec->shards_size() == 0 && (spec->image_extensions_size() > 0 || spec->mask_extensions_size() > 0 ||
                                   spec->prediction_extensions_size() > 0)) {
    return absl::InvalidArgumentError("job spec: member extensions are for shards (--shards)");
  }
  if (!folders && !spec->mask_suffix().empty()) {
    return absl::InvalidArgumentError("job spec: mask_suffix (--mask-suffix) is for --images/--masks");
  }
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"images_dir", &spec->images_dir()},
                                     {"masks_dir", &spec->masks_dir()},
                                     {"mask_suffix", &spec->mask_suffix()}}) {
    if (value->size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat("job spec: '", field, "' is longer than ", kMaxPathBytes, " bytes"));
    }
  }
  for (const std::string& s : spec->shards()) {
    if (s.empty() || s.size() > kMaxPathBytes) return absl::InvalidArgumentError("job spec: a shards entry is empty or too long");
  }
  if (spec->client_warnings_size() > 16) return absl::InvalidArgumentError("job spec: more than 16 client warnings");
  for (std::string& w : *spec->mutable_client_warnings()) {
    if (w.size() > 4096) w.resize(4096);
  }
  return absl::OkStatus();
}

absl::Status CheckCoco(v1::JobSpec* spec, bool check_files) {
  spec->clear_coco_categories();
  spec->clear_coco_sha256();
  spec->clear_coco_results_sha256();
  spec->clear_coco_results_in_rows();
  if (!spec->coco_panoptic().empty()) return CheckPanoptic(spec, check_files);
  if (!spec->panoptic_dir().empty() || !spec->panoptic_predictions().empty() ||
      !spec->panoptic_predictions_dir().empty()) {
    return absl::InvalidArgumentError("job spec: --panoptic-dir and --panoptic-predictions need --coco-panoptic");
  }
  if (spec->coco().empty()) {
    if (!spec->coco_results().empty() || !spec->coco_images().empty()) {
      return absl::InvalidArgumentError("job spec: --coco-results and --images need --coco (the instance annotations)");
    }
    return CheckRowSource(spec);
  }
  if (spec->shards_size() > 0 || !spec->images_dir().empty()) {
    return absl::InvalidArgumentError("job spec: --coco takes its rows from the annotation file or a manifest, not "
                                      "--shards or --images/--masks");
  }
  RETURN_IF_ERROR(CheckCocoPaths({{"coco", spec->mutable_coco()},
                                  {"coco_results", spec->mutable_coco_results()},
                                  {"coco_images", spec->mutable_coco_images()}},
                                 check_files));
  if (!spec->coco_results().empty() && !spec->model().empty()) {
    return absl::InvalidArgumentError("job spec: --coco-results scores detections already on disk: give it or --model, not both");
  }
  if (!spec->manifest().empty()) {
    if (!spec->coco_results().empty() || !spec->coco_images().empty()) {
      return absl::InvalidArgumentError(
          "job spec: with a manifest, --coco only resolves its coco_ann_ids column; --coco-results and --images are for "
          "jobs whose rows are the annotation file's images (no --manifest)");
    }
    return absl::OkStatus();
  }
  if (spec->coco_images().empty()) {
    return absl::InvalidArgumentError("job spec: --coco without a manifest needs --images DIR (where images[].file_name are)");
  }
  CountingMetricsByDefault(spec);
  if (spec->model().empty() && spec->coco_results().empty()) {
    return absl::InvalidArgumentError("job spec: --coco needs a model (--model) or detections to score (--coco-results)");
  }
  return absl::OkStatus();
}

// Answers before the end: --order, --until-ci, --min-rows, --sample. A random order without a seed
// gets one here, fixed with the job.
absl::Status CheckSampling(v1::JobSpec* spec) {
  if (!(spec->until_ci() >= 0 && spec->until_ci() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("until_ci (--until-ci): expected a half-width in [0, 1), got ",
                                                   spec->until_ci()));
  }
  if (spec->min_rows() < 0 || spec->sample_rows() < 0) {
    return absl::InvalidArgumentError("min_rows (--min-rows) and sample_rows (--sample) must be >= 0");
  }
  if (!(spec->sample_percent() >= 0 && spec->sample_percent() <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat("sample_percent (--sample P%): expected 0 to 100, got ",
                                                   spec->sample_percent()));
  }
  if (spec->sample_rows() > 0 && spec->sample_percent() > 0) {
    return absl::InvalidArgumentError("sample_rows and sample_percent (--sample): give one");
  }
  const bool sampling = spec->until_ci() > 0 || spec->sample_rows() > 0 || spec->sample_percent() > 0;
  if (sampling && !spec->random_order()) {
    return absl::InvalidArgumentError(
        "--until-ci and --sample need the rows in random order (--order random): a manifest's prefix is not a random "
        "sample");
  }
  if (spec->random_order() && spec->order_seed() == 0) {
    std::random_device device;
    uint64_t seed = 0;
    while (seed == 0) seed = (static_cast<uint64_t>(device()) << 32) ^ device();
    spec->set_order_seed(seed);
  }
  if (!spec->random_order()) spec->clear_order_seed();
  if (!std::isfinite(spec->speculate_after())) return absl::InvalidArgumentError("speculate_after must be finite");
  if (spec->canary_rows() < 0 || spec->canary_rows() > 100000) {
    return absl::InvalidArgumentError("canary_rows (--canary): expected 0 to 100000 rows");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ValidateJobSpec(const v1::JobSpec& in, bool check_files) {
  v1::JobSpec spec = in;
  RETURN_IF_ERROR(CheckCoco(&spec, check_files));
  RETURN_IF_ERROR(CheckSizes(spec));
  RETURN_IF_ERROR(CheckModel(&spec, check_files));
  if (spec.metrics_size() > 64) return absl::InvalidArgumentError("job spec: too many metrics");
  spec.clear_model_sha256();  // The coordinator's to set.
  spec.clear_channels_last_resolved();
  spec.clear_channels_last_trial();
  spec.clear_decode_resolved();
  spec.clear_decode_trial();
  spec.clear_compile_resolved();
  spec.clear_compile_trial();
  spec.clear_manifest_sha256();
  spec.clear_manifest_warnings();
  spec.clear_duplicate_id_rows();
  spec.clear_run_warnings();
  spec.clear_model_option_sha256();
  RETURN_IF_ERROR(CheckSettings(&spec));
  RETURN_IF_ERROR(CheckSampling(&spec));
  RETURN_IF_ERROR(Canonicalise(&spec, check_files));
  // The exact-results rule (common/job/job_config.h): shards are multiples of the alignment, which
  // every batch size used for the job divides.
  // Prediction jobs have no batches: any shard size keeps their results exact.
  spec.set_batch_alignment(spec.model().empty() ? 1
                           : spec.batch_size() > 0 ? spec.batch_size()
                                                   : kDefaultBatchAlignment);
  return spec;
}

}  // namespace tally
