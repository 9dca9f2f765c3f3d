#include "worker/estimate.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "common/formats/decode.h"
#include "common/job/job_config.h"
#include "base/json_writer.h"
#include "base/log.h"
#include "common/sources/manifest.h"
#include "metrics/overlap.h"
#include "base/status_macros.h"
#include "common/process/subprocess.h"
#include "worker/interfaces/model_runner.h"
#include "common/sources/row_files.h"

namespace tally {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


std::string Gib(int64_t bytes) { return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / 1073741824.0); }

std::string Duration(double seconds) {
  if (seconds < 120) return absl::StrFormat("%.1f s", seconds);
  if (seconds < 7200) return absl::StrFormat("%.1f min", seconds / 60);
  return absl::StrFormat("%.1f h", seconds / 3600);
}

struct SampledRow {
  ManifestRow row;
  RgbImage image;
};

// The peak device memory since the last ResetPeakMemory, the most of any GPU the model uses.
int64_t PeakMemory(ModelRunner* runner, int64_t* total) {
  int64_t peak = 0;
  for (const GpuUsage& g : runner->Stats().gpus) {
    peak = std::max(peak, g.peak_memory_bytes);
    if (g.memory_total_bytes > 0) *total = *total > 0 ? std::min(*total, g.memory_total_bytes) : g.memory_total_bytes;
  }
  return peak;
}

// Counts every row of the manifest and keeps a seeded reservoir sample of the well-formed ones, in
// index order. The Python backend's extra columns go into `config`.
absl::StatusOr<std::vector<ManifestRow>> SampleRows(JobConfig* config, int sample_rows, EstimateResult* r) {
  ASSIGN_OR_RETURN(std::unique_ptr<ManifestReader> reader, ManifestReader::Open(config->manifest));
  const bool python = config->python_model();
  if (python) reader->KeepExtraColumns();
  std::vector<ManifestRow> sample;
  std::vector<ManifestRow> batch;
  std::mt19937_64 rng(1);
  int64_t well_formed = 0;
  const size_t want = static_cast<size_t>(std::max(1, sample_rows));
  while (true) {
    RETURN_IF_ERROR(reader->NextBatch(4096, &batch));
    if (batch.empty()) break;
    for (ManifestRow& row : batch) {
      ++r->rows;
      if (!row.error.empty()) {
        ++r->rows_with_errors;
        continue;
      }
      ++well_formed;
      if (sample.size() < want) {
        sample.push_back(std::move(row));
      } else {
        const uint64_t j = rng() % static_cast<uint64_t>(well_formed);
        if (j < want) sample[j] = std::move(row);
      }
    }
  }
  if (python) config->manifest_columns = reader->extra_columns();
  std::sort(sample.begin(), sample.end(), [](const ManifestRow& a, const ManifestRow& b) { return a.index < b.index; });
  if (sample.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest '", config->manifest, "' has no well-formed rows"));
  }
  return sample;
}

// The sampled rows decoded on this thread (what one decode thread of a worker does per row), with
// the sizes seen and the largest, the trial's size.
absl::StatusOr<std::vector<SampledRow>> DecodeSample(const JobConfig& config, std::vector<ManifestRow> sample,
                                                     EstimateResult* r) {
  std::vector<SampledRow> decoded;
  double decode_seconds = 0;
  std::string first_failure;
  for (ManifestRow& row : sample) {
    SampledRow s;
    LabelMap mask;
    const auto t = Clock::now();
    absl::Status st = LoadImage(row.image_path, &s.image, config.max_image_pixels);
    if (st.ok()) st = LoadMask(row.mask_path, &mask, config.max_image_pixels);
    const double seconds = Since(t);
    if (!st.ok()) {
      ++r->decode_failures;
      if (first_failure.empty()) first_failure = std::string(st.message());
      continue;
    }
    decode_seconds += seconds;
    s.row = std::move(row);
    decoded.push_back(std::move(s));
  }
  r->sampled_rows = static_cast<int>(sample.size());
  if (decoded.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("none of the ", sample.size(), " sampled rows could be read; the first: ",
                                                   first_failure));
  }
  r->decode_seconds_per_row = decode_seconds / static_cast<double>(decoded.size());
  std::map<std::pair<int, int>, int64_t> sizes;
  for (const SampledRow& s : decoded) sizes[{s.image.height, s.image.width}]++;
  for (const auto& [hw, n] : sizes) r->sample_sizes.push_back({hw.first, hw.second, n});
  std::stable_sort(r->sample_sizes.begin(), r->sample_sizes.end(),
                   [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) { return a[2] > b[2]; });
  for (const SampledRow& s : decoded) {
    if (static_cast<int64_t>(s.image.height) * s.image.width > static_cast<int64_t>(r->height) * r->width) {
      r->height = s.image.height;
      r->width = s.image.width;
    }
  }
  return decoded;
}

