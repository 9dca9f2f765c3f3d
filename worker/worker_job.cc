// Worker: a job's model runner (TorchScript or Python, or none for prediction jobs; the last
// job's runner reused where the model and its settings are the same) and the pipeline that feeds
// it, with the job-wide answers agreed with tallyd (layout, decoder).
#include "worker/worker.h"

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "common/security/data_roots.h"
#include "common/sources/row_files.h"
#include "common/sources/tar_members.h"
#include "common/security/sha256.h"
#include "common/job/job_config.h"
#include "common/store/store_keys.h"
#include "base/backoff.h"
#include "base/log.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/process/sd_notify.h"
#include "base/status_macros.h"
#include "common/process/subprocess.h"
#include "worker/python/python_runner.h"
#include "worker/scoring/scoring.h"
#include "worker/store/store_runner.h"
#include "worker/pipeline/memory_budget.h"
#include "worker/worker_internal.h"
#include "metrics/parallel_for.h"

namespace tally {
namespace {

// Errors of ModelRunner::Create that are this host's problem, not the model's.
// A model is code (SECURITY.md): with data roots it must lie inside them, and so must a Python
// interpreter named by path (a bare python3/python is looked up on PATH). Returns the model's
// resolved path. PERMISSION_DENIED fails the job, never this worker.
absl::StatusOr<std::string> CheckModelAllowed(const ModelRef& model, const std::string& python) {
  const DataRoots& roots = ProcessDataRoots();
  absl::StatusOr<std::string> path = roots.Resolve(model.path);
  if (!path.ok()) return OutsideDataRootsError("model", model.path);
  if (model.python && !roots.empty() && !python.empty() && python != "python3" && python != "python" &&
      !roots.Resolve(python).ok()) {
    return OutsideDataRootsError("--python", python);
  }
  return *path;
}

// The --save-predictions folder, created when missing, resolved (symlinks followed); with data
// roots, only inside them.
absl::StatusOr<std::string> PreparePredictionFolder(const std::string& folder,
                                                    const std::string& flag = "--save-predictions") {
  const DataRoots& roots = ProcessDataRoots();
  if (!roots.Resolve(folder).ok()) return OutsideDataRootsError(flag, folder);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec || !std::filesystem::is_directory(folder)) {
    return absl::PermissionDeniedError(absl::StrCat(flag, " '", folder, "': cannot create the folder",
                                                    ec ? absl::StrCat(" (", ec.message(), ")") : std::string()));
  }
  absl::StatusOr<std::string> resolved = roots.Resolve(folder);
  if (!resolved.ok()) return OutsideDataRootsError(flag, folder);
  return roots.empty() ? std::filesystem::canonical(folder, ec).string() : *resolved;
}

// --prediction-store: the job's runner in front of the model's (worker/store/store_runner.h); for a
// rescore, in front of no model, taking the entries of the settings the client found in the store.
absl::StatusOr<std::unique_ptr<ModelRunner>> StoreRunnerFor(const JobConfig& config, const std::string& model_sha256,
                                                            int batch_size, ModelRunner* runner) {
  StoreRunnerOptions so;
  ASSIGN_OR_RETURN(so.root, PreparePredictionFolder(config.prediction_store, "--prediction-store"));
  if (config.rescore) {
    so.model_digest = config.store_model;
    so.rescore_settings = config.store_settings;
  } else {
    ASSIGN_OR_RETURN(so.model_digest, PredictionModelDigest(config, model_sha256));
    const std::string job_settings = JobSettingsText(config);
    const bool cuda = runner->is_cuda();
    const std::string gpu = runner->Stats().gpu_name;
    so.settings_text = [config, job_settings, cuda, gpu, batch_size](bool channels_last, bool nvjpeg) {
      return job_settings + RunSettingsText(config, cuda, gpu, batch_size, channels_last, nvjpeg);
    };
  }
  so.columns_are_input = config.python_model();
  so.columns = config.manifest_columns;
  so.max_bytes = config.store_max_bytes;
  so.thresholds = config.thresholds;
  so.calibration = config.calibration;
  // Found rows skip decoding where nothing the runner decides during the job (a layout trial of
  // TorchScript on CUDA, the JPEG decoder's) can change their settings between lookup and batch.
  // A TorchScript model on CUDA with --channels-last auto: once its trial's layout is agreed.
  so.find_before_decoding = config.rescore || (!config.decode_auto && !config.decode_gpu);
  so.once_layout_agreed = !config.rescore && runner->is_cuda() && !config.python_model() && config.channels_last_auto;
  return WrapWithStore(runner, std::move(so));
}

// Calibration on probabilities at the prediction store's precision (ModelRunnerOptions::
// calibration_quantized), so that rows the store answers count as the model's do.
bool CalibrationQuantized(const JobConfig& config) { return config.calibration && !config.prediction_store.empty(); }

// Why a rescore's row fails: the store lacks its prediction.
std::string NoModelReason(const JobConfig& config) {
  return absl::StrCat("the prediction store ", config.prediction_store, " has no prediction of this row's input by model ",
                      config.store_model.substr(0, 16), " with the settings rescored (tally rescore runs no model)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateJobRunner(const JobConfig& config, const WorkerOptions& options,
                                                             const std::string& trial_cache_key) {
  const std::vector<std::string> devices = WorkerDevices(options);
  const ModelRef model = ParseModelRef(config.model);
  ASSIGN_OR_RETURN(const std::string model_path, CheckModelAllowed(model, config.python));
  ModelRunnerOptions ro;
  ro.model_path = model_path;
  ro.device = options.device;
  ro.precision = std::string(PrecisionName(config.precision));
  ro.channels_last = config.channels_last;
  ro.mean = config.mean;
  ro.std = config.std;
  ro.input_height = config.input_height;
  ro.input_width = config.input_width;
  ro.cpu_threads = options.threads;
  ro.count_logit_ties = options.count_logit_ties;
  ro.cudnn_benchmark = options.cudnn_benchmark;
  ro.jit_optimize = options.jit_optimize;
  ro.warm_up_device = options.warm_up_device;
  if (!trial_cache_key.empty() && !options.cache_dir.empty()) {
    ro.trial_cache_dir = options.cache_dir + "/layout-trials";
    ro.trial_cache_key = trial_cache_key;
  }
  ro.memory_limit_gib = options.gpu_memory_limit_gib;
  ro.thresholds = config.thresholds;
  ro.calibration = config.calibration;
  ro.calibration_quantized = CalibrationQuantized(config);
  if (config.instance_job()) ro.num_classes = config.num_classes;  // Instance outputs: category ids < this.
  ro.sliding_window = config.sliding_window;
  ro.overlap = config.overlap;
  ro.sw_batch_size = config.sw_batch_size;
  if (model.python) {
    ro.class_name = model.class_name;
    ro.devices = devices;
    ro.python = config.python;
    ro.model_options = config.model_options;
    ro.compile = config.compile;
    // Inductor's cache for every Python job, compiled by Tally or by the model itself: one environment
    // for both, so a spare model process serves either.
    if (!options.cache_dir.empty()) ro.compile_cache_dir = options.cache_dir + "/inductor";
    if (!options.cache_dir.empty()) ro.bytecode_cache_dir = options.cache_dir + "/python-bytecode";
    if (!options.cache_dir.empty()) ro.preload_dir = options.cache_dir + "/python-preload";
    ro.spare_interpreter = options.spare_interpreter;
    ro.columns = config.manifest_columns;
    ro.num_classes = config.num_classes;
    return CreatePythonRunner(ro);
  }
  if (devices.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TorchScript models run on one GPU, but this worker owns ", devices.size(),
        " (--gpus-per-worker); use a Python model (--model PATH.py) to spread a model over several GPUs"));
  }
  return ModelRunner::Create(ro);
}

