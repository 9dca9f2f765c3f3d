#include "common/job/job_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/formats/dicom.h"
#include "common/formats/thumbnail.h"

namespace tally {

absl::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    default: return "fp32";
  }
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name.empty() || name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(absl::StrCat("precision '", name, "' is not one of fp32, bf16, fp16"));
}

absl::string_view NonfiniteName(NonfinitePolicy p) { return p == NonfinitePolicy::kWarn ? "warn" : "fail"; }

absl::StatusOr<NonfinitePolicy> ParseNonfinite(absl::string_view name) {
  if (name.empty() || name == "fail") return NonfinitePolicy::kFail;
  if (name == "warn") return NonfinitePolicy::kWarn;
  return absl::InvalidArgumentError(absl::StrCat("nonfinite '", name, "' is not fail or warn"));
}

ModelRef ParseModelRef(const std::string& model) {
  ModelRef ref;
  ref.path = model;
  const size_t colon = model.rfind(".py:");
  if (colon != std::string::npos && colon + 4 < model.size() && model.find('/', colon) == std::string::npos) {
    ref.path = model.substr(0, colon + 3);
    ref.class_name = model.substr(colon + 4);
    ref.python = true;
  } else if (model.size() > 3 && model.compare(model.size() - 3, 3, ".py") == 0) {
    ref.class_name = "Model";
    ref.python = true;
  }
  return ref;
}

std::string AbsoluteModel(const std::string& model) {
  const ModelRef ref = ParseModelRef(model);
  const std::string path = AbsolutePath(ref.path);
  return ref.python && ref.class_name != "Model" ? absl::StrCat(path, ":", ref.class_name) : path;
}

namespace {

// A job-wide choice between two values that "auto" leaves to the first worker's trial, which the
// coordinator keeps in the spec (`resolved`, `trial`): the memory layout, the JPEG decoder.
struct AutoChoice {
  AutoChoice(const char* field, const char* yes_value, const char* no_value, const char* allowed)
      : field(field), yes_value(yes_value), no_value(no_value), allowed(allowed) {}
  const char* field;
  const char* yes_value;
  const char* no_value;
  const char* allowed;  // For the error.
  std::string mode;     // As asked, lower case.
  bool yes = false;     // The value to run: yes_value (or "auto" resolved to it).
  bool pending = false; // "auto" not resolved yet.
  std::string trial;

  absl::Status Parse(const std::string& asked, const std::string& unset, const std::string& resolved,
                     const std::string& trial_in) {
    mode = asked.empty() ? unset : absl::AsciiStrToLower(asked);
    if (mode == "auto") {
      yes = resolved == yes_value;
      pending = resolved.empty();
      trial = trial_in;
    } else if (mode == yes_value || mode == no_value) {
      yes = mode == yes_value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(field, " '", asked, "' is not one of ", allowed));
    }
    return absl::OkStatus();
  }
};

// How the worker runs the model: precision, the layout and the JPEG decoder (each maybe "auto"),
// the batch size and its alignment.
absl::Status ReadRunnerSettings(const v1::JobSpec& spec, JobConfig* c) {
  ASSIGN_OR_RETURN(c->precision, ParsePrecision(spec.precision()));
  AutoChoice layout{"channels_last_mode", "on", "off", "auto, on, off"};
  RETURN_IF_ERROR(layout.Parse(spec.channels_last_mode(), spec.channels_last() ? "on" : "auto",
                               spec.channels_last_resolved(), spec.channels_last_trial()));
  c->channels_last_mode = layout.mode;
  c->channels_last = layout.yes;
  c->channels_last_auto = layout.pending;
  c->channels_last_trial = layout.trial;
  AutoChoice decode{"decode", "gpu", "cpu", "cpu, gpu, auto"};
  RETURN_IF_ERROR(decode.Parse(spec.decode(), "cpu", spec.decode_resolved(), spec.decode_trial()));
  c->decode_mode = decode.mode;
  c->decode_gpu = decode.yes;
  c->decode_auto = decode.pending;
  c->decode_trial = decode.trial;
  c->batch_size = spec.batch_size();
  if (c->batch_size < kBatchAuto) return absl::InvalidArgumentError("job spec: batch_size must be >= -1");
  c->batch_alignment = spec.batch_alignment() > 0 ? spec.batch_alignment()
                      : spec.batch_size() > 0    ? spec.batch_size()
                                                 : kDefaultBatchAlignment;
  return absl::OkStatus();
}