// Warm-up passes of `spec` (TorchScript's profiling runs, cuDNN's plans, the allocator's pools),
// then timed passes with `depth` batches in flight, for at least `seconds` (and 3 passes, at most
// 500). The passes timed and the seconds they took.
absl::Status TimePasses(ModelRunner* runner, const BatchSpec& spec, size_t depth, double seconds, int* passes,
                        double* elapsed) {
  absl::Status s;
  for (int w = 0; w < 3 && s.ok(); ++w) {
    auto first = runner->Launch(spec);
    s = first.ok() ? (*first)->Wait() : first.status();
  }
  const auto start = Clock::now();
  std::deque<std::unique_ptr<PendingBatch>> in_flight;
  while (s.ok()) {
    auto next = runner->Launch(spec);
    if (!next.ok()) {
      s = next.status();
      break;
    }
    in_flight.push_back(*std::move(next));
    if (in_flight.size() >= depth) {
      s = in_flight.front()->Wait();
      in_flight.pop_front();
      if (!s.ok()) break;
      ++*passes;
    }
    *elapsed = Since(start);
    if ((*passes >= 3 && *elapsed >= seconds) || *passes >= 500) break;
  }
  while (s.ok() && !in_flight.empty()) {
    s = in_flight.front()->Wait();
    in_flight.pop_front();
    ++*passes;
  }
  in_flight.clear();
  *elapsed = Since(start);
  return s;
}

// The rows of the trial's size as the wire carries them, for BatchImage::row.
std::vector<v1::ManifestRow> TrialRows(const std::vector<SampledRow>& decoded, const EstimateResult& r,
                                       std::vector<const SampledRow*>* trial_rows) {
  for (const SampledRow& s : decoded) {
    if (s.image.height == r.height && s.image.width == r.width) trial_rows->push_back(&s);
  }
  std::vector<v1::ManifestRow> proto_rows(trial_rows->size());
  for (size_t i = 0; i < trial_rows->size(); ++i) {
    const ManifestRow& m = (*trial_rows)[i]->row;
    proto_rows[i].set_index(m.index);
    proto_rows[i].set_id(m.id);
    proto_rows[i].set_image_path(m.image_path);
    proto_rows[i].set_mask_path(m.mask_path);
    for (const std::string& c : m.columns) proto_rows[i].add_columns(c);
  }
  return proto_rows;
}