std::string LayoutTrialKey(const JobConfig& config, const WorkerOptions& options) {
  return RunnerKey(config, "any weights of the network", options);
}

std::string RunnerKey(const JobConfig& config, const std::string& model_sha256, const WorkerOptions& options) {
  const ModelRef model = ParseModelRef(config.model);
  std::string identity = model_sha256;
  if (identity.empty()) {
    struct stat st;
    identity = stat(model.path.c_str(), &st) == 0
                   ? absl::StrCat(model.path, ":", st.st_size, ":", st.st_ino, ":", st.st_mtim.tv_sec, ".",
                                  st.st_mtim.tv_nsec)
                   : absl::StrCat(model.path, ":unreadable:", NowUnix());  // Never matches again.
  }
  std::vector<std::string> options_kv;
  for (const auto& [k, v] : config.model_options) options_kv.push_back(absl::StrCat(k, "=", v));
  return absl::StrJoin(
      {identity, model.class_name, absl::StrJoin(WorkerDevices(options), ","), std::string(PrecisionName(config.precision)),
       absl::StrJoin(config.mean, ","), absl::StrJoin(config.std, ","),
       absl::StrCat(config.input_height, "x", config.input_width), absl::StrJoin(config.thresholds, ","),
       absl::StrCat(options.threads, ",", options.count_logit_ties, ",", options.cudnn_benchmark, ",",
                    options.gpu_memory_limit_gib, ",", options.jit_optimize),
       config.python, absl::StrJoin(options_kv, "\x1f"), absl::StrJoin(config.manifest_columns, "\x1f"),
       absl::StrCat(config.num_classes), absl::StrJoin(config.sliding_window, ","),
       absl::StrCat(config.overlap, ",", config.sw_batch_size, ",", config.compile, ",", config.calibration, ",",
                    CalibrationQuantized(config))},
      "\x1e");
}