// Mask conventions: the ignore value and the label map.
absl::Status ReadMaskSettings(const v1::JobSpec& spec, JobConfig* c) {
  if (spec.has_ignore_index()) c->ignore_index = spec.ignore_index();
  if (c->ignore_index < kNoIgnoreIndex || c->ignore_index > kMaxMaskValue) {
    return absl::InvalidArgumentError(absl::StrCat("ignore_index ", c->ignore_index, " is not -1 (none) or 0..",
                                                   kMaxMaskValue));
  }
  for (const auto& [from, to] : spec.label_map()) {
    if (from < 0 || from > kMaxMaskValue || to < 0 || to > kMaxMaskValue) {
      return absl::InvalidArgumentError(absl::StrCat("label_map entry ", from, ":", to, " is outside 0..", kMaxMaskValue));
    }
    c->label_map.emplace_back(from, to);
  }
  std::sort(c->label_map.begin(), c->label_map.end());
  return absl::OkStatus();
}

// The class count, the spacing settings and the regions of prediction jobs.
absl::Status ReadClasses(const v1::JobSpec& spec, JobConfig* c) {
  c->num_classes = spec.num_classes();
  if (c->num_classes < 0 || c->num_classes > kMaxClasses) {
    return absl::InvalidArgumentError(absl::StrCat("num_classes ", c->num_classes, " is not in 0..", kMaxClasses));
  }
  if (spec.spacing_z() < 0) return absl::InvalidArgumentError("spacing must be > 0");
  c->spacing_z = spec.spacing_z();
  c->force_spacing = spec.force_spacing();
  c->spacing_given = spec.spacing_z() > 0 || spec.spacing_y() > 0 || spec.spacing_x() > 0;
  if (spec.regions_size() > kMaxClasses) return absl::InvalidArgumentError("too many regions");
  for (int i = 0; i < spec.regions_size(); ++i) {
    std::vector<int> labels(spec.regions(i).labels().begin(), spec.regions(i).labels().end());
    std::sort(labels.begin(), labels.end());
    labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
    if (labels.empty()) return absl::InvalidArgumentError(absl::StrCat("region ", i + 1, " has no labels"));
    for (int l : labels) {
      if (l < 0 || l > kMaxMaskValue) {
        return absl::InvalidArgumentError(absl::StrCat("region ", i + 1, ": label ", l, " is outside 0..", kMaxMaskValue));
      }
    }
    c->regions.push_back(std::move(labels));
  }
  if (!c->regions.empty() && !c->predictions()) {
    return absl::InvalidArgumentError("regions are for prediction manifests (no model) only");
  }
  return absl::OkStatus();
}

// The probability thresholds of single-score outputs and the IoU thresholds.
absl::Status ReadThresholds(const v1::JobSpec& spec, JobConfig* c) {
  c->thresholds.assign(spec.thresholds().begin(), spec.thresholds().end());
  std::sort(c->thresholds.begin(), c->thresholds.end());
  c->thresholds.erase(std::unique(c->thresholds.begin(), c->thresholds.end()), c->thresholds.end());
  for (double t : c->thresholds) {
    if (!(t > 0 && t < 1)) return absl::InvalidArgumentError(absl::StrCat("threshold ", t, " is not in (0, 1)"));
  }
  if (c->thresholds.size() > 256) return absl::InvalidArgumentError("at most 256 thresholds");
  ASSIGN_OR_RETURN(c->empty_score, ParseEmptyScore(spec.empty_score()));
  c->iou_thresholds.assign(spec.iou_thresholds().begin(), spec.iou_thresholds().end());
  std::sort(c->iou_thresholds.begin(), c->iou_thresholds.end());
  c->iou_thresholds.erase(std::unique(c->iou_thresholds.begin(), c->iou_thresholds.end()), c->iou_thresholds.end());
  for (double t : c->iou_thresholds) {
    if (!(t >= 0 && t <= 1)) return absl::InvalidArgumentError(absl::StrCat("iou threshold ", t, " is not in [0, 1]"));
  }
  if (c->iou_thresholds.size() > 64) return absl::InvalidArgumentError("at most 64 iou thresholds");
  return absl::OkStatus();
}