// One batch size's trial: `b` copies of the trial rows, the label maps and work the job's pipeline
// asks for (worker/pipeline/pipeline.cc: surface metrics on the device where the runner can, else the labels
// on the host; labels on the host for saved predictions, kept on the device for thumbnails), timed.
// Fills the trial's rate and peak memory (and the result's memory budget); false to stop trying
// larger batches. Errors other than running out of memory end the estimate.
absl::StatusOr<bool> TryBatch(ModelRunner* runner, const JobConfig& config, const EstimateOptions& options,
                              const std::vector<const SampledRow*>& trial_rows, std::vector<v1::ManifestRow>& proto_rows,
                              int b, EstimateResult* r) {
  const size_t image_bytes = static_cast<size_t>(r->height) * r->width * 3;
  const size_t mask_elems = static_cast<size_t>(r->height) * r->width;
  const bool cuda = runner->is_cuda();
  EstimateTrial trial;
  trial.batch_size = b;
  if (image_bytes * b > (size_t{16} << 30)) {
    trial.error = "over 16 GiB of images per batch: not tried";
    r->trials.push_back(trial);
    return false;
  }
  std::unique_ptr<HostBuffer> images = runner->AllocateHost(image_bytes * b);
  std::unique_ptr<HostBuffer> masks = runner->AllocateHost(mask_elems * 2 * b);
  std::memset(masks->data(), 0, masks->size());
  BatchSpec spec;
  spec.images = images.get();
  spec.masks = masks.get();
  const bool surface = AnySurfaceMetric(config.metrics);
  spec.surface = SurfaceRequest{surface && runner->ScoresSurfaceOnDevice(), config.surface_options()};
  spec.want_labels = (surface && !spec.surface.enabled) || !config.save_predictions.empty();
  spec.keep_labels = config.thumbnails > 0;
  for (int i = 0; i < b; ++i) {
    const size_t k = static_cast<size_t>(i) % trial_rows.size();
    std::memcpy(images->data() + image_bytes * i, trial_rows[k]->image.pixels.data(), image_bytes);
    spec.items.push_back(BatchImage{image_bytes * i, mask_elems * i, r->height, r->width, &proto_rows[k]});
  }
  runner->ResetPeakMemory();
  int passes = 0;
  double elapsed = 0;
  const size_t depth = static_cast<size_t>(std::max(2, options.worker.staging_slots));
  const absl::Status s = TimePasses(runner, spec, depth, options.seconds_per_trial, &passes, &elapsed);
  if (absl::IsResourceExhausted(s)) {
    trial.error = "out of memory";
    r->trials.push_back(trial);
    runner->ReleaseCachedMemory();
    return false;
  }
  if (!s.ok()) return s;
  trial.images_per_second = elapsed > 0 ? static_cast<double>(passes) * b / elapsed : 0;
  int64_t total = 0;
  trial.peak_memory_bytes = PeakMemory(runner, &total);
  if (total > 0) {
    r->memory_total_bytes = total;
    const double m = config.max_memory;
    const double budget = m <= 0 ? 0.9 * total : m <= 1 ? m * total : m * 1073741824.0;
    r->memory_budget_bytes = static_cast<int64_t>(budget);
  }
  trial.fits = !cuda || r->memory_budget_bytes == 0 || trial.peak_memory_bytes <= r->memory_budget_bytes;
  Log("estimate: batch ", b, ": ", absl::StrFormat("%.1f", trial.images_per_second), " img/s",
      cuda ? absl::StrCat(", peak ", Gib(trial.peak_memory_bytes)) : std::string());
  if (!trial.fits) trial.error = "over the memory budget";
  r->trials.push_back(trial);
  if (!trial.fits) return false;
  r->batch_size = b;
  r->images_per_second = trial.images_per_second;
  return elapsed / std::max(1, passes) <= 20;  // One pass takes this long: larger batches gain nothing.
}

// The manifest's predicted time from the trials: the job's batch size (--batch-size N), the largest
// that fits (auto), or the workers' default (32 on CUDA, 8 on CPU) when the job leaves it to them,
// never past what fits; the workers against the host's decode threads.
void Predict(const EstimateOptions& options, bool cuda, EstimateResult* r) {
  const int job_batch = options.spec.batch_size() > 0   ? options.spec.batch_size()
                        : options.spec.batch_size() < 0 ? r->batch_size
                        : options.worker.default_batch_size > 0 ? options.worker.default_batch_size
                                                                 : (cuda ? 32 : 8);
  for (const EstimateTrial& t : r->trials) {
    if (t.fits && t.batch_size <= job_batch) {
      r->prediction_batch_size = t.batch_size;
      r->prediction_images_per_worker = t.images_per_second;
    }
  }
  r->workers = std::max(1, options.workers);
  r->decode_threads = options.decode_threads > 0 ? options.decode_threads : static_cast<int>(AllowedCpus().size());
  const double model_rate = r->prediction_images_per_worker * r->workers;
  const double decode_rate = r->decode_seconds_per_row > 0 ? r->decode_threads / r->decode_seconds_per_row : model_rate;
  r->limited_by = decode_rate < model_rate ? "decoding" : "model";
  r->predicted_images_per_second = std::min(model_rate, decode_rate);
  const int64_t to_evaluate = r->rows - r->rows_with_errors;
  r->predicted_seconds = r->predicted_images_per_second > 0
                             ? static_cast<double>(to_evaluate) / r->predicted_images_per_second + r->startup_seconds
                             : 0;
}

}  // namespace

