#include "client/job_flags.h"

#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/flag_util.h"
#include "common/sources/manifest.h"
#include "common/formats/thumbnail.h"
#include "common/job/job_config.h"
#include "common/job/job_spec_validation.h"
#include "metrics/catalogue.h"
#include "base/text.h"

namespace tally {
namespace {

// "1,2;2" -> {{1, 2}, {2}}.
absl::Status ParseRegions(const std::string& text, v1::JobSpec* spec) {
  for (absl::string_view region : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    v1::Region* r = spec->add_regions();
    for (absl::string_view label : absl::StrSplit(region, ',', absl::SkipWhitespace())) {
      int l = 0;
      if (!absl::SimpleAtoi(label, &l) || l < 0 || l > 65534) {
        return absl::InvalidArgumentError(
            absl::StrCat("--regions: expected labels separated by ',' and regions by ';' such as \"1,2;2\", got '",
                         text, "'"));
      }
      r->add_labels(l);
    }
    if (r->labels().empty()) return absl::InvalidArgumentError(absl::StrCat("--regions: empty region in '", text, "'"));
  }
  return absl::OkStatus();
}

// The model, the manifest and what the rows carry: --model, --manifest, --num-classes, --regions,
// --python, --model-option, --label.
absl::Status ModelFlags(const JobFlags& f, const std::string& manifest_path, v1::JobSpec* spec) {
  const bool folders = !f.masks.empty();
  if (manifest_path.empty() && f.coco.empty() && f.coco_panoptic.empty() && f.shards.empty() && !folders) {
    return absl::InvalidArgumentError(
        "--manifest is required (or --shards; or --images and --masks; or, for tally run, --predictions and "
        "--references; or --coco with --images; or --coco-panoptic)");
  }
  if (folders && f.coco_images.empty()) return absl::InvalidArgumentError("--masks needs --images (the images' folder)");
  if (!f.mask_suffix.empty() && !folders) return absl::InvalidArgumentError("--mask-suffix is for --images with --masks");
  if (static_cast<int>(!manifest_path.empty()) + static_cast<int>(!f.shards.empty()) + static_cast<int>(folders) > 1) {
    return absl::InvalidArgumentError("give one of --manifest, --shards and --images/--masks");
  }
  if (f.shards.empty() && (!f.image_ext.empty() || !f.mask_ext.empty() || !f.prediction_ext.empty())) {
    return absl::InvalidArgumentError("--image-ext, --mask-ext and --prediction-ext are for --shards");
  }
  if (folders) {
    spec->set_images_dir(AbsolutePath(f.coco_images));
    spec->set_masks_dir(AbsolutePath(f.masks));
    spec->set_mask_suffix(f.mask_suffix);
  }
  if (!f.shards.empty()) {
    // Relative shard paths are the caller's: made absolute here (a list file's lines are relative
    // to the list file, which tallyd reads).
    spec->add_shards(AbsolutePath(f.shards));  // "./c/a.tar" as "/cwd/c/a.tar".
    for (auto [text, field] : {std::pair<const std::string&, google::protobuf::RepeatedPtrField<std::string>*>{
                                   f.image_ext, spec->mutable_image_extensions()},
                               {f.mask_ext, spec->mutable_mask_extensions()},
                               {f.prediction_ext, spec->mutable_prediction_extensions()}}) {
      for (absl::string_view e : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
        e = absl::StripAsciiWhitespace(e);
        if (!e.empty() && e[0] == '.') e.remove_prefix(1);
        if (!e.empty()) field->Add(std::string(e));
      }
    }
  }
  for (auto [value, field] : {std::pair<const std::string&, std::string*>{f.coco_panoptic, spec->mutable_coco_panoptic()},
                              {f.panoptic_dir, spec->mutable_panoptic_dir()},
                              {f.panoptic_predictions, spec->mutable_panoptic_predictions()},
                              {f.panoptic_predictions_dir, spec->mutable_panoptic_predictions_dir()}}) {
    if (!value.empty()) *field = AbsolutePath(value);
  }
  if (!f.model.empty()) spec->set_model(AbsoluteModel(f.model));
  if (!manifest_path.empty()) spec->set_manifest(AbsolutePath(manifest_path));
  if (!f.coco.empty()) spec->set_coco(AbsolutePath(f.coco));
  if (!f.coco_images.empty() && !folders) spec->set_coco_images(AbsolutePath(f.coco_images));
  if (!f.coco_results.empty()) spec->set_coco_results(AbsolutePath(f.coco_results));
  if (f.coco.empty() && ((!f.coco_images.empty() && !folders) || !f.coco_results.empty())) {
    return absl::InvalidArgumentError("--images and --coco-results need --coco (the instance annotations)");
  }
  if (f.num_classes < 0) return absl::InvalidArgumentError("--num-classes must be >= 0");
  spec->set_num_classes(f.num_classes);
  if (absl::Status s = ParseRegions(f.regions, spec); !s.ok()) return s;
  const bool python_model = ParseModelRef(spec->model()).python;
  if (!spec->model().empty() && (spec->regions_size() > 0 || (spec->num_classes() > 0 && !python_model))) {
    return absl::InvalidArgumentError(
        "--regions and --num-classes are for scoring predictions (no --model) and, --num-classes, for Python models "
        "returning label maps: a TorchScript model's output sets the classes");
  }
  spec->set_python(f.python);
  if (absl::Status s = ParsePairs("model-option", f.model_options, spec->mutable_model_options()); !s.ok()) return s;
  if (absl::Status s = ParsePairs("label", f.labels, spec->mutable_labels()); !s.ok()) return s;
  if (!python_model && (!spec->python().empty() || !f.model_options.empty())) {
    return absl::InvalidArgumentError("--python and --model-option are for Python models (--model PATH.py)");
  }
  spec->set_compile(f.compile);
  if (f.compile && !python_model) {
    return absl::InvalidArgumentError(
        "--compile applies to Python models (--model PATH.py), whose modules Tally compiles with torch.compile; "
        "a TorchScript model is run by LibTorch as it is");
  }
  return absl::OkStatus();
}

// --thresholds and --iou-thresholds.
absl::Status ThresholdFlags(const JobFlags& f, v1::JobSpec* spec) {
  auto thresholds = ParseDoubleList("thresholds", f.thresholds);
  if (!thresholds.ok()) return thresholds.status();
  for (double t : *thresholds) {
    if (!(t > 0 && t < 1)) return absl::InvalidArgumentError(absl::StrCat("--thresholds: ", t, " is not in (0, 1)"));
    spec->add_thresholds(t);
  }
  if (!thresholds->empty() && spec->model().empty()) {
    return absl::InvalidArgumentError("--thresholds is for models with a single-score output, not for prediction manifests");
  }
  auto iou_thresholds = ParseDoubleList("iou-thresholds", f.iou_thresholds);
  if (!iou_thresholds.ok()) return iou_thresholds.status();
  for (double t : *iou_thresholds) {
    if (!(t >= 0 && t <= 1)) return absl::InvalidArgumentError(absl::StrCat("--iou-thresholds: ", t, " is not in [0, 1]"));
    spec->add_iou_thresholds(t);
  }
  return absl::OkStatus();
}

// Lesion-wise metrics: --connectivity, --lesion-dilation, --lesion-min-volume, --lesion-max-hd95,
// --lesion-iou (tallyd checks them again, naming the spec's fields).
absl::Status LesionFlags(const JobFlags& f, v1::JobSpec* spec) {
  const int c = f.connectivity;
  if (c != 0 && c != 4 && c != 8 && c != 6 && c != 18 && c != 26) {
    return absl::InvalidArgumentError(absl::StrCat("--connectivity: expected 4 or 8 (2D), 6, 18 or 26 (3D), got ", c));
  }
  if (f.lesion_dilation < 0 || f.lesion_dilation > 50) {
    return absl::InvalidArgumentError(absl::StrCat("--lesion-dilation: expected 0 to 50, got ", f.lesion_dilation));
  }
  if (!(f.lesion_min_volume >= 0) || !(f.lesion_max_hd95 >= 0) || !(f.lesion_iou >= 0 && f.lesion_iou <= 1)) {
    return absl::InvalidArgumentError("--lesion-min-volume and --lesion-max-hd95 must be >= 0, --lesion-iou in [0, 1]");
  }
  // Only what differs from the defaults is stored: other jobs' specs stay as they were.
  const LesionOptions defaults;
  spec->set_lesion_connectivity(c);
  if (f.lesion_dilation != defaults.dilation) spec->set_lesion_dilation(f.lesion_dilation);
  if (f.lesion_min_volume != defaults.min_volume) spec->set_lesion_min_volume(f.lesion_min_volume);
  if (f.lesion_max_hd95 != defaults.max_hd95) spec->set_lesion_max_hd95(f.lesion_max_hd95);
  spec->set_lesion_iou(f.lesion_iou);
  return absl::OkStatus();
}

// Volume jobs: --sliding-window D,H,W, --overlap, --sw-batch-size, --intensity, --keep-dtype (tallyd
// checks them against the manifest and the model).
absl::Status VolumeFlags(const JobFlags& f, v1::JobSpec* spec) {
  if (!f.sliding_window.empty()) {
    std::vector<std::string> parts = absl::StrSplit(f.sliding_window, ',');
    for (const std::string& p : parts) {
      int v = 0;
      if (parts.size() != 3 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(p), &v) || v < 1 || v > 4096) {
        return absl::InvalidArgumentError(absl::StrCat("--sliding-window: expected D,H,W (3 sizes in 1..4096), got '",
                                                       f.sliding_window, "'"));
      }
      spec->add_sliding_window(v);
    }
    if (ParseModelRef(spec->model()).python || spec->model().empty()) {
      return absl::InvalidArgumentError(
          "--sliding-window is for TorchScript models; a Python model gets whole volumes (and may tile them itself)");
    }
  }
  if (!(f.overlap >= 0 && f.overlap < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--overlap: expected a value in [0, 1), got ", f.overlap));
  }
  if (f.overlap != 0.5) spec->set_overlap(f.overlap);
  if (f.sw_batch_size < 0 || f.sw_batch_size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--sw-batch-size: expected 1..1024, got ", f.sw_batch_size));
  }
  spec->set_sw_batch_size(f.sw_batch_size);
  spec->set_intensity(f.intensity);
  if (!f.window.empty()) {
    auto v = ParseDoubleList("window", f.window);
    if (!v.ok()) return v.status();
    if (v->size() != 2 || !((*v)[1] >= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("--window: expected CENTRE,WIDTH with WIDTH >= 1, got '", f.window,
                                                     "'"));
    }
    spec->set_window_center((*v)[0]);
    spec->set_window_width((*v)[1]);
  }
  spec->set_keep_dtype(f.keep_dtype);
  if (f.keep_dtype && !ParseModelRef(spec->model()).python) {
    return absl::InvalidArgumentError("--keep-dtype is for Python models (TorchScript models take float32 volumes)");
  }
  return absl::OkStatus();
}

// Answers before the end: --order manifest|random[:SEED], --until-ci W, --min-rows N, --sample N|P%.
// --until-ci and --sample imply --order random unless it is given otherwise (tallyd refuses them in
// manifest order).
absl::Status SamplingFlags(const JobFlags& f, v1::JobSpec* spec) {
  const std::string order = absl::AsciiStrToLower(f.order);
  if (order == "random" || absl::StartsWith(order, "random:")) {
    spec->set_random_order(true);
    if (order.size() > 6) {
      uint64_t seed = 0;
      if (!absl::SimpleAtoi(order.substr(7), &seed) || seed == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--order: expected random:SEED with SEED >= 1, got '", f.order, "'"));
      }
      spec->set_order_seed(seed);
    }
  } else if (order != "manifest" && !order.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--order: expected manifest or random[:SEED], got '", f.order, "'"));
  }
  if (!(f.until_ci >= 0 && f.until_ci < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--until-ci: expected a half-width in (0, 1), got ", f.until_ci));
  }
  spec->set_until_ci(f.until_ci);
  if (f.min_rows < 0) return absl::InvalidArgumentError("--min-rows must be >= 0");
  spec->set_min_rows(f.min_rows);
  if (!f.sample.empty()) {
    const std::string s(absl::StripAsciiWhitespace(f.sample));
    double percent = 0;
    int64_t rows = 0;
    if (absl::EndsWith(s, "%")) {
      if (!absl::SimpleAtod(s.substr(0, s.size() - 1), &percent) || !(percent > 0 && percent <= 100)) {
        return absl::InvalidArgumentError(absl::StrCat("--sample: expected N rows or P% (0 < P <= 100), got '", f.sample, "'"));
      }
      spec->set_sample_percent(percent);
    } else if (!absl::SimpleAtoi(s, &rows) || rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--sample: expected N rows (>= 1) or P%, got '", f.sample, "'"));
    } else {
      spec->set_sample_rows(rows);
    }
  }
  if ((f.until_ci > 0 || !f.sample.empty()) && order.empty()) spec->set_random_order(true);
  if (f.canary < 0) return absl::InvalidArgumentError(absl::StrCat("--canary: expected rows >= 0, got ", f.canary));
  spec->set_canary_rows(f.canary);
  spec->set_priority(f.priority);
  const std::string speculate = absl::AsciiStrToLower(f.speculate_after);
  double seconds = 0;
  if (speculate == "off") {
    spec->set_speculate_after(-1);
  } else if (!speculate.empty() && speculate != "auto") {
    if (!absl::SimpleAtod(speculate, &seconds) || !(seconds > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculate-after: expected auto, off or a number of seconds > 0, got '", f.speculate_after, "'"));
    }
    spec->set_speculate_after(seconds);
  }
  return absl::OkStatus();
}

// What the reports hold and how: --empty-score, --max-failed-fraction, --json-infinity,
// --thumbnails, --save-predictions, --nnunet-summary, --force-spacing, --name, --metrics.
absl::Status ReportFlags(const JobFlags& f, v1::JobSpec* spec) {
  const std::string empty_score = absl::AsciiStrToLower(f.empty_score);
  if (empty_score != "nan" && empty_score != "one") {
    return absl::InvalidArgumentError(absl::StrCat("--empty-score: expected nan or one, got '", empty_score, "'"));
  }
  spec->set_empty_score(empty_score);
  if (!(f.max_failed_fraction >= 0 && f.max_failed_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--max-failed-fraction: ", f.max_failed_fraction, " is not in [0, 1]"));
  }
  spec->set_max_failed_fraction(f.max_failed_fraction);
  const std::string infinity = absl::AsciiStrToLower(f.json_infinity);
  if (infinity != "number" && infinity != "string") {
    return absl::InvalidArgumentError(absl::StrCat("--json-infinity: expected number or string, got '", infinity, "'"));
  }
  spec->set_json_infinity(infinity);
  if (f.thumbnails < 0 || f.thumbnails > kMaxThumbnails) {
    return absl::InvalidArgumentError(absl::StrCat("--thumbnails: ", f.thumbnails, " is not in 0..", kMaxThumbnails));
  }
  spec->set_thumbnails(f.thumbnails);
  if (!f.save_predictions.empty()) {
    if (spec->model().empty()) {
      return absl::InvalidArgumentError(
          "--save-predictions is for jobs with a model (--model); a prediction manifest's predictions are files already");
    }
    spec->set_save_predictions(AbsolutePath(f.save_predictions));
  }
  if (!f.prediction_store.empty()) {
    if (spec->model().empty()) {
      return absl::InvalidArgumentError("--prediction-store is for jobs with a model (--model)");
    }
    // "off": not tallyd's default store either.
    spec->set_prediction_store(f.prediction_store == "off" ? "off" : AbsolutePath(f.prediction_store));
  }
  if (!f.store_max_bytes.empty()) {
    if (f.prediction_store.empty() || f.prediction_store == "off") return absl::InvalidArgumentError("--store-max-bytes bounds --prediction-store");
    auto bytes = ParseByteSize("store-max-bytes", f.store_max_bytes);
    if (!bytes.ok()) return bytes.status();
    spec->set_store_max_bytes(*bytes);
  }
  spec->set_nnunet_summary(f.nnunet_summary);
  spec->set_force_spacing(f.force_spacing);
  spec->set_name(f.name);
  // No --metrics: tallyd's defaults for the kind of job (an instance job's leave out hd95).
  if (f.metrics.empty()) return absl::OkStatus();
  auto metrics = ParseMetricList(f.metrics);
  if (!metrics.ok()) return absl::InvalidArgumentError(absl::StrCat("--metrics: ", metrics.status().message()));
  for (Metric m : *metrics) spec->add_metrics(std::string(MetricName(m)));
  if (WantsCalibration(absl::StrSplit(f.metrics, ','))) spec->add_metrics(kCalibrationMetric);
  return absl::OkStatus();
}

// --group-by, --min-group-rows, --find-slices (checked by ValidateJobSpec's JobConfigFromSpec).
absl::Status GroupFlags(const JobFlags& f, v1::JobSpec* spec) {
  for (absl::string_view term : absl::StrSplit(f.group_by, ',', absl::SkipWhitespace())) {
    spec->add_group_by(std::string(absl::StripAsciiWhitespace(term)));
  }
  if (f.min_group_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--min-group-rows: ", f.min_group_rows, " is not a positive count"));
  }
  spec->set_min_group_rows(f.min_group_rows);
  spec->set_find_slices(f.find_slices);
  return absl::OkStatus();
}

// --spacing: sy,sx or sz,sy,sx.
absl::Status SpacingFlag(const std::string& value, v1::JobSpec* spec) {
  if (value.empty()) return absl::OkStatus();
  auto v = ParseDoubleList("spacing", value);
  if (!v.ok()) return v.status();
  bool positive = true;
  for (double x : *v) positive &= x > 0;
  if ((v->size() != 2 && v->size() != 3) || !positive) {
    return absl::InvalidArgumentError("--spacing: expected two positive numbers sy,sx or three sz,sy,sx");
  }
  if (v->size() == 3) spec->set_spacing_z(v->front());
  spec->set_spacing_y((*v)[v->size() - 2]);
  spec->set_spacing_x(v->back());
  return absl::OkStatus();
}

// How rows become batches and inputs: --batch-size, --shard-size, --mean, --std, --input-size,
// --spacing, --nsd-tolerance, --include-background.
absl::Status InputFlags(const JobFlags& f, v1::JobSpec* spec) {
  const std::string batch = absl::AsciiStrToLower(f.batch_size);
  if (batch == "auto") {
    spec->set_batch_size(-1);
  } else if (!batch.empty()) {
    int b = 0;
    if (!absl::SimpleAtoi(batch, &b) || b < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--batch-size: expected a number >= 1 or auto, got '", batch, "'"));
    }
    spec->set_batch_size(b);
  }
  if (f.shard_size < 0) return absl::InvalidArgumentError("--shard-size must be >= 0");
  spec->set_shard_size(f.shard_size);
  for (auto [flag, value, field] : {std::make_tuple("mean", f.mean, spec->mutable_mean()),
                                    std::make_tuple("std", f.std, spec->mutable_std())}) {
    if (value.empty()) continue;
    auto v = ParseFloatList(flag, value);
    if (!v.ok()) return v.status();
    if (v->size() != 1 && v->size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected 1 or 3 values, got ", v->size()));
    }
    for (float x : *v) field->Add(x);
  }
  if (!f.input_size.empty()) {
    auto size = ParseSize("input-size", f.input_size);
    if (!size.ok()) return size.status();
    spec->set_input_height(size->first);
    spec->set_input_width(size->second);
  }
  if (absl::Status s = SpacingFlag(f.spacing, spec); !s.ok()) return s;
  if (f.nsd_tolerance < 0) return absl::InvalidArgumentError("--nsd-tolerance must be >= 0");
  spec->set_nsd_tolerance(f.nsd_tolerance);
  spec->set_include_background(f.include_background);
  return absl::OkStatus();
}

// --channels-last: auto, on or off (a bare flag, and the booleans' spellings, still mean on/off).
absl::Status LayoutFlag(const std::string& value, v1::JobSpec* spec) {
  const std::string layout = absl::AsciiStrToLower(value);
  if (layout == "auto" || layout == "on" || layout == "off") {
    spec->set_channels_last_mode(layout);
  } else if (layout == "true" || layout == "yes" || layout == "1" || layout == "false" || layout == "no" || layout == "0") {
    spec->set_channels_last_mode(layout == "true" || layout == "yes" || layout == "1" ? "on" : "off");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--channels-last: expected auto, on or off, got '", layout, "'"));
  }
  spec->set_channels_last(spec->channels_last_mode() == "on");
  return absl::OkStatus();
}

// --max-memory: a fraction of the GPU (0.8) or GiB (20, 20GiB).
absl::Status MaxMemoryFlag(const std::string& value, v1::JobSpec* spec) {
  std::string mem = absl::AsciiStrToLower(value);
  if (mem.empty()) return absl::OkStatus();
  absl::string_view v = mem;
  bool gib = absl::ConsumeSuffix(&v, "gib") || absl::ConsumeSuffix(&v, "g");
  double x = 0;
  if (!absl::SimpleAtod(v, &x) || !(x > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-memory: expected a fraction such as 0.8 or GiB such as 20 or 20GiB, got '", mem, "'"));
  }
  if (gib && x <= 1) return absl::InvalidArgumentError("--max-memory: at least 1 GiB, or give a fraction");
  spec->set_max_memory(x);
  return absl::OkStatus();
}

// How the worker runs the model: --precision, --channels-last, --decode, --max-memory,
// --max-image-pixels, --batch-timeout, --nonfinite.
absl::Status RunnerFlags(const JobFlags& f, v1::JobSpec* spec) {
  const std::string precision = absl::AsciiStrToLower(f.precision);
  if (precision != "fp32" && precision != "bf16" && precision != "fp16") {
    return absl::InvalidArgumentError(absl::StrCat("--precision: expected fp32, bf16 or fp16, got '", precision, "'"));
  }
  spec->set_precision(precision);
  if (absl::Status s = LayoutFlag(f.channels_last, spec); !s.ok()) return s;
  const std::string decode = absl::AsciiStrToLower(f.decode);
  if (decode != "cpu" && decode != "gpu" && decode != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--decode: expected cpu, gpu or auto, got '", decode, "'"));
  }
  if (decode != "cpu") spec->set_decode(decode);
  if (absl::Status s = MaxMemoryFlag(f.max_memory, spec); !s.ok()) return s;
  if (f.max_image_pixels < 0) return absl::InvalidArgumentError("--max-image-pixels must be >= 0");
  spec->set_max_image_pixels(f.max_image_pixels);
  if (f.batch_timeout < 0) return absl::InvalidArgumentError("--batch-timeout must be >= 0");
  spec->set_batch_timeout_seconds(f.batch_timeout);
  const std::string nonfinite = absl::AsciiStrToLower(f.nonfinite);
  if (nonfinite != "fail" && nonfinite != "warn") {
    return absl::InvalidArgumentError(absl::StrCat("--nonfinite: expected fail or warn, got '", nonfinite, "'"));
  }
  spec->set_nonfinite(nonfinite);
  return absl::OkStatus();
}

// Mask conventions: --ignore-index, --label-map.
absl::Status MaskFlags(const JobFlags& f, v1::JobSpec* spec) {
  const std::string ignore = absl::AsciiStrToLower(f.ignore_index);
  int ignore_index = 0;
  if (ignore == "none") {
    spec->set_ignore_index(-1);
  } else if (absl::SimpleAtoi(ignore, &ignore_index) && ignore_index >= 0 && ignore_index <= 65534) {
    spec->set_ignore_index(ignore_index);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--ignore-index: expected 0..65534 or none, got '", ignore, "'"));
  }
  for (absl::string_view pair : absl::StrSplit(f.label_map, ',', absl::SkipWhitespace())) {
    std::vector<std::string> parts = absl::StrSplit(pair, ':');
    int from = 0, to = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &from) || !absl::SimpleAtoi(parts[1], &to) || from < 0 ||
        to < 0 || from > 65534 || to > 65534) {
      return absl::InvalidArgumentError(absl::StrCat("--label-map: expected VALUE:LABEL pairs such as 0:0,255:1, got '",
                                                     pair, "'"));
    }
    (*spec->mutable_label_map())[from] = to;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParsePairs(const char* flag, const std::vector<std::string>& pairs,
                        google::protobuf::Map<std::string, std::string>* out) {
  for (const std::string& kv : pairs) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected KEY=VALUE, got '", kv, "'"));
    }
    if (FirstInvalidUtf8(kv) >= 0) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": not UTF-8"));
    (*out)[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> SpecFromFlags(const JobFlags& flags, const std::string& manifest) {
  v1::JobSpec spec;
  // In this order: the first wrong flag is the one reported.
  if (absl::Status s = ModelFlags(flags, manifest.empty() ? flags.manifest : manifest, &spec); !s.ok()) return s;
  for (auto step : {ThresholdFlags, ReportFlags, GroupFlags, LesionFlags, VolumeFlags, SamplingFlags, InputFlags, RunnerFlags, MaskFlags}) {
    if (absl::Status s = step(flags, &spec); !s.ok()) return s;
  }
  // The coordinator's checks of the fields, here too: a bad flag is a usage error (exit 2) before
  // anything is started or sent. The files are the coordinator's to find.
  if (absl::StatusOr<v1::JobSpec> checked = ValidateJobSpec(spec, /*check_files=*/false); !checked.ok()) {
    std::string message(checked.status().message());
    if (absl::StartsWith(message, "job spec: ")) message = message.substr(10);
    return absl::InvalidArgumentError(message);
  }
  return spec;
}

}  // namespace tally
