// tally: the command-line client.
//
//   tally run --model model.pt --manifest data/manifest.csv --out results/ --workers 3
//   tally run --model model.pt --manifest data/manifest.csv --out results/ --gpus all
//   tally submit --server host:50051 --model /abs/model.pt --manifest /abs/manifest.csv
//   tally watch|status|cancel|report JOB_ID --server host:50051 [--out DIR]
//   tally jobs --server host:50051
//
// Flags accept dashes or underscores. See README "CLI" for every flag.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/flags/marshalling.h"
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "google/protobuf/util/json_util.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/folder_pairs.h"
#include "client/gpus.h"
#include "client/local_run.h"
#include "client/progress.h"
#include "common/security/auth_tokens.h"
#include "common/base/clock.h"
#include "common/base/file_util.h"
#include "common/base/flag_util.h"
#include "common/process/gpu_inventory.h"
#include "common/job/job_config.h"
#include "common/io/manifest.h"
#include "metrics/overlap.h"
#include "common/process/subprocess.h"
#include "common/io/thumbnail.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "tallyd address (host:port) for submit/watch/status/...");
// Security (SECURITY.md).
ABSL_FLAG(std::string, tls_ca, "", "Connect with TLS, trusting this CA for tallyd's certificate");
ABSL_FLAG(std::string, tls_cert, "", "Client certificate for mutual TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "Private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "", "Name to check tallyd's certificate against (default: the host of --server)");
ABSL_FLAG(std::string, token_file, "", "File holding your token (default: the TALLY_TOKEN environment variable)");
ABSL_FLAG(std::string, tokens_file, "", "tally token: append the new token's line to this --auth-tokens file");
// Job spec.
ABSL_FLAG(std::string, model, "", "TorchScript model file (none: score the manifest's prediction column)");
ABSL_FLAG(std::string, manifest, "", "Manifest CSV (columns image, mask[, id]; or mask, prediction[, id])");
ABSL_FLAG(std::string, name, "", "Job label");
ABSL_FLAG(std::string, metrics, "dice,iou,precision,recall,hd95", "Comma list of metrics, or all");
ABSL_FLAG(std::string, batch_size, "", "Images per forward pass, or auto (default: 8 on CPU, 32 on GPU)");
ABSL_FLAG(int, shard_size, 0, "Rows per shard (0 = automatic)");
ABSL_FLAG(std::string, mean, "", "Per-channel mean on [0,1] inputs, e.g. 0.485,0.456,0.406");
ABSL_FLAG(std::string, std, "", "Per-channel std, e.g. 0.229,0.224,0.225");
ABSL_FLAG(std::string, input_size, "", "Resize inputs to HxW (bilinear) before the model");
ABSL_FLAG(std::string, spacing, "",
          "Spacing for surface distances: sy,sx (2D, default 1,1) or sz,sy,sx (3D, default: the NIfTI header)");
ABSL_FLAG(bool, force_spacing, false, "Use --spacing z,y,x even where it contradicts a volume's header");
ABSL_FLAG(int, num_classes, 0, "Predictions: number of classes (0 = the largest label in the set plus one)");
ABSL_FLAG(std::string, regions, "", "Predictions: evaluate regions (unions of labels) instead of classes, e.g. \"1,2;2\"");
ABSL_FLAG(bool, nnunet_summary, false, "Also write summary.json in nnU-Net v2's layout");
ABSL_FLAG(std::string, predictions, "", "tally run: folder of predictions, paired by file name with --references");
ABSL_FLAG(std::string, references, "", "tally run: folder of reference masks (nnU-Net's folder convention)");
ABSL_FLAG(std::string, file_ending, ".nii.gz", "tally run --predictions: the files to pair, by ending");
ABSL_FLAG(double, nsd_tolerance, 1.0, "Tolerance for nsd, in the units of the spacing");
ABSL_FLAG(bool, include_background, false, "Count class 0 in the foreground means");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 (autocast)");
ABSL_FLAG(std::string, channels_last, "auto",
          "auto (a timed trial on the first batch picks the faster layout; TorchScript on CUDA), on or off; "
          "a bare --channels-last means on");
ABSL_FLAG(std::string, decode, "cpu",
          "Where JPEG images are decoded: cpu (libjpeg-turbo: the same pixels on every machine), gpu (nvJPEG: "
          "pixels differ by a few levels) or auto (gpu when the CPU decoders cannot keep up with the model)");
ABSL_FLAG(std::string, max_memory, "", "With --batch-size auto: fraction of GPU memory (0.8) or GiB (20)");
ABSL_FLAG(int64_t, max_image_pixels, 0, "Images/masks declaring more pixels fail their row (0 = 2^28)");
ABSL_FLAG(double, batch_timeout, 0, "Seconds a decode or forward pass may take before its rows fail (0 = 600)");
ABSL_FLAG(std::string, nonfinite, "fail", "Rows whose model output has NaN/Inf: fail, or warn (evaluate them)");
ABSL_FLAG(std::string, ignore_index, "255", "Mask value that leaves every count, or none");
ABSL_FLAG(std::string, label_map, "", "Mask value -> label before anything else, e.g. 0:0,255:1");
// Python models and referring-segmentation conventions.
ABSL_FLAG(std::string, python, "", "Python models: the interpreter on the worker hosts (default python3)");
ABSL_FLAG(std::string, thresholds, "", "Single-score outputs: also count at these probability thresholds, e.g. 0.3,0.5,0.7");
ABSL_FLAG(std::string, empty_score, "nan", "dice/iou of an image whose prediction and reference are both empty: nan or one");
ABSL_FLAG(std::string, iou_thresholds, "", "Per class, the share of images with IoU >= t, e.g. 0.5,0.7,0.9");
ABSL_FLAG(std::string, json_infinity, "number",
          "How report.json writes infinity: number (1e999) or string (\"inf\", for jq and other strict tools)");