absl::StatusOr<EstimateResult> RunEstimate(const EstimateOptions& options) {
  const auto estimate_start = Clock::now();
  // The process's age: it started when the client spawned it (LibTorch's libraries load before main).
  const double age_at_start = options.spawned_unix > 0 ? std::max(0.0, NowUnix() - options.spawned_unix) : 0;
  ASSIGN_OR_RETURN(JobConfig config, JobConfigFromSpec(options.spec));
  if (config.predictions()) {
    return absl::InvalidArgumentError("tally estimate needs a model (--model): prediction manifests run no model");
  }
  EstimateResult r;
  r.model = config.model;
  r.manifest = config.manifest;
  ASSIGN_OR_RETURN(std::vector<ManifestRow> sample, SampleRows(&config, options.sample_rows, &r));
  ASSIGN_OR_RETURN(const std::vector<SampledRow> decoded, DecodeSample(config, std::move(sample), &r));
  std::vector<const SampledRow*> trial_rows;
  std::vector<v1::ManifestRow> proto_rows = TrialRows(decoded, r, &trial_rows);
  // The model, as a job would load it.
  r.device = absl::StrJoin(WorkerDevices(options.worker), ",");
  const double sampling_seconds = Since(estimate_start);
  const auto load_start = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, CreateJobRunner(config, options.worker));
  r.load_seconds = Since(load_start);
  // What a worker spends before its first batch: the process start (LibTorch's libraries), CUDA's
  // initialisation and the model load; not this estimate's manifest scan and decoding.
  r.startup_seconds = age_at_start + Since(estimate_start) - sampling_seconds;
  const bool cuda = runner->is_cuda();
  const int max_batch = options.max_batch > 0 ? options.max_batch : (cuda ? 512 : 16);
  Log("estimate: model loaded in ", absl::StrFormat("%.2f", r.load_seconds), " s; trying batch sizes up to ", max_batch,
      " at ", r.height, "x", r.width);
  for (int b = 1; b <= max_batch; b *= 2) {
    ASSIGN_OR_RETURN(const bool larger, TryBatch(runner.get(), config, options, trial_rows, proto_rows, b, &r));
    if (!larger) break;
  }
  for (const GpuUsage& g : runner->Stats().gpus) {
    if (r.gpu_name.empty()) r.gpu_name = g.name;
  }
  Predict(options, cuda, &r);
  return r;
}