// What the report may fail on and shows: the failed-row limit, thumbnails, saved predictions.
absl::Status ReadReportSettings(const v1::JobSpec& spec, JobConfig* c) {
  c->max_failed_fraction = spec.max_failed_fraction();
  if (!(c->max_failed_fraction >= 0 && c->max_failed_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("max_failed_fraction ", c->max_failed_fraction, " is not in [0, 1]"));
  }
  if (!c->thresholds.empty() && c->predictions()) {
    return absl::InvalidArgumentError("thresholds are for models with a single-score output, not prediction manifests");
  }
  c->thumbnails = spec.has_thumbnails() ? spec.thumbnails() : kDefaultThumbnails;
  if (c->thumbnails < 0 || c->thumbnails > kMaxThumbnails) {
    return absl::InvalidArgumentError(absl::StrCat("thumbnails ", c->thumbnails, " is not in 0..", kMaxThumbnails));
  }
  c->prediction_store = spec.prediction_store();
  if (c->prediction_store == "off") c->prediction_store.clear();  // Not tallyd's default store either.
  if (!c->prediction_store.empty()) {
    if (c->predictions()) {
      return absl::InvalidArgumentError("prediction_store is for jobs with a model");
    }
    if (c->prediction_store[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("prediction_store '", c->prediction_store, "' is not an absolute path"));
    }
  }
  c->rescore = spec.rescore();
  c->store_model = spec.store_model();
  c->store_settings.assign(spec.store_settings().begin(), spec.store_settings().end());
  c->store_max_bytes = spec.store_max_bytes();
  if (c->store_max_bytes < 0) return absl::InvalidArgumentError("store_max_bytes must be >= 0");
  if (c->rescore && (c->prediction_store.empty() || c->store_model.empty() || c->store_settings.empty())) {
    return absl::InvalidArgumentError("rescore needs prediction_store, store_model and store_settings");
  }
  if (c->store_max_bytes > 0 && c->prediction_store.empty()) {
    return absl::InvalidArgumentError("store_max_bytes is for jobs with a prediction_store");
  }
  c->save_predictions = spec.save_predictions();
  if (!c->save_predictions.empty()) {
    if (c->predictions()) {
      return absl::InvalidArgumentError("save_predictions is for jobs with a model: a prediction manifest's "
                                        "predictions are already files");
    }
    if (c->save_predictions[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("save_predictions '", c->save_predictions, "' is not an absolute path"));
    }
  }
  return absl::OkStatus();
}

// Lesion-wise settings, checked: the errors name the field.
absl::Status ReadLesionSettings(const v1::JobSpec& spec, JobConfig* c) {
  LesionOptions& o = c->lesion;
  o.connectivity = spec.lesion_connectivity();
  if (o.connectivity != 0 && o.connectivity != 4 && o.connectivity != 8 && o.connectivity != 6 &&
      o.connectivity != 18 && o.connectivity != 26) {
    return absl::InvalidArgumentError(absl::StrCat("lesion_connectivity: expected 4 or 8 (2D), 6, 18 or 26 (3D), got ",
                                                   o.connectivity));
  }
  if (spec.has_lesion_dilation()) o.dilation = spec.lesion_dilation();
  if (o.dilation < 0 || o.dilation > 50) {
    return absl::InvalidArgumentError(absl::StrCat("lesion_dilation: expected 0 to 50, got ", o.dilation));
  }
  if (spec.has_lesion_min_volume()) o.min_volume = spec.lesion_min_volume();
  if (!(o.min_volume >= 0) || std::isinf(o.min_volume)) {
    return absl::InvalidArgumentError(absl::StrCat("lesion_min_volume: expected a finite value >= 0, got ", o.min_volume));
  }
  if (spec.has_lesion_max_hd95()) o.max_hd95 = spec.lesion_max_hd95();
  if (!(o.max_hd95 >= 0) || std::isinf(o.max_hd95)) {
    return absl::InvalidArgumentError(absl::StrCat("lesion_max_hd95: expected a finite value >= 0, got ", o.max_hd95));
  }
  o.iou_threshold = spec.lesion_iou();
  if (!(o.iou_threshold >= 0 && o.iou_threshold <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("lesion_iou: expected a value in [0, 1], got ", o.iou_threshold));
  }
  return absl::OkStatus();
}