namespace {
// "cuda:N" -> N ("cuda" -> 0); -1 for anything else.
int CudaDeviceIndex(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return -1;
  int index = 0;
  if (device.size() > 5 && !absl::SimpleAtoi(device.substr(5), &index)) return -1;
  return index;
}
// The device for volumes' surface distances: the worker's first GPU, unless TALLY_CPU_SURFACE.
int SurfaceDevice(const WorkerOptions& options) {
  if (std::getenv("TALLY_CPU_SURFACE") != nullptr) return -1;
  return CudaDeviceIndex(options.device);
}
}  // namespace

std::vector<std::string> WorkerDevices(const WorkerOptions& options) {
  if (options.device.rfind("cuda", 0) != 0) return {options.device.empty() ? "cpu" : options.device};
  const int first = std::max(0, CudaDeviceIndex(options.device));
  std::vector<std::string> out;
  for (int i = 0; i < std::max(1, options.gpus_per_worker); ++i) out.push_back(absl::StrCat("cuda:", first + i));
  return out;
}

bool Worker::RetirePreviousJob(const std::string& job_id) {
  RowEvaluator* previous = nullptr;  // evaluator_ is replaced only by this thread.
  {
    absl::MutexLock lock(&mu_);
    if (evaluator_ && evaluator_->job_id == job_id) return false;
    if (evaluator_) previous = evaluator_->pipeline.get();
  }
  if (previous == nullptr) return true;
  // One model at a time: let the previous job's rows finish before loading the next model.
  previous->WaitIdle(absl::InfiniteDuration());
  std::unique_ptr<Evaluator> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(evaluator_);
  }
  old->pipeline.reset();
  CloseShards();  // The previous job's tar shards and their scratch copies.
  if (old->runner) {  // Kept for the next job, which may run the same model.
    idle_runner_key_ = old->runner_key;
    idle_runner_ = std::move(old->runner);
  }
  return true;
}

absl::StatusOr<bool> Worker::TakeRunner(const JobConfig& config, const v1::ShardAssignment& a, Evaluator* evaluator) {
  evaluator->runner_key = RunnerKey(config, a.spec().model_sha256(), options_);
  bool reused = false;
  if (idle_runner_ && idle_runner_key_ == evaluator->runner_key) {
    Log("job ", a.job_id(), ": model ", config.model, " is loaded already (sha256 ", a.spec().model_sha256().substr(0, 12),
        "); reusing it");
    evaluator->runner = std::move(idle_runner_);
    if (!config.channels_last_auto) evaluator->runner->SetChannelsLast(config.channels_last);
    reused = true;
  } else {
    if (idle_runner_) {
      idle_runner_.reset();  // Its memory first: the next model may need all of it.
      Log("job ", a.job_id(), ": unloaded the previous job's model");
    }
    Log("job ", a.job_id(), ": loading model ", config.model, " on ", absl::StrJoin(WorkerDevices(options_), ","));
    const double t0 = NowUnix();
    ASSIGN_OR_RETURN(evaluator->runner, CreateJobRunner(config, options_, LayoutTrialKey(config, options_)));
    Log("job ", a.job_id(), ": model loaded in ", absl::StrFormat("%.2f", NowUnix() - t0), " s");
  }
  idle_runner_key_.clear();
  if (config.compile) {
    // The first worker's --compile trial decides for every worker of the job (one set of kernels).
    const std::string job_id = a.job_id();
    evaluator->runner->SetCompileResolver([this, job_id](bool faster, const v1::CompileTrial& trial) -> absl::StatusOr<bool> {
      v1::ResolveLayoutRequest request;
      request.set_compile(faster ? "on" : "off");
      *request.mutable_compile_trial() = trial;
      ASSIGN_OR_RETURN(v1::ResolveLayoutResponse r, Resolve(job_id, std::move(request)));
      return r.compile() == "on";
    });
  }
  return reused;
}