std::string EstimateText(const EstimateResult& r) {
  std::string out;
  absl::StrAppend(&out, "model     ", r.model, " on ", r.device);
  if (!r.gpu_name.empty()) {
    absl::StrAppend(&out, " (", r.gpu_name, ", ", Gib(r.memory_total_bytes), "; budget ", Gib(r.memory_budget_bytes), ")");
  }
  absl::StrAppend(&out, ", loaded in ", absl::StrFormat("%.2f s", r.load_seconds), "\n");
  std::vector<std::string> sizes;
  for (const auto& s : r.sample_sizes) sizes.push_back(absl::StrCat(s[0], "x", s[1], " (", s[2], ")"));
  absl::StrAppend(&out, "manifest  ", r.manifest, ": ", r.rows, " rows",
                  r.rows_with_errors > 0 ? absl::StrCat(" (", r.rows_with_errors, " malformed)") : std::string(), "\n");
  absl::StrAppend(&out, "images    ", r.height, "x", r.width, ", the largest of ", r.sampled_rows, " sampled rows (",
                  absl::StrJoin(sizes, ", "), ")",
                  r.decode_failures > 0 ? absl::StrCat("; ", r.decode_failures, " could not be read") : std::string(),
                  "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%7s  %12s  %10s  %s\n", "batch", "peak memory", "images/s", ""));
  for (const EstimateTrial& t : r.trials) {
    const std::string mem = t.peak_memory_bytes > 0 ? Gib(t.peak_memory_bytes) : "-";
    const std::string rate = t.images_per_second > 0 ? absl::StrFormat("%.1f", t.images_per_second) : "-";
    absl::StrAppend(&out, absl::StrFormat("%7d  %12s  %10s  %s\n", t.batch_size, mem, rate,
                                          t.error.empty() ? (t.fits ? "fits" : "") : t.error));
  }
  absl::StrAppend(&out, "\n");
  if (r.batch_size == 0) {
    absl::StrAppend(&out, "no batch size fits", r.memory_budget_bytes > 0 ? " under the budget" : "", "\n");
    return out;
  }
  absl::StrAppend(&out, "batch size ", r.batch_size, ": the largest tried that fits",
                  r.memory_budget_bytes > 0 ? " under the budget" : "", ", ",
                  absl::StrFormat("%.1f", r.images_per_second), " images/s on one worker\n");
  absl::StrAppend(&out, "decoding  ", absl::StrFormat("%.2f ms", r.decode_seconds_per_row * 1000),
                  " per row (image and mask) on one core; ", r.decode_threads, " threads: ",
                  absl::StrFormat("%.0f", r.decode_seconds_per_row > 0 ? r.decode_threads / r.decode_seconds_per_row : 0),
                  " rows/s\n");
  absl::StrAppend(&out, "predicted ", r.rows - r.rows_with_errors, " rows on ", r.workers, " worker(s) at batch size ",
                  r.prediction_batch_size, ": ", absl::StrFormat("%.1f", r.predicted_images_per_second),
                  " images/s (limited by ", r.limited_by, "), ", Duration(r.predicted_seconds), " with ",
                  absl::StrFormat("%.1f s", r.startup_seconds), " of start-up (process, CUDA, model load)\n");
  return out;
}

std::string EstimateJson(const EstimateResult& r) {
  JsonWriter w;
  w.BeginObject();
  w.Field("model", r.model).Field("manifest", r.manifest).Field("device", r.device).Field("gpu", r.gpu_name);
  w.Field("memory_total_bytes", r.memory_total_bytes).Field("memory_budget_bytes", r.memory_budget_bytes);
  w.Field("rows", r.rows).Field("rows_with_errors", r.rows_with_errors);
  w.Field("sampled_rows", r.sampled_rows).Field("decode_failures", r.decode_failures);
  w.Key("sample_sizes").BeginArray();
  for (const auto& s : r.sample_sizes) {
    w.BeginObject().Field("height", s[0]).Field("width", s[1]).Field("count", s[2]).EndObject();
  }
  w.EndArray();
  w.Key("image_size").BeginArray().Int(r.height).Int(r.width).EndArray();
  w.Field("decode_seconds_per_row", r.decode_seconds_per_row).Field("model_load_seconds", r.load_seconds);
  w.Key("trials").BeginArray();
  for (const EstimateTrial& t : r.trials) {
    w.BeginObject().Field("batch_size", t.batch_size).Field("peak_memory_bytes", t.peak_memory_bytes);
    w.Field("images_per_second", t.images_per_second).Field("fits", t.fits).Field("error", t.error).EndObject();
  }
  w.EndArray();
  w.Field("batch_size", r.batch_size).Field("images_per_second", r.images_per_second);
  w.Field("startup_seconds", r.startup_seconds);
  w.Field("prediction_batch_size", r.prediction_batch_size);
  w.Field("prediction_images_per_worker", r.prediction_images_per_worker);
  w.Field("workers", r.workers).Field("decode_threads", r.decode_threads);
  w.Field("predicted_images_per_second", r.predicted_images_per_second);
  w.Field("predicted_seconds", r.predicted_seconds).Field("limited_by", r.limited_by);
  w.EndObject();
  return w.str() + "\n";
}

}  // namespace tally