// Volume jobs' settings, checked: the errors name the field.
absl::Status ReadVolumeSettings(const v1::JobSpec& spec, JobConfig* c) {
  c->volume_inputs = spec.volume_inputs();
  if (spec.sliding_window_size() != 0 && spec.sliding_window_size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("sliding_window: expected 3 sizes (z, y, x), got ",
                                                   spec.sliding_window_size()));
  }
  for (int i = 0; i < spec.sliding_window_size(); ++i) {
    if (spec.sliding_window(i) < 1 || spec.sliding_window(i) > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("sliding_window: sizes are 1..4096, got ", spec.sliding_window(i)));
    }
    c->sliding_window[static_cast<size_t>(i)] = spec.sliding_window(i);
  }
  if (spec.has_overlap()) c->overlap = spec.overlap();
  if (!(c->overlap >= 0 && c->overlap < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("overlap: expected a value in [0, 1), got ", c->overlap));
  }
  if (spec.sw_batch_size() < 0 || spec.sw_batch_size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("sw_batch_size: expected 1..1024, got ", spec.sw_batch_size()));
  }
  if (spec.sw_batch_size() > 0) c->sw_batch_size = spec.sw_batch_size();
  const std::string intensity = absl::AsciiStrToLower(spec.intensity());
  if (intensity.empty() || intensity == "none") {
    c->intensity = JobConfig::Intensity::kNone;
  } else if (intensity == "zscore") {
    c->intensity = JobConfig::Intensity::kZscore;
  } else {
    std::vector<std::string> lohi;
    if (absl::StartsWith(intensity, "clip:")) lohi = absl::StrSplit(intensity.substr(5), ',');
    if (lohi.size() != 2 || !absl::SimpleAtod(lohi[0], &c->clip_low) || !absl::SimpleAtod(lohi[1], &c->clip_high) ||
        !(c->clip_low < c->clip_high) || std::isinf(c->clip_low) || std::isinf(c->clip_high)) {
      return absl::InvalidArgumentError(absl::StrCat("intensity: expected none, zscore or clip:LO,HI with LO < HI, got '",
                                                     spec.intensity(), "'"));
    }
    c->intensity = JobConfig::Intensity::kClip;
  }
  c->intensity_name = intensity.empty() ? "none" : intensity;
  if (spec.window_width() != 0 || spec.window_center() != 0) {
    if (!(spec.window_width() >= 1) || !std::isfinite(spec.window_width()) || !std::isfinite(spec.window_center())) {
      return absl::InvalidArgumentError(absl::StrCat("window: expected a centre and a width >= 1, got ",
                                                     spec.window_center(), ",", spec.window_width()));
    }
    c->window.center = spec.window_center();
    c->window.width = spec.window_width();
  }
  c->keep_dtype = spec.keep_dtype();
  if (c->keep_dtype && c->intensity != JobConfig::Intensity::kNone) {
    return absl::InvalidArgumentError("keep_dtype hands the stored voxels to the model: no intensity preprocessing");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GroupBy>> ParseGroupBy(const std::vector<std::string>& terms) {
  std::vector<GroupBy> out;
  for (const std::string& term : terms) {
    GroupBy g;
    g.text = term;
    std::string name = term;
    // "NAME:K": K quantile bins (a name may itself hold ':' as "derived:x").
    if (const size_t colon = name.rfind(':'); colon != std::string::npos && colon + 1 < name.size() &&
                                                std::all_of(name.begin() + colon + 1, name.end(), ::isdigit)) {
      if (!absl::SimpleAtoi(name.substr(colon + 1), &g.bins) || g.bins < 2 || g.bins > 100) {
        return absl::InvalidArgumentError(absl::StrCat("--group-by '", term, "': bins must be 2 to 100"));
      }
      name = name.substr(0, colon);
    }
    if (absl::StartsWith(name, "derived:")) {
      g.derived = name.substr(8);
      const bool known = std::any_of(std::begin(kDerivedProperties), std::end(kDerivedProperties),
                                     [&](const char* p) { return g.derived == p; });
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat("--group-by '", term, "': no derived property '", g.derived,
                                                       "' (there are fg_fraction, volume_ratio, components, pixels, mean_intensity)"));
      }
      if (g.bins == 0 && g.derived != "components") g.bins = 4;
    } else if (absl::StartsWith(name, "dicom:")) {
      g.dicom = name.substr(6);
      if (!IsDicomKeyword(g.dicom)) {
        return absl::InvalidArgumentError(absl::StrCat("--group-by '", term, "': '", g.dicom,
                                                       "' is not a DICOM attribute keyword (such as Manufacturer, SliceThickness)"));
      }
    } else if (name.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--group-by '", term, "': expected a manifest column (a shard ",
                                                     "sample's JSON field), derived:NAME or dicom:KEYWORD"));
    } else if (name.empty()) {
      return absl::InvalidArgumentError("--group-by: empty term");
    } else {
      g.column = name;
    }
    out.push_back(std::move(g));
  }
  return out;
}