absl::StatusOr<PipelineOptions> Worker::PipelineOptionsFor(const JobConfig& config, const std::string& job_id,
                                                           const ModelRunner& runner, bool reused) {
  PipelineOptions po;
  po.decode_threads = options_.threads;
  po.default_batch_size = DefaultBatchSize(runner.is_cuda());
  ASSIGN_OR_RETURN(po.batch_size, WorkerBatchSize(config, po.default_batch_size));
  po.max_memory = config.max_memory;
  po.cold_runner = runner.is_cuda() && !reused;
  po.warmup_batches = po.cold_runner ? options_.warmup_batches : 0;
  if (config.channels_last_auto) {
    po.resolve_layout = [this, job_id](bool on, const std::string& trial) -> absl::StatusOr<bool> {
      v1::ResolveLayoutRequest request;
      request.set_channels_last(on ? "on" : "off");
      request.set_trial(trial);
      ASSIGN_OR_RETURN(v1::ResolveLayoutResponse r, Resolve(job_id, std::move(request)));
      return r.channels_last() == "on";
    };
  }
  // JPEG decoding: on the first device of the worker's model.
  po.decode_gpu = config.decode_gpu;
  po.decode_device = runner.is_cuda() ? CudaDeviceIndex(WorkerDevices(options_).front()) : -1;
  if (config.decode_auto) {
    po.resolve_decode = [this, job_id](bool gpu, const std::string& trial) -> absl::StatusOr<bool> {
      v1::ResolveLayoutRequest request;
      request.set_decode(gpu ? "gpu" : "cpu");
      request.set_decode_trial(trial);
      ASSIGN_OR_RETURN(v1::ResolveLayoutResponse r, Resolve(job_id, std::move(request)));
      return r.decode() == "gpu";
    };
  }
  po.staging_slots = options_.staging_slots;
  po.metrics = config.metrics;
  po.surface = config.surface_options();
  po.lesion = config.lesion;
  po.lesion.spacing_y = config.spacing_y;
  po.lesion.spacing_x = config.spacing_x;
  po.any_input_size = config.input_height > 0;
  po.input_pixels = static_cast<int64_t>(config.input_height) * config.input_width;
  po.max_image_pixels = config.max_image_pixels;
  po.window = config.window;
  po.page_column = config.page_column;
  po.raw_images = ParseModelRef(config.model).python;  // 16-bit TIFF and DICOM values, unreduced.
  po.batch_timeout_seconds = config.batch_timeout_seconds;
  po.nonfinite_warn = config.nonfinite == NonfinitePolicy::kWarn;
  po.row_properties = config.row_properties();
  po.dicom_tags = config.dicom_tags();
  po.ignore_index = config.ignore_index;
  po.label_map = config.label_map;
  po.num_thresholds = config.thresholds.size();
  po.calibration = config.calibration;
  po.thumbnails = config.thumbnails;
  po.empty_score = config.empty_score;
  po.all_foreground = config.IsForegroundClass(0);
  if (!config.save_predictions.empty()) {
    ASSIGN_OR_RETURN(po.save_predictions, PreparePredictionFolder(config.save_predictions));
  }
  po.memory_budget = MemoryBudget();
  return po;
}

