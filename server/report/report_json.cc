#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job/job_config.h"
#include "common/job/rpc.h"
#include "base/json_writer.h"
#include "base/build_info.h"
#include "metrics/bounded_mean.h"
#include "server/report/report_facts.h"
#include "server/report/report_formats.h"

namespace tally {
namespace {
constexpr const char* kVersion = "0.1.0";

// [sy, sx], or [sz, sy, sx] when --spacing gave three. A volume job without --spacing scored each
// volume with its header's: "spacing" is null and "spacings" lists them with their rows.
void SpacingJson(const ReportData& d, JsonWriter& w) {
  const JobConfig& c = d.config;
  const bool from_headers = c.spacing_z <= 0 && !d.spacings.empty();
  if (from_headers) {
    w.Key("spacing").Null();
  } else {
    w.Key("spacing").BeginArray();
    if (c.spacing_z > 0) w.Number(c.spacing_z);
    w.Number(c.spacing_y).Number(c.spacing_x).EndArray();
  }
  if (!c.predictions() && !c.volume_job()) return;
  w.Field("spacing_source", c.spacing_z > 0      ? (c.force_spacing ? "forced" : "flag")
                            : from_headers       ? "header"
                            : c.spacing_given    ? "flag (2D)"
                                                 : "default (2D: 1, 1)");
  if (from_headers) {
    w.Key("spacings").BeginArray();
    for (const auto& [s, rows] : d.spacings) {
      w.BeginObject();
      w.Key("spacing").BeginArray().Number(s[0]).Number(s[1]).Number(s[2]).EndArray();
      w.Field("rows", rows);
      w.EndObject();
    }
    w.EndArray();
  }
}

// How a volume job's model saw each volume (docs/volumes.md "Volumes into models").
void VolumeSettingsJson(const JobConfig& c, JsonWriter& w) {
  if (c.sliding_window[0] > 0) {
    w.Key("sliding_window").BeginArray().Int(c.sliding_window[0]).Int(c.sliding_window[1]).Int(c.sliding_window[2]).EndArray();
    w.Field("overlap", c.overlap);
    w.Field("sw_batch_size", c.sw_batch_size);
  } else {
    w.Key("sliding_window").Null();
  }
  w.Field("intensity", c.intensity_name);
  w.Field("keep_dtype", c.keep_dtype);
}

// --compile (Python models): whether the job ran compiled and the first worker's trial on its
// first batch: both timings, the compile time and the inductor cache, and how far the compiled
// outputs are from eager's (max |difference|, pixels whose argmax changed). null without --compile.
void CompileJson(const JobConfig& c, JsonWriter& w) {
  if (!c.compile) {
    w.Key("compile").Null();
    return;
  }
  const v1::CompileTrial& t = c.compile_trial;
  w.Key("compile").BeginObject();
  w.Field("mode", "on");
  w.Field("ran", c.compile_resolved == "on" ? "compiled" : c.compile_resolved == "off" ? "eager (declined)" : "no trial ran");
  w.Field("batch", static_cast<int64_t>(t.batch()));
  w.Field("compile_seconds", t.compile_seconds());
  w.Field("eager_ms_per_batch", t.eager_ms());
  w.Field("compiled_ms_per_batch", t.compiled_ms());
  w.Field("cache_hits", t.cache_hits());
  w.Field("cache_misses", t.cache_misses());
  w.Field("precompiled", t.precompiled());
  w.Field("max_abs_diff", t.max_abs_diff());
  w.Field("argmax_changed_pixels", t.argmax_changed());
  w.Field("pixels", t.pixels());
  w.Field("note", t.note());
  w.EndObject();
}

// What only a 2D image model's run has: the memory layout and the JPEG decoder.
void ImageModelSettingsJson(const JobConfig& c, JsonWriter& w) {
  // "auto" resolves to "on"/"off" by the first worker's timed trial (TorchScript on CUDA); it
  // stays "auto" where no worker ran one (CPU, Python models).
  w.Field("channels_last_mode", c.channels_last_mode);
  w.Field("channels_last", c.channels_last_ran());
  w.Field("channels_last_trial", c.channels_last_trial);
  // JPEG decoding: "cpu" | "gpu"; "auto" resolves to one of them by the first worker's trial.
  w.Field("decode_mode", c.decode_mode);
  w.Field("decode", c.decode_ran());
  w.Field("decode_trial", c.decode_trial);
  CompileJson(c, w);
}
void Strings(JsonWriter& w, const char* key, const google::protobuf::RepeatedPtrField<std::string>& values) {
  w.Key(key).BeginArray();
  for (const std::string& v : values) w.String(v);
  w.EndArray();
}

// Where the job's rows came from, as `tally verify` rebuilds them to read the files again.
void SourceJson(const v1::JobSpec& spec, JsonWriter& w) {
  w.Key("source").BeginObject();
  const char* kind = !spec.shards().empty()            ? "shards"
                     : !spec.images_dir().empty()      ? "folders"
                     : !spec.coco_panoptic().empty()   ? "panoptic"
                     : spec.manifest().empty() && !spec.coco().empty() ? "coco"
                                                       : "manifest";
  w.Field("kind", kind);
  w.Field("manifest", spec.manifest());
  w.Field("model", !spec.model().empty());
  if (!spec.shards().empty()) {
    Strings(w, "shards", spec.shards());
    Strings(w, "image_extensions", spec.image_extensions());
    Strings(w, "mask_extensions", spec.mask_extensions());
    Strings(w, "prediction_extensions", spec.prediction_extensions());
  }
  if (!spec.images_dir().empty()) {
    w.Field("images", spec.images_dir());
    w.Field("masks", spec.masks_dir());
    w.Field("mask_suffix", spec.mask_suffix());
  }
  if (!spec.coco().empty()) {
    w.Field("coco", spec.coco());
    w.Field("coco_images", spec.coco_images());
  }
  if (!spec.coco_panoptic().empty()) {
    w.Field("coco_panoptic", spec.coco_panoptic());
    w.Field("panoptic_dir", spec.panoptic_dir());
    w.Field("panoptic_predictions", spec.panoptic_predictions());
    w.Field("panoptic_predictions_dir", spec.panoptic_predictions_dir());
  }
  w.Field("digests", "xxh128");
  w.EndObject();
}

// Which rows are scored, in which order, on which workers, and how stored values become pixels:
// with these flags a re-run scores the same rows the same way (docs/reports.md).
void RowChoiceJson(const v1::JobSpec& spec, JsonWriter& w) {
  w.Field("order", spec.random_order() ? "random" : "manifest");
  // A decimal string: exact in every JSON reader (a 64-bit seed is past JavaScript's integers).
  if (spec.random_order()) w.Field("order_seed", absl::StrCat(spec.order_seed()));
  // A sample is the order's prefix: it draws with the order's seed, recorded with it as well.
  if (spec.sample_rows() > 0) {
    w.Key("sample").BeginObject().Field("rows", spec.sample_rows());
    w.Field("seed", absl::StrCat(spec.order_seed())).EndObject();
  } else if (spec.sample_percent() > 0) {
    w.Key("sample").BeginObject().Field("percent", spec.sample_percent());
    w.Field("seed", absl::StrCat(spec.order_seed())).EndObject();
  } else {
    w.Key("sample").Null();
  }
  if (spec.speculate_after() < 0) {
    w.Field("speculate_after", "off");
  } else if (spec.speculate_after() == 0) {
    w.Field("speculate_after", "auto");
  } else {
    w.Field("speculate_after", spec.speculate_after());
  }
  w.Field("canary_rows", spec.canary_rows());
  if (spec.window_width() > 0) {
    w.Key("window").BeginArray().Number(spec.window_center()).Number(spec.window_width()).EndArray();
  } else {
    w.Key("window").Null();
  }
}

// The job's settings, as the report's reader needs them to reproduce it.
void SettingsJson(const ReportData& d, JsonWriter& w) {
  const v1::Job& job = d.record->job;
  const v1::JobSpec& spec = job.spec();
  w.Field("num_classes", d.num_classes);
  w.Key("metrics").BeginArray();
  for (Metric m : d.metrics()) w.String(MetricName(m));
  w.EndArray();
  w.Field("include_background", d.config.include_background);
  SpacingJson(d, w);
  if (d.config.predictions()) w.Field("regions", static_cast<int>(d.config.regions.size()));
  w.Field("nsd_tolerance", d.config.nsd_tolerance);
  if (d.config.volume_job()) VolumeSettingsJson(d.config, w);
  if (!d.config.predictions()) w.Field("precision", PrecisionName(d.config.precision));
  if (!d.config.predictions() && !d.config.volume_job()) ImageModelSettingsJson(d.config, w);
  if (d.record->shard_size > 0) {
    w.Field("shard_size", d.record->shard_size);
  } else {
    w.Key("shard_size").Null();  // A merge of jobs with other shard sizes.
  }
  w.Field("max_image_pixels", d.config.max_image_pixels);
  w.Field("batch_timeout_seconds", d.config.batch_timeout_seconds);
  w.Field("nonfinite", NonfiniteName(d.config.nonfinite));
  if (d.config.ignore_index == kNoIgnoreIndex) {
    w.Key("ignore_index").Null();
  } else {
    w.Field("ignore_index", d.config.ignore_index);
  }
  w.Key("label_map").BeginObject();
  for (const auto& [from, to] : d.config.label_map) w.Field(absl::StrCat(from), to);
  w.EndObject();
  if (!d.config.predictions() && !d.config.volume_job()) {
    if (spec.input_height() > 0) {
      w.Key("input_size").BeginArray().Int(spec.input_height()).Int(spec.input_width()).EndArray();
    } else {
      w.Key("input_size").Null();
    }
  }
  RowChoiceJson(spec, w);
  w.Key("provenance").BeginObject();
  w.Field("tally_version", kTallyVersion).Field("git_revision", kGitRevision);
  w.Field("torch_version", kTorchVersion).Field("cuda_version", kCudaVersion);
  w.Field("model_sha256", job.spec().model_sha256()).Field("manifest_sha256", job.spec().manifest_sha256());
  if (!spec.coco_sha256().empty()) w.Field("annotations_sha256", spec.coco_sha256());
  if (!spec.coco_results_sha256().empty()) w.Field("results_sha256", spec.coco_results_sha256());
  w.EndObject();
}

// Row counts, warnings and every failed row with its reason.
void RowsJson(const ReportData& d, int64_t missing, JsonWriter& w) {
  const v1::Job& job = d.record->job;
  w.Field("images_total", job.images_total());
  w.Field("images_evaluated", d.evaluated);
  // --prediction-store: the folder, and how many evaluated rows were scored from it (no model run).
  const std::string& store = d.record->job.spec().prediction_store();
  if (store.empty()) {
    w.Key("prediction_store").Null();
  } else {
    w.Field("prediction_store", store);
  }
  w.Field("rows_from_store", d.from_store);
  w.Field("images_failed", d.failed);
  w.Field("images_missing", missing);
  w.Field("nonfinite_images", d.nonfinite_images);
  w.Field("inputs_modified_after_submission", d.inputs_modified);
  w.Field("nonfinite_values", d.nonfinite_values);
  w.Key("warnings").BeginArray();
  for (const std::string& warning : d.warnings) w.String(warning);
  w.EndArray();
  w.Field("max_failed_fraction", d.config.max_failed_fraction);
  w.Field("thumbnails", d.config.thumbnails);
  if (!d.config.save_predictions.empty()) w.Field("save_predictions", d.config.save_predictions);
  w.Key("failure_reasons").BeginArray();
  for (const FailureGroup& g : d.failure_groups) {
    w.BeginObject().Field("reason", g.kind).Field("count", g.count).Field("example", g.example).EndObject();
  }
  w.EndArray();
  w.Key("failures").BeginArray();
  for (const Failure& f : d.failures) {
    w.BeginObject().Field("index", f.index).Field("id", f.id).Field("image", f.image).Field("reason", f.reason);
    w.EndObject();
  }
  w.EndArray();
}

// One class (or region): its counts, each selected metric's aggregate, and its worst rows.
void ClassJson(const ReportData& d, const ClassAggregate& ca, JsonWriter& w) {
  w.BeginObject();
  w.Field("class", ca.class_id);
  if (!d.config.regions.empty()) {
    w.Key("region");
    w.BeginArray();
    for (int l : d.config.regions[ca.class_id]) w.Int(l);
    w.EndArray();
    w.Field("name", d.ClassName(ca.class_id));
  }
  w.Field("foreground", d.IsForeground(ca.class_id));
  w.Field("in_foreground_mean", ca.in_foreground_mean);
  w.Field("reference_images", ca.reference_images).Field("predicted_images", ca.predicted_images);
  w.Field("dice_zero_images", ReportData::DiceZeroImages(ca));
  w.Field("images", ca.metrics[static_cast<int>(Metric::kDice)].count);
  w.Field("tp", ca.counts.tp).Field("fp", ca.counts.fp).Field("fn", ca.counts.fn).Field("tn", ca.counts.tn);
  for (Metric m : d.metrics()) {
    const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
    const std::string name(MetricName(m));
    w.Field(name + "_mean", ma.mean);
    w.Field(name + "_inf_count", ma.inf_count);
    if (IsCountMetric(m) || IsLesionMetric(m)) {
      w.Field(name + "_global", ma.global);
    } else {
      w.Field(name + "_median", ma.median);
      w.Field(name + "_p95", ma.p95);
    }
    if (m == Metric::kDice) {  // null where no interval is given (too few rows, not a random sample).
      if (std::isfinite(ca.dice_ci_low) && std::isfinite(ca.dice_ci_high)) {
        w.Key("dice_mean_ci95").BeginArray().Number(ca.dice_ci_low).Number(ca.dice_ci_high).EndArray();
      } else {
        w.Key("dice_mean_ci95").Null();
      }
    }
  }
  // ReLA's Pr@t: the share of images (with a defined IoU) whose IoU is >= t.
  for (size_t t = 0; t < ca.iou_ge.size(); ++t) {
    w.Field(absl::StrCat("iou_ge_", d.config.iou_thresholds[t]), ca.iou_ge[t]);
  }
  // The lowest Dice, by (dice, index); `thumbnail`: report.html shows this row's thumbnail.
  w.Key("worst").BeginArray();
  for (const auto& [dice, index] : ca.worst) {
    w.BeginObject().Field("index", index).Field("id", d.WorstId(index)).Field("image", d.WorstImage(index));
    w.Field("dice", dice);
    const StoredThumbnail* t = d.Thumbnail(ca.class_id, index);
    w.Field("thumbnail", t != nullptr);
    if (t != nullptr && t->slice > 0) w.Field("thumbnail_slice", t->slice);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

// The threshold sweep of a single-score output (foreground class 1); the primary threshold stays 0.5.
void ThresholdsJson(const ReportData& d, JsonWriter& w) {
  w.Key("thresholds").BeginArray();
  for (const ThresholdAggregate& t : d.aggregate.thresholds) {
    w.BeginObject().Field("threshold", t.threshold).Field("dice_mean", t.dice_mean);
    w.Field("dice_global", t.dice_global).Field("iou_mean", t.iou_mean).Field("iou_global", t.iou_global);
    w.EndObject();
  }
  w.EndArray();
  if (d.aggregate.best_threshold >= 0) {
    const ThresholdAggregate& b = d.aggregate.thresholds[static_cast<size_t>(d.aggregate.best_threshold)];
    w.Field("best_threshold", b.threshold);
    w.Field("best_threshold_dice_mean", b.dice_mean);
  } else {
    w.Key("best_threshold").Null();
  }
}

// Each worker's share of the rows and what it measured.
void WorkersJson(const ReportData& d, JsonWriter& w) {
  const v1::Job& job = d.record->job;
  w.Key("workers").BeginArray();
  for (const WorkerRecord& wr : d.workers) {
    const double seconds = std::max(0.0, wr.last_result_unix - wr.first_lease_unix);
    w.BeginObject();
    w.Field("id", wr.worker_id).Field("name", wr.name).Field("device", wr.device);
    w.Field("images", wr.images).Field("seconds", seconds);
    w.Field("gpu_name", wr.stats.gpu_name());
    w.Field("peak_memory_bytes", wr.stats.peak_memory_bytes());
    w.Field("batch_size", wr.stats.batch_size());
    w.Field("oom_retries", wr.stats.oom_retries());
    w.Field("images_per_second", wr.stats.images_per_second() > 0
                                     ? wr.stats.images_per_second()
                                     : (seconds > 0 ? static_cast<double>(wr.images) / seconds : 0.0));
    w.Field("first_batch_seconds",
            wr.stats.first_batch_unix() > 0 ? wr.stats.first_batch_unix() - job.created_unix() : 0.0);
    w.Field("model_load_seconds", wr.stats.model_load_seconds());
    w.Field("decode_threads", wr.stats.decode_threads());
    w.Field("logit_ties", wr.stats.logit_ties());
    // Every GPU the worker owns (--gpus-per-worker), with its peak memory.
    w.Key("gpus").BeginArray();
    for (const v1::GpuStats& g : wr.stats.gpus()) {
      w.BeginObject().Field("device", g.device()).Field("name", g.name());
      w.Field("peak_memory_bytes", g.peak_memory_bytes()).EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
}

// COCO instance jobs: COCOeval's 12 numbers, per category AP and counts, the precision-recall
// curves at IoU 0.5 and 0.75, and the rows with the lowest instance F1.
void InstancesJson(const ReportData& d, JsonWriter& w) {
  const InstanceReport& in = d.instances;
  w.Key("instances").BeginObject();
  w.Field("iou_type", "segm");
  w.Field("annotations", d.record->job.spec().coco());
  w.Field("results", d.record->job.spec().coco_results());
  w.Field("images", in.images);
  w.Key("stats").BeginObject();
  for (int i = 0; i < 12; ++i) w.Field(kCocoStatNames[i], in.stats[i]);
  w.EndObject();
  w.Key("recall_thresholds").BeginArray();
  for (double r : CocoDefaultParams().recall_thresholds) w.Number(r);
  w.EndArray();
  w.Key("categories").BeginArray();
  for (const InstanceCategory& c : in.categories) {
    w.BeginObject().Field("id", c.id).Field("name", c.name);
    w.Field("ap", c.ap).Field("ap50", c.ap50).Field("ap75", c.ap75);
    w.Field("references", c.references).Field("detections", c.detections);
    w.Field("tp50", c.tp50).Field("fp50", c.fp50).Field("fn50", c.fn50);
    for (auto [key, curve] : {std::pair<const char*, const std::vector<double>*>{"precision_iou50", &c.precision50},
                              {"precision_iou75", &c.precision75}}) {
      w.Key(key).BeginArray();
      for (double v : *curve) w.Number(v);
      w.EndArray();
    }
    w.EndObject();
  }
  w.EndArray();
  w.Key("worst_images").BeginArray();
  for (const InstanceReport::Worst& x : in.worst) {
    w.BeginObject().Field("index", x.index).Field("id", d.WorstId(x.index)).Field("image", d.WorstImage(x.index));
    w.Field("f1", x.f1).Field("tp50", x.tp).Field("fp50", x.fp).Field("fn50", x.fn).EndObject();
  }
  w.EndArray();
  w.EndObject();
}

// Panoptic jobs: PQ, SQ, RQ overall, for things and for stuff (n: categories counted; NaN with
// none), and per category (panopticapi's pq_compute).
void PanopticJson(const ReportData& d, JsonWriter& w) {
  const PanopticReport& p = d.panoptic;
  w.Key("panoptic").BeginObject();
  w.Field("reference", d.record->job.spec().coco_panoptic());
  w.Field("predictions", d.record->job.spec().panoptic_predictions());
  w.Field("images", p.images);
  for (auto [key, v] : {std::pair<const char*, const PqValues*>{"all", &p.summary.all},
                        {"things", &p.summary.things}, {"stuff", &p.summary.stuff}}) {
    w.Key(key).BeginObject().Field("pq", v->pq).Field("sq", v->sq).Field("rq", v->rq).Field("n", v->n).EndObject();
  }
  w.Key("categories").BeginArray();
  for (size_t i = 0; i < p.summary.per_category.size() && i < p.categories.size(); ++i) {
    const PanopticCategoryResult& c = p.summary.per_category[i];
    w.BeginObject().Field("id", c.category_id).Field("name", p.categories[i].name);
    w.Field("isthing", p.categories[i].isthing).Field("pq", c.pq).Field("sq", c.sq).Field("rq", c.rq);
    w.Field("tp", c.tp).Field("fp", c.fp).Field("fn", c.fn).Field("iou_sum", c.iou_sum).EndObject();
  }
  w.EndArray();
  w.EndObject();
}

}  // namespace

std::string ReportJson(const ReportData& d) {
  const v1::Job& job = d.record->job;
  const v1::JobSpec& spec = job.spec();
  JsonWriter w(true, d.config.json_infinity_string);
  w.BeginObject();
  w.Field("tally_version", kVersion);
  w.Field("job_id", job.job_id());
  w.Field("name", spec.name());
  w.Field("state", JobStateName(job.state()));
  // A sampled job's other rows are accounted for: not evaluated (sample), not missing.
  const int64_t not_evaluated = job.sampled().empty() ? 0 : job.images_total() - d.evaluated - d.failed;
  const int64_t missing = job.images_total() - d.evaluated - d.failed - not_evaluated;
  w.Field("complete", job.state() == v1::JOB_STATE_SUCCEEDED && missing == 0 && spec.incomplete_sources().empty());
  if (!spec.incomplete_sources().empty()) {
    w.Key("incomplete_sources");
    w.BeginArray();
    for (const std::string& why : spec.incomplete_sources()) w.String(why);
    w.EndArray();
  }
  w.Field("error", job.error());
  w.Field("model", spec.model());
  w.Field("manifest", spec.manifest());
  SourceJson(spec, w);
  SettingsJson(d, w);
  RowsJson(d, missing, w);
  if (!job.sampled().empty()) {
    w.Field("sampled", job.sampled());
    w.Field("images_not_evaluated", not_evaluated);
    w.Field("not_evaluated_reason", "not evaluated (sample)");
  }
  w.Field("dice_mean_ci95_method", IntervalMethod(d.interval));
  w.Field("dice_mean_ci95_min_rows", kMinIntervalRows);
  if (spec.until_ci() > 0) {
    w.Key("until_ci").BeginObject().Field("half_width", spec.until_ci());
    w.Field("note", d.until_ci_note);
    w.Field("min_rows", spec.min_rows() > 0 ? spec.min_rows() : int64_t{100});  // 0: kDefaultMinRows.
    w.Field("reached", !job.sampled().empty()).EndObject();
  }
  w.Key("classes").BeginArray();
  for (const ClassAggregate& ca : d.aggregate.classes) ClassJson(d, ca, w);
  w.EndArray();
  for (Metric m : d.metrics()) {
    w.Field(absl::StrCat("foreground_", MetricName(m), "_mean"), d.aggregate.foreground_mean[static_cast<int>(m)]);
  }
  w.Field("empty_score", EmptyScoreName(d.config.empty_score));
  if (!d.aggregate.thresholds.empty()) ThresholdsJson(d, w);
  if (d.instances.present) InstancesJson(d, w);
  if (d.panoptic.present) PanopticJson(d, w);
  GroupsJson(d, w);
  CalibrationJson(d, w);
  WorkersJson(d, w);
  w.Field("created_unix", job.created_unix());
  w.Field("finished_unix", job.finished_unix());
  w.Field("wall_seconds", d.wall_seconds);  // Submission to the last result (images_per_second's time).
  const Throughputs t = JobThroughputs(d);
  w.Key("throughput").BeginObject();
  w.Field("since_submission_rows_per_second", t.since_submission).Field("since_submission_seconds", t.seconds_since_submission);
  w.Field("since_first_lease_rows_per_second", t.since_first_lease)
      .Field("since_first_lease_seconds", t.seconds_since_first_lease);
  w.Field("workers_rows_per_second", t.workers);
  w.EndObject();
  w.Field("images_per_second",
          d.wall_seconds > 0 ? static_cast<double>(d.evaluated + d.failed) / d.wall_seconds : 0.0);
  w.EndObject();
  return w.str() + "\n";
}

}  // namespace tally