// --metrics calibration needs the model's probabilities: a TorchScript model run on every row.
absl::Status CheckCalibration(const JobConfig& c) {
  if (!c.calibration) return absl::OkStatus();
  std::string why;
  if (c.predictions() && !c.regions.empty()) {
    why = "a probability map gives classes' probabilities, not regions'";
  } else if (c.python_model()) {
    why = "Python models return labels or scores through their own process; calibration is counted for TorchScript models";
  } else if (!c.coco.empty()) {
    why = "COCO instance and panoptic jobs are scored by instances, not per-pixel probabilities";
  }
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--metrics calibration: ", why));
}

absl::StatusOr<JobConfig> JobConfigFromSpec(const v1::JobSpec& spec) {
  JobConfig c;
  c.model = spec.model();
  c.manifest = spec.manifest();
  c.name = spec.name();
  ASSIGN_OR_RETURN(c.metrics, ParseMetricNames({spec.metrics().begin(), spec.metrics().end()}));
  RETURN_IF_ERROR(ReadRunnerSettings(spec, &c));
  c.max_memory = spec.max_memory();
  c.mean.assign(spec.mean().begin(), spec.mean().end());
  c.std.assign(spec.std().begin(), spec.std().end());
  c.input_height = spec.input_height();
  c.input_width = spec.input_width();
  if (spec.spacing_y() > 0) c.spacing_y = spec.spacing_y();
  if (spec.spacing_x() > 0) c.spacing_x = spec.spacing_x();
  c.nsd_tolerance = spec.nsd_tolerance();
  c.include_background = spec.include_background();
  if (spec.max_image_pixels() > 0) c.max_image_pixels = spec.max_image_pixels();
  if (spec.max_json_file_bytes() > 0) c.max_json_file_bytes = spec.max_json_file_bytes();
  if (spec.batch_timeout_seconds() > 0) c.batch_timeout_seconds = spec.batch_timeout_seconds();
  ASSIGN_OR_RETURN(c.nonfinite, ParseNonfinite(spec.nonfinite()));
  RETURN_IF_ERROR(ReadMaskSettings(spec, &c));
  RETURN_IF_ERROR(ReadClasses(spec, &c));
  c.nnunet_summary = spec.nnunet_summary();
  if (spec.json_infinity() != "" && spec.json_infinity() != "number" && spec.json_infinity() != "string") {
    return absl::InvalidArgumentError(absl::StrCat("json_infinity: expected number or string, got '",
                                                   spec.json_infinity(), "'"));
  }
  c.json_infinity_string = spec.json_infinity() == "string";
  c.python = spec.python();
  c.compile = spec.compile();
  c.compile_resolved = spec.compile_resolved();
  c.compile_trial = spec.compile_trial();
  for (const auto& [k, v] : spec.model_options()) c.model_options.emplace_back(k, v);
  std::sort(c.model_options.begin(), c.model_options.end());
  c.manifest_columns.assign(spec.manifest_columns().begin(), spec.manifest_columns().end());
  for (size_t i = 0; i < c.manifest_columns.size(); ++i) {
    if (absl::AsciiStrToLower(c.manifest_columns[i]) == "page") c.page_column = static_cast<int>(i);
  }
  ASSIGN_OR_RETURN(c.group_by, ParseGroupBy({spec.group_by().begin(), spec.group_by().end()}));
  if (spec.min_group_rows() < 0) return absl::InvalidArgumentError("min_group_rows: must not be negative");
  if (spec.min_group_rows() > 0) c.min_group_rows = spec.min_group_rows();
  c.find_slices = spec.find_slices();
  c.coco = spec.coco();
  c.coco_images = spec.coco_images();
  c.coco_results = spec.coco_results();
  c.coco_sha256 = spec.coco_sha256();
  c.coco_results_sha256 = spec.coco_results_sha256();
  c.coco_results_in_rows = spec.coco_results_in_rows();
  c.coco_panoptic = spec.coco_panoptic();
  c.panoptic_dir = spec.panoptic_dir();
  c.panoptic_predictions = spec.panoptic_predictions();
  c.panoptic_predictions_dir = spec.panoptic_predictions_dir();
  for (const v1::CocoCategory& k : spec.coco_categories()) c.coco_categories.push_back({k.id(), k.name(), k.isthing()});
  RETURN_IF_ERROR(ReadThresholds(spec, &c));
  RETURN_IF_ERROR(ReadReportSettings(spec, &c));
  RETURN_IF_ERROR(ReadLesionSettings(spec, &c));
  RETURN_IF_ERROR(ReadVolumeSettings(spec, &c));
  c.calibration = WantsCalibration({spec.metrics().begin(), spec.metrics().end()});
  RETURN_IF_ERROR(CheckCalibration(c));
  for (const GroupBy& g : c.group_by) {
    if (!c.calibration && (g.derived == kDerivedProperties[5] || g.derived == kDerivedProperties[6])) {
      return absl::InvalidArgumentError(absl::StrCat("--group-by '", g.text, "': derived:", g.derived,
                                                     " is the row's calibration: add --metrics calibration"));
    }
  }
  return c;
}

std::string PredictionFileName(const std::string& id, int64_t index, absl::string_view extension) {
  bool plain = !id.empty() && id.size() <= 200 && id != "." && id != "..";
  for (char ch : id) plain = plain && ch != '/' && static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f;
  return plain ? absl::StrCat(id, extension) : absl::StrCat("row", index, extension);
}

bool TooManyFailedRows(int64_t failed, int64_t total, double max_failed_fraction) {
  return failed > 0 && static_cast<double>(failed) > max_failed_fraction * static_cast<double>(total);
}

bool JobConfig::TooManyFailed(int64_t failed, int64_t total) const {
  return TooManyFailedRows(failed, total, max_failed_fraction);
}

absl::StatusOr<int> WorkerBatchSize(const JobConfig& config, int worker_default) {
  if (config.batch_size != kBatchWorkerDefault) return config.batch_size;
  if (worker_default <= 0 || config.batch_alignment % worker_default != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker's batch size ", worker_default, " does not divide the job's batch alignment ",
                     config.batch_alignment, " (results would depend on which worker ran a shard); start the "
                     "worker with a --batch-size that divides ", config.batch_alignment));
  }
  return worker_default;
}

}  // namespace tally