absl::StatusOr<ModelRunner*> Worker::JobModel(const JobConfig& config, const v1::ShardAssignment& a, int batch_size,
                                              bool use_store, Evaluator* evaluator, bool* reused) {
  if (!evaluator->runner) {
    if (config.rescore) {  // No model: every row from the store.
      evaluator->runner = NoModelRunner(NoModelReason(config));
      evaluator->runner_key = "no model";
    } else {
      ASSIGN_OR_RETURN(*reused, TakeRunner(config, a, evaluator));
    }
  }
  if (!use_store || config.prediction_store.empty()) return evaluator->runner.get();
  ASSIGN_OR_RETURN(evaluator->store_runner,
                   StoreRunnerFor(config, a.spec().model_sha256(), batch_size, evaluator->runner.get()));
  Log("job ", evaluator->job_id, ": predictions kept in and taken from ", config.prediction_store);
  return evaluator->store_runner.get();
}

absl::Status Worker::StartJob(const v1::ShardAssignment& a) {
  if (!RetirePreviousJob(a.job_id())) return absl::OkStatus();
  ASSIGN_OR_RETURN(const JobConfig config, JobConfigFromSpec(a.spec()));
  const std::string job_id = a.job_id();
  auto evaluator = std::make_unique<Evaluator>();
  evaluator->job_id = job_id;
  auto on_result = [this](const LeaseKey& k, v1::ImageResult r) { OnResult(k, std::move(r)); };
  auto on_fatal = [this, job_id](const std::string& message, bool definitive) {
    OnFatal(JobError{job_id, message, definitive, false});
  };
  auto on_timeout = [this](const LeaseKey& lease, const std::vector<int64_t>& indices, const std::string& what,
                           double seconds) { OnTimeout(lease, indices, what, seconds); };
  // COCO jobs: the annotations (and detections on disk), read once for the job.
  std::shared_ptr<const CocoSource> coco;
  ClientFileLimits json_limits;
  json_limits.max_bytes = config.max_json_file_bytes;
  if (!config.coco.empty()) {
    ASSIGN_OR_RETURN(coco, CocoSource::Load(config.coco, config.coco_results_in_rows ? "" : config.coco_results,
                                            json_limits));
  }
  if (config.predictions()) {
    // No model: score the manifest's predictions on the CPU, one row per thread.
    const int threads = options_.threads > 0 ? options_.threads
                                             : UsableCores();
    Log("job ", job_id, ": scoring predictions on ", threads, " thread(s)");
    std::shared_ptr<const PanopticSource> panoptic;
    if (config.panoptic_job()) {
      ASSIGN_OR_RETURN(panoptic,
                       PanopticSource::Load(config.coco_panoptic, config.panoptic_predictions, json_limits));
    }
    auto scoring =
        std::make_unique<ScoringPipeline>(config, threads, on_result, on_fatal, on_timeout, coco, std::move(panoptic));
    scoring->UseDeviceForSurfaces(SurfaceDevice(options_));
    scoring->SetMemoryBudget(MemoryBudget());
    evaluator->pipeline = std::move(scoring);
  } else if (config.volume_job()) {
    // Volumes: one row at a time through the model, scored as prediction volumes are.
    bool reused = false;
    ASSIGN_OR_RETURN(ModelRunner* const runner, JobModel(config, a, 0, true, evaluator.get(), &reused));
    std::string save;
    if (!config.save_predictions.empty()) {
      ASSIGN_OR_RETURN(save, PreparePredictionFolder(config.save_predictions));
    }
    const int threads = options_.threads > 0 ? options_.threads
                                             : UsableCores();
    Log("job ", job_id, ": volumes through the model, read and scored on ", threads, " thread(s)");
    auto model = std::make_shared<VolumeModel>(runner, config);
    auto scoring = std::make_unique<ScoringPipeline>(config, threads, on_result, on_fatal, on_timeout, nullptr, nullptr,
                                                     std::move(model), std::move(save));
    scoring->UseDeviceForSurfaces(SurfaceDevice(options_));
    scoring->SetMemoryBudget(MemoryBudget());
    evaluator->pipeline = std::move(scoring);
  } else {
    bool reused = false;
    ASSIGN_OR_RETURN(ModelRunner* runner, JobModel(config, a, 0, false, evaluator.get(), &reused));
    ASSIGN_OR_RETURN(PipelineOptions po, PipelineOptionsFor(config, job_id, *runner, reused));
    po.expected_rows = a.expected_rows();
    po.coco = coco;
    po.instance_job = config.instance_job();
    const bool store = !config.prediction_store.empty() && !config.instance_job() && !config.compile;
    if (store) {
      ASSIGN_OR_RETURN(runner, JobModel(config, a, po.batch_size, true, evaluator.get(), &reused));
    }
    evaluator->pipeline = std::make_unique<Pipeline>(runner, po, on_result, on_fatal, on_timeout);
  }
  absl::MutexLock lock(&mu_);
  evaluator_ = std::move(evaluator);
  return absl::OkStatus();
}