ABSL_FLAG(double, max_failed_fraction, 0,
          "More failed rows than this share of the manifest: a warning, and exit code 3 (0 = any failed row)");
ABSL_FLAG(int, thumbnails, 5, "report.html: thumbnails of this many worst images per class (0-10; 0 = none)");
ABSL_FLAG(std::string, save_predictions, "",
          "Models: write every predicted label map into this folder on the worker hosts, as <id>.png");
ABSL_FLAG(int, gpus_per_worker, 1, "tally run --gpus: GPUs per worker (Python models spread over them)");
// tally run.
ABSL_FLAG(std::string, out, "", "Output folder for the reports");
ABSL_FLAG(int, workers, 1, "tally run: number of CPU workers");
ABSL_FLAG(std::string, gpus, "", "tally run: all or 0,1,... (one worker per GPU)");
ABSL_FLAG(double, lease_seconds, 5.0, "tally run: a worker silent this long loses its shards");
ABSL_FLAG(bool, count_logit_ties, false, "tally run: workers count pixels whose top two logits tie");
ABSL_FLAG(int, worker_threads, 0, "tally run: decode threads per worker (0 = its share of the cores)");
ABSL_FLAG(std::vector<std::string>, worker_flags, {},
          "tally run: extra tally-worker flags, comma-separated, e.g. --worker-flags=--gpu-memory-limit-gib=8");
// tally estimate.
ABSL_FLAG(int, max_batch, 0, "tally estimate: largest batch size to try (0 = 512 on a GPU, 16 on CPU)");
// Listing.
ABSL_FLAG(int, limit, 20, "tally jobs: how many jobs to list");
ABSL_FLAG(std::string, page_token, "", "tally jobs: continue after this job id (printed at the end of a page)");
ABSL_FLAG(std::string, state, "", "tally jobs: only jobs in this state (queued, running, succeeded, failed, cancelled)");
// Scripting.
ABSL_FLAG(bool, json, false, "Print JSON (one object; watch: one per line) instead of text");
ABSL_FLAG(double, timeout, 0, "watch/wait: give up after this many seconds with exit code 6 (0 = never)");

namespace {

std::string g_verb;  // The verb being run, for usage errors.

// A usage error: exit code 2, with where to look.
int Usage(const std::string& error) {
  std::cerr << "tally: " << error << "\n";
  std::cerr << (g_verb.empty() ? std::string("`tally help` lists the verbs") : "`tally " + g_verb + " --help` lists its flags")
            << "\n";
  return tally::kExitUsage;
}

// "1,2;2" -> {{1, 2}, {2}}.
absl::Status ParseRegions(const std::string& text, tally::v1::JobSpec* spec) {
  for (absl::string_view region : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    tally::v1::Region* r = spec->add_regions();
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

// `manifest`: the manifest to use instead of --manifest (tally run --predictions).
// Values of the repeatable --model-option KEY=VALUE and --label KEY=VALUE, taken out of argv
// before Abseil parses it.
std::vector<std::string> model_options;
std::vector<std::string> labels;

// KEY=VALUE pairs of a repeatable flag into a map.
absl::Status ParsePairs(const char* flag, const std::vector<std::string>& pairs,
                        google::protobuf::Map<std::string, std::string>* out) {
  for (const std::string& kv : pairs) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected KEY=VALUE, got '", kv, "'"));
    }
    if (tally::FirstInvalidUtf8(kv) >= 0) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": not UTF-8"));
    (*out)[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<tally::v1::JobSpec> SpecFromFlags(const std::string& manifest = "") {
  tally::v1::JobSpec spec;
  const std::string manifest_path = manifest.empty() ? absl::GetFlag(FLAGS_manifest) : manifest;
  if (manifest_path.empty()) {
    return absl::InvalidArgumentError("--manifest is required (or, for tally run, --predictions and --references)");
  }
  if (!absl::GetFlag(FLAGS_model).empty()) spec.set_model(tally::AbsoluteModel(absl::GetFlag(FLAGS_model)));
  spec.set_manifest(tally::AbsolutePath(manifest_path));
  if (absl::GetFlag(FLAGS_num_classes) < 0) return absl::InvalidArgumentError("--num-classes must be >= 0");
  spec.set_num_classes(absl::GetFlag(FLAGS_num_classes));
  if (absl::Status s = ParseRegions(absl::GetFlag(FLAGS_regions), &spec); !s.ok()) return s;
  const bool python_model = tally::ParseModelRef(spec.model()).python;
  if (!spec.model().empty() && (spec.regions_size() > 0 || (spec.num_classes() > 0 && !python_model))) {
    return absl::InvalidArgumentError(
        "--regions and --num-classes are for scoring predictions (no --model) and, --num-classes, for Python models "
        "returning label maps: a TorchScript model's output sets the classes");
  }
  spec.set_python(absl::GetFlag(FLAGS_python));
  if (absl::Status s = ParsePairs("model-option", model_options, spec.mutable_model_options()); !s.ok()) return s;
  if (absl::Status s = ParsePairs("label", labels, spec.mutable_labels()); !s.ok()) return s;
  if (!python_model && (!spec.python().empty() || !model_options.empty())) {
    return absl::InvalidArgumentError("--python and --model-option are for Python models (--model PATH.py)");
  }
  auto thresholds = tally::ParseDoubleList("thresholds", absl::GetFlag(FLAGS_thresholds));
  if (!thresholds.ok()) return thresholds.status();
  for (double t : *thresholds) {
    if (!(t > 0 && t < 1)) return absl::InvalidArgumentError(absl::StrCat("--thresholds: ", t, " is not in (0, 1)"));
    spec.add_thresholds(t);
  }
  if (!thresholds->empty() && spec.model().empty()) {
    return absl::InvalidArgumentError("--thresholds is for models with a single-score output, not for prediction manifests");
  }
  auto iou_thresholds = tally::ParseDoubleList("iou-thresholds", absl::GetFlag(FLAGS_iou_thresholds));
  if (!iou_thresholds.ok()) return iou_thresholds.status();
  for (double t : *iou_thresholds) {
    if (!(t >= 0 && t <= 1)) return absl::InvalidArgumentError(absl::StrCat("--iou-thresholds: ", t, " is not in [0, 1]"));
    spec.add_iou_thresholds(t);
  }
  const std::string empty_score = absl::AsciiStrToLower(absl::GetFlag(FLAGS_empty_score));
  if (empty_score != "nan" && empty_score != "one") {
    return absl::InvalidArgumentError(absl::StrCat("--empty-score: expected nan or one, got '", empty_score, "'"));
  }
  spec.set_empty_score(empty_score);
  const double max_failed = absl::GetFlag(FLAGS_max_failed_fraction);
  if (!(max_failed >= 0 && max_failed <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--max-failed-fraction: ", max_failed, " is not in [0, 1]"));
  }
  spec.set_max_failed_fraction(max_failed);
  const std::string infinity = absl::AsciiStrToLower(absl::GetFlag(FLAGS_json_infinity));
  if (infinity != "number" && infinity != "string") {
    return absl::InvalidArgumentError(absl::StrCat("--json-infinity: expected number or string, got '", infinity, "'"));
  }
  spec.set_json_infinity(infinity);
  const int thumbnails = absl::GetFlag(FLAGS_thumbnails);
  if (thumbnails < 0 || thumbnails > tally::kMaxThumbnails) {
    return absl::InvalidArgumentError(
        absl::StrCat("--thumbnails: ", thumbnails, " is not in 0..", tally::kMaxThumbnails));
  }
  spec.set_thumbnails(thumbnails);
  if (const std::string save = absl::GetFlag(FLAGS_save_predictions); !save.empty()) {
    if (spec.model().empty()) {
      return absl::InvalidArgumentError(
          "--save-predictions is for jobs with a model (--model); a prediction manifest's predictions are files already");
    }
    spec.set_save_predictions(tally::AbsolutePath(save));
  }
  spec.set_nnunet_summary(absl::GetFlag(FLAGS_nnunet_summary));
  spec.set_force_spacing(absl::GetFlag(FLAGS_force_spacing));
  spec.set_name(absl::GetFlag(FLAGS_name));
  auto metrics = tally::ParseMetricList(absl::GetFlag(FLAGS_metrics));
  if (!metrics.ok()) return absl::InvalidArgumentError(absl::StrCat("--metrics: ", metrics.status().message()));
  for (tally::Metric m : *metrics) spec.add_metrics(std::string(tally::MetricName(m)));
  const std::string batch = absl::AsciiStrToLower(absl::GetFlag(FLAGS_batch_size));
  if (batch == "auto") {
    spec.set_batch_size(-1);
  } else if (!batch.empty()) {
    int b = 0;
    if (!absl::SimpleAtoi(batch, &b) || b < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--batch-size: expected a number >= 1 or auto, got '", batch, "'"));
    }
    spec.set_batch_size(b);
  }
  if (absl::GetFlag(FLAGS_shard_size) < 0) return absl::InvalidArgumentError("--shard-size must be >= 0");
  spec.set_shard_size(absl::GetFlag(FLAGS_shard_size));
  for (auto [flag, value, field] : {std::make_tuple("mean", absl::GetFlag(FLAGS_mean), spec.mutable_mean()),
                                    std::make_tuple("std", absl::GetFlag(FLAGS_std), spec.mutable_std())}) {
    if (value.empty()) continue;
    auto v = tally::ParseFloatList(flag, value);
    if (!v.ok()) return v.status();
    if (v->size() != 1 && v->size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected 1 or 3 values, got ", v->size()));
    }
    for (float x : *v) field->Add(x);
  }
  if (!absl::GetFlag(FLAGS_input_size).empty()) {
    auto size = tally::ParseSize("input-size", absl::GetFlag(FLAGS_input_size));
    if (!size.ok()) return size.status();
    spec.set_input_height(size->first);
    spec.set_input_width(size->second);
  }
  if (!absl::GetFlag(FLAGS_spacing).empty()) {
    auto v = tally::ParseDoubleList("spacing", absl::GetFlag(FLAGS_spacing));
    if (!v.ok()) return v.status();
    bool positive = true;
    for (double x : *v) positive &= x > 0;
    if ((v->size() != 2 && v->size() != 3) || !positive) {
      return absl::InvalidArgumentError("--spacing: expected two positive numbers sy,sx or three sz,sy,sx");
    }
    if (v->size() == 3) spec.set_spacing_z(v->front());
    spec.set_spacing_y((*v)[v->size() - 2]);
    spec.set_spacing_x(v->back());
  }
  if (absl::GetFlag(FLAGS_nsd_tolerance) < 0) return absl::InvalidArgumentError("--nsd-tolerance must be >= 0");
  spec.set_nsd_tolerance(absl::GetFlag(FLAGS_nsd_tolerance));
  spec.set_include_background(absl::GetFlag(FLAGS_include_background));
  const std::string precision = absl::AsciiStrToLower(absl::GetFlag(FLAGS_precision));
  if (precision != "fp32" && precision != "bf16" && precision != "fp16") {
    return absl::InvalidArgumentError(absl::StrCat("--precision: expected fp32, bf16 or fp16, got '", precision, "'"));
  }
  spec.set_precision(precision);
  const std::string layout = absl::AsciiStrToLower(absl::GetFlag(FLAGS_channels_last));
  if (layout == "auto" || layout == "on" || layout == "off") {
    spec.set_channels_last_mode(layout);
  } else if (layout == "true" || layout == "yes" || layout == "1" || layout == "false" || layout == "no" || layout == "0") {
    spec.set_channels_last_mode(layout == "true" || layout == "yes" || layout == "1" ? "on" : "off");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--channels-last: expected auto, on or off, got '", layout, "'"));
  }
  spec.set_channels_last(spec.channels_last_mode() == "on");
  const std::string decode = absl::AsciiStrToLower(absl::GetFlag(FLAGS_decode));
  if (decode != "cpu" && decode != "gpu" && decode != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--decode: expected cpu, gpu or auto, got '", decode, "'"));
  }
  if (decode != "cpu") spec.set_decode(decode);
  std::string mem = absl::AsciiStrToLower(absl::GetFlag(FLAGS_max_memory));
  if (!mem.empty()) {
    absl::string_view v = mem;
    bool gib = absl::ConsumeSuffix(&v, "gib") || absl::ConsumeSuffix(&v, "g");
    double x = 0;
    if (!absl::SimpleAtod(v, &x) || !(x > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max-memory: expected a fraction such as 0.8 or GiB such as 20 or 20GiB, got '", mem, "'"));
    }
    if (gib && x <= 1) return absl::InvalidArgumentError("--max-memory: at least 1 GiB, or give a fraction");
    spec.set_max_memory(x);
  }
  if (absl::GetFlag(FLAGS_max_image_pixels) < 0) return absl::InvalidArgumentError("--max-image-pixels must be >= 0");
  spec.set_max_image_pixels(absl::GetFlag(FLAGS_max_image_pixels));
  if (absl::GetFlag(FLAGS_batch_timeout) < 0) return absl::InvalidArgumentError("--batch-timeout must be >= 0");
  spec.set_batch_timeout_seconds(absl::GetFlag(FLAGS_batch_timeout));
  const std::string nonfinite = absl::AsciiStrToLower(absl::GetFlag(FLAGS_nonfinite));
  if (nonfinite != "fail" && nonfinite != "warn") {
    return absl::InvalidArgumentError(absl::StrCat("--nonfinite: expected fail or warn, got '", nonfinite, "'"));
  }
  spec.set_nonfinite(nonfinite);
  const std::string ignore = absl::AsciiStrToLower(absl::GetFlag(FLAGS_ignore_index));
  int ignore_index = 0;
  if (ignore == "none") {
    spec.set_ignore_index(-1);
  } else if (absl::SimpleAtoi(ignore, &ignore_index) && ignore_index >= 0 && ignore_index <= 65534) {
    spec.set_ignore_index(ignore_index);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--ignore-index: expected 0..65534 or none, got '", ignore, "'"));
  }
  for (absl::string_view pair : absl::StrSplit(absl::GetFlag(FLAGS_label_map), ',', absl::SkipWhitespace())) {
    std::vector<std::string> parts = absl::StrSplit(pair, ':');
    int from = 0, to = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &from) || !absl::SimpleAtoi(parts[1], &to) || from < 0 ||
        to < 0 || from > 65534 || to > 65534) {
      return absl::InvalidArgumentError(absl::StrCat("--label-map: expected VALUE:LABEL pairs such as 0:0,255:1, got '",
                                                     pair, "'"));
    }
    (*spec.mutable_label_map())[from] = to;
  }
  return spec;
}

void PrintJob(const tally::v1::Job& job) {
  std::cout << absl::StrFormat("%-28s %-10s %8d/%-8d %6d failed  %8.1f img/s  %s\n", job.job_id(),
                               tally::JobStateName(job.state()), job.images_evaluated() + job.images_failed(),
                               job.images_total(), job.images_failed(), job.images_per_second(),
                               job.spec().model().empty() ? "(scoring predictions)" : job.spec().model());
  if (!job.error().empty()) std::cout << "  error: " << job.error() << "\n";
  if (!job.stalled().empty()) std::cout << "  " << job.stalled() << "\n";
  if (job.images_held() > 0) {
    std::cout << "  held: " << job.images_held()
              << " more rows evaluated; their results wait for the layout trial (--channels-last auto)\n";
  }
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "{}";
  return out;
}

std::string Time(double unix_seconds) {
  if (unix_seconds <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(static_cast<int64_t>(unix_seconds)),
                          absl::UTCTimeZone());
}

std::string Clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

void PrintJobsTable(const tally::v1::ListJobsResponse& page) {
  std::cout << absl::StrFormat("%-28s %-10s %17s %7s  %-19s  %-19s  %-20s %s\n", "JOB", "STATE", "DONE/TOTAL",
                               "FAILED", "CREATED (UTC)", "FINISHED (UTC)", "NAME", "LABELS");
  for (const auto& job : page.jobs()) {
    std::vector<std::string> l;
    for (const auto& [k, v] : job.spec().labels()) l.push_back(absl::StrCat(k, "=", v));
    std::sort(l.begin(), l.end());
    std::cout << absl::StrFormat("%-28s %-10s %8d/%-8d %7d  %-19s  %-19s  %-20s %s\n", job.job_id(),
                                 tally::JobStateName(job.state()), job.images_evaluated() + job.images_failed(),
                                 job.images_total(), job.images_failed(), Time(job.created_unix()),
                                 Time(job.finished_unix()), Clip(job.spec().name().empty() ? "-" : job.spec().name(), 20),
                                 absl::StrJoin(l, ","));
  }
}

void PrintWorker(const tally::v1::WorkerInfo& w) {
  std::cout << absl::StrFormat("%-14s %-16s %-8s %-15s %-20s %s\n", w.worker_id(), w.name(), w.device(), w.state(),
                               absl::StrCat(w.hostname(), ":", w.pid()), absl::StrJoin(w.jobs(), ","));
  if (!w.reason().empty()) std::cout << "  reason: " << w.reason() << "\n";
}

int Finish(const absl::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "tally: " << s.message() << "\n";
  return absl::IsUnavailable(s) ? tally::kExitUnreachable : tally::kExitFailed;
}

// A job id, or an unambiguous prefix of one (the caller's visible jobs).
absl::StatusOr<std::string> ResolveJobId(tally::TallyClient& client, const std::string& id) {
  absl::StatusOr<tally::v1::Job> exact = client.Get(id);
  if (exact.ok() || !absl::IsNotFound(exact.status()) || id.empty()) {
    if (!exact.ok()) return exact.status();
    return id;
  }
  std::vector<std::string> matches;
  std::string token;
  do {
    auto page = client.List(1000, token);
    if (!page.ok()) return page.status();
    for (const auto& j : page->jobs()) {
      if (absl::StartsWith(j.job_id(), id)) matches.push_back(j.job_id());
    }
    token = page->next_page_token();
  } while (!token.empty());
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) return exact.status();
  if (matches.size() > 5) matches.resize(5);
  return absl::InvalidArgumentError(absl::StrCat("job id prefix '", id, "' is ambiguous: ", absl::StrJoin(matches, ", "),
                                                 matches.size() == 5 ? ", ..." : ""));
}

// tally token NAME ROLE [--tokens-file F]: a fresh token on stdout (shown once), its hashed line
// for tallyd's --auth-tokens file on stderr or appended to F (created readable by its owner only).
int MakeToken(const std::vector<std::string>& positional) {
  if (positional.size() != 2) return Usage("usage: tally token NAME client|worker|admin [--tokens-file F]");
  const std::string name = positional[0];
  const std::optional<tally::Role> role = tally::ParseRole(positional[1]);
  if (!tally::ValidTokenName(name)) return Usage("the token name must be 1-64 of A-Z a-z 0-9 . _ @ -");
  if (!role) return Usage("the role must be client, worker or admin");
  const std::string token = tally::NewToken();
  const std::string line = tally::TokenLine(name, *role, token);
  const std::string file = absl::GetFlag(FLAGS_tokens_file);
  if (file.empty()) {
    std::cerr << "tally token: add this line to tallyd's --auth-tokens file, then send tallyd SIGHUP:\n" << line << "\n";
  } else {
    if (absl::Status s = tally::WritePrivateFile(file, line + "\n", /*append=*/true); !s.ok()) return Finish(s);
    std::cerr << "tally token: added '" << name << "' (" << positional[1] << ") to " << file
              << "; send tallyd SIGHUP to load it\n";
  }
  std::cout << token << "\n";
  return 0;
}

// tally wait JOB...: until every job has ended (and its report is ready), or --timeout. The exit
// code is the worst of the jobs' (failed > cancelled > too many failed rows > succeeded).
int WaitForJobs(tally::TallyClient& client, const std::vector<std::string>& ids) {
  const double timeout = absl::GetFlag(FLAGS_timeout);
  const absl::Time deadline = timeout > 0 ? absl::Now() + absl::Seconds(timeout) : absl::InfiniteFuture();
  std::vector<std::string> pending = ids;
  int worst = tally::kExitSucceeded;
  auto rank = [](int code) {
    return code == tally::kExitFailed ? 3 : code == tally::kExitCancelled ? 2 : code == tally::kExitTooManyFailedRows ? 1 : 0;
  };
  while (!pending.empty()) {
    std::vector<std::string> still;
    for (const std::string& id : pending) {
      auto job = client.Get(id);
      if (!job.ok()) return Finish(job.status());
      if (!tally::IsTerminal(job->state()) || !job->report_ready()) {
        still.push_back(id);
        continue;
      }
      if (absl::GetFlag(FLAGS_json)) {
        std::cout << ToJson(*job) << std::endl;
      } else {
        PrintJob(*job);
      }
      const int code = tally::JobExitCode(*job);
      if (rank(code) > rank(worst)) worst = code;
    }
    pending = std::move(still);
    if (pending.empty()) break;
    if (absl::Now() >= deadline) {
      std::cerr << "tally wait: timed out after " << timeout << " s; still running: " << absl::StrJoin(pending, ", ")
                << "\n";
      return tally::kExitTimedOut;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  return worst;
}

}  // namespace

// --gpus and --gpus-per-worker of tally run and tally estimate: each worker's CUDA_VISIBLE_DEVICES
// into `groups` (none: CPU workers). Returns 0, or the exit code of the error it reported.
int SelectWorkerGpus(const std::string& model, std::vector<std::string>* groups) {
  const int per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
  if (absl::GetFlag(FLAGS_gpus).empty()) {
    return per_worker != 1 ? Usage("--gpus-per-worker goes with --gpus") : 0;
  }
  auto gpus = tally::SelectGpus(absl::GetFlag(FLAGS_gpus));
  if (!gpus.ok()) return Finish(gpus.status());
  auto grouped = tally::GroupGpus(*gpus, per_worker);
  if (!grouped.ok()) return Usage(std::string(grouped.status().message()));
  if (per_worker > 1 && !tally::ParseModelRef(model).python) {
    return Usage("--gpus-per-worker > 1 needs a Python model (--model PATH.py): a TorchScript model runs on one GPU");
  }
  *groups = *std::move(grouped);
  return 0;
}

// tally estimate: the model's trial passes run in a tally-worker (it has the model backends) on
// the first of the chosen GPUs (or the CPU); it prints the table or the JSON itself.
int Estimate() {
  auto spec = SpecFromFlags();
  if (!spec.ok()) return Usage(std::string(spec.status().message()));
  if (spec->model().empty()) return Usage("tally estimate needs --model: it measures the model");
  if (absl::GetFlag(FLAGS_max_batch) < 0) return Usage("--max-batch must be >= 0");
  const std::string worker = tally::FindExecutable("tally-worker");
  if (worker.empty()) return Finish(absl::NotFoundError("tally-worker not found next to tally or on PATH"));
  std::vector<std::string> gpu_groups;
  if (const int rc = SelectWorkerGpus(spec->model(), &gpu_groups); rc != 0) return rc;
  const int per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
  const int workers =
      gpu_groups.empty() ? std::max(1, absl::GetFlag(FLAGS_workers)) : static_cast<int>(gpu_groups.size());
  char path[] = "/tmp/tally-estimate-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return Finish(absl::InternalError("cannot create a temporary file in /tmp"));
  close(fd);
  if (absl::Status s = tally::WriteFileAtomically(path, spec->SerializeAsString()); !s.ok()) return Finish(s);
  tally::SpawnOptions options;
  const bool gpu = !gpu_groups.empty();
  options.argv = {worker, "--estimate", path, "--device", gpu ? "cuda:0" : "cpu",
                  absl::StrCat("--gpus-per-worker=", gpu ? per_worker : 1), absl::StrCat("--estimate-workers=", workers),
                  absl::StrCat("--estimate-max-batch=", absl::GetFlag(FLAGS_max_batch))};
  if (absl::GetFlag(FLAGS_worker_threads) > 0) {
    options.argv.push_back(absl::StrCat("--threads=", absl::GetFlag(FLAGS_worker_threads)));
    options.argv.push_back(absl::StrCat("--estimate-decode-threads=", absl::GetFlag(FLAGS_worker_threads) * workers));
  }
  if (absl::GetFlag(FLAGS_json)) options.argv.push_back("--estimate-json");
  for (const std::string& f : absl::GetFlag(FLAGS_worker_flags)) options.argv.push_back(f);
  if (gpu) options.env.emplace_back("CUDA_VISIBLE_DEVICES", gpu_groups.front());
  options.argv.push_back(absl::StrFormat("--estimate-spawned-unix=%.6f", tally::NowUnix()));
  auto child = tally::Subprocess::Spawn(options);
  if (!child.ok()) {
    unlink(path);
    return Finish(child.status());
  }
  while ((*child)->Running()) absl::SleepFor(absl::Milliseconds(20));
  unlink(path);
  return (*child)->exit_code() >= 0 ? (*child)->exit_code() : 1;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("tally VERB [flags]; `tally help` lists the verbs");
  std::vector<std::string> normalized = tally::NormalizeFlagNames(argc, argv);
  // --channels-last was a bare boolean before it took auto|on|off: a bare one still means on.
  for (size_t i = 1; i < normalized.size() && normalized[i] != "--"; ++i) {
    if (normalized[i] != "--channels_last") continue;
    if (i + 1 == normalized.size() || absl::StartsWith(normalized[i + 1], "-")) normalized[i] = "--channels_last=on";
  }
  // Before Abseil sees argv: help, the version, and flags the verb does not take (exit 2).
  const tally::CommandLine cl = tally::CheckCommandLine(normalized);
  g_verb = tally::FindVerb(cl.verb) != nullptr ? cl.verb : "";
  if (cl.version || cl.verb == "version") {
    std::cout << tally::VersionText();
    return 0;
  }
  if (cl.help || cl.verb == "help") {
    const std::string topic = cl.help ? cl.verb : (cl.positional.empty() ? "" : cl.positional[0]);
    const tally::Verb* verb = tally::FindVerb(topic);
    std::cout << (verb != nullptr && topic != "help" ? tally::VerbHelp(*verb) : tally::GeneralHelp());
    return 0;
  }
  if (!cl.error.empty()) return Usage(cl.error);
  if (cl.verb.empty()) {
    std::cerr << tally::GeneralHelp();
    return tally::kExitUsage;
  }
  model_options = tally::TakeRepeatedFlag(&normalized, "model_option");
  labels = tally::TakeRepeatedFlag(&normalized, "label");
  std::vector<char*> args = tally::ArgvPointers(normalized);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const std::string command = cl.verb;
  const std::vector<std::string>& positional = cl.positional;

  if (command == "run") {
    if (absl::GetFlag(FLAGS_out).empty()) return Usage("--out is required");
    std::string manifest;
    if (!absl::GetFlag(FLAGS_predictions).empty() || !absl::GetFlag(FLAGS_references).empty()) {
      if (absl::GetFlag(FLAGS_predictions).empty() || absl::GetFlag(FLAGS_references).empty()) {
        return Usage("--predictions and --references go together");
      }
      if (!absl::GetFlag(FLAGS_manifest).empty() || !absl::GetFlag(FLAGS_model).empty()) {
        return Usage("--predictions/--references replace --manifest and --model");
      }
      auto paired = tally::PairFolders(absl::GetFlag(FLAGS_predictions), absl::GetFlag(FLAGS_references),
                                       absl::GetFlag(FLAGS_file_ending),
                                       tally::AbsolutePath(absl::GetFlag(FLAGS_out)) + "/.tally");
      if (!paired.ok()) return Finish(paired.status());
      manifest = *paired;
    }
    auto spec = SpecFromFlags(manifest);
    if (!spec.ok()) return Usage(std::string(spec.status().message()));
    tally::LocalRunOptions options;
    options.spec = *spec;
    options.out_dir = tally::AbsolutePath(absl::GetFlag(FLAGS_out));
    options.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
    if (const int rc = SelectWorkerGpus(spec->model(), &options.gpus); rc != 0) return rc;
    if (options.gpus.empty()) {
      if (absl::GetFlag(FLAGS_workers) < 1) return Usage("--workers must be >= 1");
      options.cpu_workers = absl::GetFlag(FLAGS_workers);
    }
    if (absl::GetFlag(FLAGS_count_logit_ties)) options.worker_args.push_back("--count_logit_ties");
    for (const std::string& f : absl::GetFlag(FLAGS_worker_flags)) options.worker_args.push_back(f);
    if (absl::GetFlag(FLAGS_worker_threads) > 0) {
      options.worker_args.push_back(absl::StrCat("--threads=", absl::GetFlag(FLAGS_worker_threads)));
    }
    return tally::RunLocally(options);
  }

  if (command == "token") return MakeToken(positional);
  if (command == "estimate") return Estimate();
  if (command == "gpus") {
    // This machine's GPUs (client/gpus.h); 0 when at least one is ready, 1 otherwise.
    const tally::GpuInventoryReport gpus = tally::InspectGpus();
    std::cout << (absl::GetFlag(FLAGS_json) ? tally::GpusJson(gpus) + "\n" : tally::GpusText(gpus));
    for (const tally::GpuReport& g : gpus.gpus) {
      if (g.verdict == "ready") return 0;
    }
    return 1;
  }

  auto token = tally::ReadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return Finish(token.status());
  tally::ClientSecurityOptions security;
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  security.token = *token;
  auto connected = tally::TallyClient::Create(absl::GetFlag(FLAGS_server), security);
  if (!connected.ok()) return Finish(connected.status());
  tally::TallyClient& client = **connected;
  const bool json = absl::GetFlag(FLAGS_json);
  if (command == "submit") {
    auto spec = SpecFromFlags();
    if (!spec.ok()) return Usage(std::string(spec.status().message()));
    auto job = client.Submit(*spec);
    if (!job.ok()) return Finish(job.status());
    std::cout << (json ? ToJson(*job) : job->job_id()) << "\n";
    return 0;
  }
  if (command == "jobs") {
    tally::v1::ListJobsRequest filter;
    const std::string state = absl::AsciiStrToLower(absl::GetFlag(FLAGS_state));
    if (!state.empty()) {
      tally::v1::JobState s = tally::v1::JOB_STATE_UNSPECIFIED;
      for (auto candidate : {tally::v1::JOB_STATE_QUEUED, tally::v1::JOB_STATE_RUNNING, tally::v1::JOB_STATE_SUCCEEDED,
                             tally::v1::JOB_STATE_FAILED, tally::v1::JOB_STATE_CANCELLED}) {
        if (tally::JobStateName(candidate) == state) s = candidate;
      }
      if (s == tally::v1::JOB_STATE_UNSPECIFIED) {
        return Usage(absl::StrCat("--state: expected queued, running, succeeded, failed or cancelled, got '", state, "'"));
      }
      filter.set_state(s);
    }
    if (absl::Status s = ParsePairs("label", labels, filter.mutable_labels()); !s.ok()) return Usage(std::string(s.message()));
    auto page = client.List(absl::GetFlag(FLAGS_limit), absl::GetFlag(FLAGS_page_token), filter);
    if (!page.ok()) return Finish(page.status());
    if (json) {
      std::cout << ToJson(*page) << "\n";
      return 0;
    }
    PrintJobsTable(*page);
    if (!page->next_page_token().empty()) {
      std::cerr << "more: tally jobs --page-token " << page->next_page_token() << "\n";
    }
    return 0;
  }
  if (command == "workers") {
    auto workers = client.Workers();
    if (!workers.ok()) return Finish(workers.status());
    if (json) {
      std::cout << ToJson(*workers) << "\n";
      return 0;
    }
    std::cout << absl::StrFormat("%-14s %-16s %-8s %-15s %-20s %s\n", "WORKER", "NAME", "DEVICE", "STATE",
                                 "HOST:PID", "JOBS");
    for (const auto& w : workers->workers()) PrintWorker(w);
    return 0;
  }
  if (command == "token" || command == "run") return Usage("internal: unhandled verb");
  if (positional.empty()) return Usage(absl::StrCat("tally ", command, " needs a job id"));
  if (command == "wait") {
    std::vector<std::string> ids;
    for (const std::string& p : positional) {
      auto id = ResolveJobId(client, p);
      if (!id.ok()) return Finish(id.status());
      ids.push_back(*id);
    }
    return WaitForJobs(client, ids);
  }
  if (command == "compare") {
    if (positional.size() != 2) return Usage("tally compare takes two job ids: A (the base) and B");
    if (absl::GetFlag(FLAGS_out).empty()) return Usage("tally compare needs --out DIR");
    auto a = ResolveJobId(client, positional[0]);
    if (!a.ok()) return Finish(a.status());
    auto b = ResolveJobId(client, positional[1]);
    if (!b.ok()) return Finish(b.status());
    auto files = client.CompareJobs(*a, *b, absl::GetFlag(FLAGS_out));
    if (!files.ok()) return Finish(files.status());
    for (const std::string& f : *files) std::cout << f << "\n";
    return 0;
  }
  if (command == "merge") {
    if (positional.size() < 2) return Usage("tally merge needs two job ids or more");
    if (absl::GetFlag(FLAGS_out).empty()) return Usage("tally merge needs --out DIR");
    std::vector<std::string> ids;
    for (const std::string& p : positional) {
      auto id = ResolveJobId(client, p);
      if (!id.ok()) return Finish(id.status());
      ids.push_back(*id);
    }
    auto files = client.MergeReports(ids, absl::GetFlag(FLAGS_out));
    if (!files.ok()) return Finish(files.status());
    for (const std::string& f : *files) std::cout << f << "\n";
    return 0;
  }
  if (positional.size() > 1) return Usage(absl::StrCat("tally ", command, " takes one job id"));
  auto resolved = ResolveJobId(client, positional[0]);
  if (!resolved.ok()) return Finish(resolved.status());
  const std::string job_id = *resolved;
  if (command == "status") {
    auto job = client.Get(job_id);
    if (!job.ok()) return Finish(job.status());
    if (json) {
      std::cout << ToJson(*job) << "\n";
    } else {
      PrintJob(*job);
      if (!job->summary().empty()) std::cout << "\n" << job->summary();
    }
    return 0;
  }
  if (command == "cancel") {
    auto job = client.Cancel(job_id);
    if (!job.ok()) return Finish(job.status());
    if (json) {
      std::cout << ToJson(*job) << "\n";
    } else {
      PrintJob(*job);
    }
    return 0;
  }
  if (command == "delete") {
    absl::Status s = client.Delete(job_id);
    if (!s.ok()) return Finish(s);
    std::cout << "deleted " << job_id << "\n";
    return 0;
  }
  if (command == "watch") {
    const double timeout = absl::GetFlag(FLAGS_timeout);
    const absl::Time deadline = timeout > 0 ? absl::Now() + absl::Seconds(timeout) : absl::InfiniteFuture();
    bool timed_out = false;
    tally::ProgressPrinter progress;
    auto job = client.Watch(
        job_id, 500,
        [&](const tally::v1::Job& j) {
          if (json) {
            std::cout << ToJson(j) << std::endl;  // One object per line (NDJSON).
          } else {
            progress.Update(j);
          }
        },
        [&] {
          timed_out = absl::Now() >= deadline;
          return !timed_out;
        },
        [&](const std::string& why) { progress.Note("tally watch: lost the coordinator (" + why + "); reconnecting"); });
    if (timed_out) {
      std::cerr << "tally watch: timed out after " << timeout << " s; the job goes on\n";
      return tally::kExitTimedOut;
    }
    if (!job.ok()) return Finish(job.status());
    if (!json) {
      progress.Done(*job);
      PrintJob(*job);
    }
    return tally::JobExitCode(*job);
  }
  // report
  if (absl::GetFlag(FLAGS_out).empty()) return Usage("tally report needs --out DIR");
  auto files = client.FetchReport(job_id, absl::GetFlag(FLAGS_out));
  if (!files.ok()) return Finish(files.status());
  for (const std::string& f : *files) std::cout << f << "\n";
  return 0;
}