absl::StatusOr<v1::ResolveLayoutResponse> Worker::Resolve(const std::string& job_id, v1::ResolveLayoutRequest request) {
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  request.set_job_id(job_id);
  Backoff backoff(0.25, 5.0);
  const double give_up = NowUnix() + 60;
  while (true) {
    v1::ResolveLayoutResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(10));
    const grpc::Status s = stub_->ResolveLayout(&ctx, request, &response);
    if (s.ok()) return response;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    if (NowUnix() > give_up) return absl::UnavailableError(s.error_message());
    SleepFor(backoff.Next());
  }
}

std::string Worker::FileHash(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  const std::string identity = absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                                            st.st_mtim.tv_nsec);
  auto it = file_hashes_.find(path);
  if (it != file_hashes_.end() && it->second.first == identity) return it->second.second;
  std::string hash = Sha256FileHex(path);
  if (!hash.empty()) file_hashes_[path] = {identity, hash};
  return hash;
}

absl::Status Worker::CheckModelFiles(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> files;  // (what, path) with the job's hash.
  std::vector<std::string> wanted;
  if (!spec.model().empty() && !spec.model_sha256().empty()) {
    files.emplace_back("model", ParseModelRef(spec.model()).path);
    wanted.push_back(spec.model_sha256());
  }
  for (const auto& [key, hash] : spec.model_option_sha256()) {
    auto option = spec.model_options().find(key);
    if (option == spec.model_options().end()) continue;
    files.emplace_back(absl::StrCat("--model-option ", key), option->second);
    wanted.push_back(hash);
  }
  // COCO jobs: the annotation and results files every worker reads the instances from (not the
  // results file when the rows carry the detections).
  const bool panoptic = !spec.coco_panoptic().empty();
  static const std::string kNoFile;
  for (const auto& [what, path, hash] : {std::tuple<const char*, const std::string&, const std::string&>{
                                             panoptic ? "--coco-panoptic file" : "--coco file",
                                             panoptic ? spec.coco_panoptic() : spec.coco(), spec.coco_sha256()},
                                         {panoptic ? "--panoptic-predictions file" : "--coco-results file",
                                          panoptic ? spec.panoptic_predictions()
                                          : spec.coco_results_in_rows() ? kNoFile : spec.coco_results(),
                                          spec.coco_results_sha256()}}) {
    if (path.empty() || hash.empty()) continue;
    files.emplace_back(what, path);
    wanted.push_back(hash);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string here = FileHash(files[i].second);
    if (here.empty() || here == wanted[i]) continue;  // Unreadable: loading it says why.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", options_.name, "' on ", Hostname(), " sees another file at ",
        "the job's ", files[i].first, " path '", files[i].second, "' (sha256 ", here, " here, ", wanted[i],
        " when the job was submitted: a stale copy?) and refuses the job"));
  }
  return absl::OkStatus();
}

int64_t Worker::MemoryBudget() const {
  if (options_.max_worker_memory != 0) {
    if (options_.max_worker_memory > 0) SetInputFileLimit(std::min<int64_t>(options_.max_worker_memory, int64_t{4} << 30));
    return std::max<int64_t>(0, options_.max_worker_memory);
  }
  int64_t limit = MemoryLimitBytes();
  if (options_.host_workers > 0) {
    limit /= options_.host_workers;
  } else if (options_.device.rfind("cuda", 0) == 0) {
    limit /= std::max(1, HostGpus() / std::max(1, options_.gpus_per_worker));
  }
  const int64_t budget = std::max<int64_t>(1, limit - ResidentBytes());
  SetInputFileLimit(std::min<int64_t>(budget, int64_t{4} << 30));  // One input file's bytes, at most.
  return budget;
}

}  // namespace tally
