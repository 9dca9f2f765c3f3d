#include "worker/worker.h"

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/security/data_roots.h"
#include "common/job/job_config.h"
#include "common/base/backoff.h"
#include "common/base/log.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/process/sd_notify.h"
#include "common/base/status_macros.h"
#include "common/process/subprocess.h"
#include "worker/python_runner.h"
#include "worker/scoring.h"

namespace tally {
namespace {

constexpr double kFlushSeconds = 0.5;

std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

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
absl::StatusOr<std::string> PreparePredictionFolder(const std::string& folder) {
  const DataRoots& roots = ProcessDataRoots();
  if (!roots.Resolve(folder).ok()) return OutsideDataRootsError("--save-predictions", folder);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec || !std::filesystem::is_directory(folder)) {
    return absl::PermissionDeniedError(absl::StrCat("--save-predictions '", folder, "': cannot create the folder",
                                                    ec ? absl::StrCat(" (", ec.message(), ")") : std::string()));
  }
  absl::StatusOr<std::string> resolved = roots.Resolve(folder);
  if (!resolved.ok()) return OutsideDataRootsError("--save-predictions", folder);
  return roots.empty() ? std::filesystem::canonical(folder, ec).string() : *resolved;
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
  if (model.python) {
    ro.class_name = model.class_name;
    ro.devices = devices;
    ro.python = config.python;
    ro.model_options = config.model_options;
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
       absl::StrCat(config.num_classes)},
      "\x1e");
}

// --threads 0: this worker's share of the cores it may run on: all of them for a CPU worker; for a
// GPU worker, divided among the host's GPUs (/dev/nvidiaN), one worker per GPU as the systemd
// template and `tallyd --spawn-workers` run them.
int DefaultThreads(const std::string& device) {
  const int cores = static_cast<int>(AllowedCpus().size());
  if (device.rfind("cuda", 0) != 0) return std::max(1, cores);
  int gpus = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    gpus += name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
            name.find_first_not_of("0123456789", 6) == std::string::npos;
  }
  return std::max(1, cores / std::max(1, gpus));
}

namespace {

bool IsWorkerLocal(const absl::Status& s) {
  return absl::IsNotFound(s) || absl::IsUnavailable(s) || absl::IsUnimplemented(s);
}

// The class count of a job as these results show it (0 when every row failed).
int32_t ClassesOf(const std::vector<v1::ImageResult>& results) {
  for (const v1::ImageResult& r : results) {
    if (r.error().empty()) return r.classes_size();
  }
  return 0;
}

}  // namespace

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

int Worker::DefaultBatchSize(bool cuda) const {
  if (options_.default_batch_size > 0) return options_.default_batch_size;
  return cuda ? 32 : 8;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(WorkerOptions options) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("--coordinator is required (host:port)");
  // Jobs that leave the batch size to the workers are aligned to kDefaultBatchAlignment rows; a
  // batch size that does not divide it would make results depend on which worker ran a shard.
  if (options.default_batch_size < 0 ||
      (options.default_batch_size > 0 && kDefaultBatchAlignment % options.default_batch_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--batch-size ", options.default_batch_size,
                                                   " must divide ", kDefaultBatchAlignment,
                                                   " (1, 2, 4, 8, 16 or 32), the shard alignment of jobs that "
                                                   "leave the batch size to the workers"));
  }
  if (options.threads <= 0) options.threads = DefaultThreads(options.device);
  if (options.name.empty()) options.name = absl::StrCat(Hostname(), ":", options.device);
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after the coordinator comes back; our own loop does the backoff.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ASSIGN_OR_RETURN(w->channel_, CreateClientChannel(w->options_.coordinator, w->options_.security, args));
  w->stub_ = v1::WorkerControl::NewStub(w->channel_);
  return w;
}

Worker::~Worker() {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  if (device_check_.joinable()) device_check_.join();
  if (reporter_.joinable()) reporter_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::unique_ptr<Evaluator> evaluator;
  {
    absl::MutexLock lock(&mu_);
    evaluator = std::move(evaluator_);
  }
}

void Worker::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  wake_leaser_ = true;
  if (lease_call_ != nullptr) lease_call_->TryCancel();
}

bool Worker::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void Worker::SleepFor(double seconds) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(seconds));
}

absl::Status Worker::Register(bool first) {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_device(options_.device);
  request.set_device_name(options_.device == "cpu" ? "cpu" : options_.device);
  request.set_hostname(Hostname());
  request.set_pid(getpid());
  const auto start = std::chrono::steady_clock::now();
  // Capped near the heartbeat interval: after a coordinator restart every worker is back within
  // about a second, without all of them dialling in the same instant.
  double heartbeat = 1.0;
  {
    absl::MutexLock lock(&mu_);
    heartbeat = heartbeat_seconds_;
  }
  Backoff backoff(0.25, std::max(0.5, heartbeat));
  for (int attempt = 1;; ++attempt) {
    v1::RegisterWorkerResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(5));
    grpc::Status s = stub_->RegisterWorker(&ctx, request, &response);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      worker_id_ = response.worker_id();
      heartbeat_seconds_ = response.heartbeat_seconds() > 0 ? response.heartbeat_seconds() : 1.0;
      need_register_ = false;
      Log("registered with the coordinator at ", options_.coordinator, " as ", worker_id_,
          attempt > 1 ? absl::StrCat(" after ", attempt, " attempts") : "");
      return absl::OkStatus();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (Stopping()) return absl::CancelledError("stopped while registering");
    if (options_.max_connect_seconds > 0 && waited >= options_.max_connect_seconds) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot reach the coordinator at %s: gave up after %d attempts over %.1f s (last error: %s)",
          options_.coordinator, attempt, waited, s.error_message()));
    }
    const double delay = backoff.Next();
    Log("cannot reach the coordinator at ", options_.coordinator, " (", s.error_message(), "); attempt ", attempt,
        first ? "" : " (re-registering)", ", retrying in ", absl::StrFormat("%.1f", delay), " s");
    SleepFor(delay);
  }
}

absl::Status Worker::Run() {
  RETURN_IF_ERROR(Register(true));
  // A device that does not work here takes this worker out of service; the coordinator lists it,
  // with the reason, in `tally workers`. For a GPU the check initialises CUDA (~0.3 s): it runs on a
  // thread of its own while the worker leases its first shard and reads that job's model into host
  // memory (TorchRunner::Create), and a failure takes the worker out of service then, handing back
  // anything it leased (OnFatal). The CPU's check is immediate: before any lease.
  if (options_.device.rfind("cuda", 0) == 0) {
    device_check_ = std::thread([this] {
      if (absl::Status device = ModelRunner::CheckDevice(options_.device); !device.ok()) {
        Log("out of service: ", device.message());
        OnFatal(JobError{"", std::string(device.message()), false, true});
      } else {
        Log("device ", options_.device, " ready (CUDA initialised)");
      }
    });
  } else if (absl::Status device = ModelRunner::CheckDevice(options_.device); !device.ok()) {
    Log("out of service: ", device.message());
    SendJobError(JobError{"", std::string(device.message()), false, true});
    return absl::FailedPreconditionError(absl::StrCat("out of service: ", device.message()));
  }
  // READY before the heartbeat loop's first WATCHDOG=1: they are read in order.
  SdNotify("READY=1\nSTATUS=registered with " + options_.coordinator);  // systemd Type=notify (deploy/).
  reporter_ = std::thread([this] { ReporterLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  Backoff backoff(0.25, 2.0);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || !out_of_service_.empty()) break;
    }
    RETURN_IF_ERROR(ReregisterIfForgotten());
    if (!HasRoomForAnotherShard()) continue;
    std::optional<v1::ShardAssignment> assignment = LeaseOne(&backoff);
    if (assignment) Accept(*assignment);
  }
  return FinishRun();
}

absl::Status Worker::ReregisterIfForgotten() {
  std::vector<int64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (!need_register_) return absl::OkStatus();
    for (auto& [id, lb] : leases_) ids.push_back(id);
  }
  // Our leases went with the coordinator's memory of us.
  for (int64_t id : ids) DropLease(id);
  return Register(false);
}

int64_t Worker::LeaseTargetRows(int batch) const {
  static const int64_t fixed = [] {
    const char* v = std::getenv("TALLY_LEASE_TARGET_ROWS");  // Benchmarks only (BENCHMARKS.md).
    int64_t rows = 0;
    return v != nullptr && absl::SimpleAtoi(v, &rows) && rows > 0 ? rows : int64_t{0};
  }();
  if (fixed > 0) return fixed;
  return std::max(2, options_.staging_slots) * batch + DecodeWindowRows(batch, options_.threads) + batch;
}

bool Worker::HasRoomForAnotherShard() {
  absl::MutexLock lock(&mu_);
  size_t held = leases_.size();
  int64_t backlog = 0;
  int batch = 8;
  bool holding = false;
  if (evaluator_) {
    backlog = evaluator_->pipeline->Backlog();
    batch = std::max(1, evaluator_->pipeline->batch_size());
    holding = evaluator_->pipeline->HoldingResults();
  }
  // Keep enough rows queued that decoding runs ahead of the device, but no more: the batches staged
  // or in flight, the decode threads' window (DecodeWindowRows) and one batch more
  // not yet decoded. With 4 decode threads a batch takes as long to decode as to run (H100, LRASPP):
  // a backlog of 4 batches left them a single batch of runway, and each late lease idled the GPU.
  const int64_t target = LeaseTargetRows(batch);
  // While results are held back (a layout trial beside the evaluation: seconds) the leases they
  // keep open do not count against --max-leases, or the device would idle once it had that many.
  const bool under_cap = held < static_cast<size_t>(options_.max_leases) || holding;
  if (under_cap && (held == 0 || backlog < target)) return true;
  // Woken by every delivered result, so the next shard is leased as soon as there is room.
  wake_leaser_ = false;
  mu_.AwaitWithTimeout(absl::Condition(&wake_leaser_), absl::Milliseconds(50));
  return false;
}

std::optional<v1::ShardAssignment> Worker::LeaseOne(Backoff* backoff) {
  v1::AcquireShardRequest request;
  // A long poll: with nothing to do now, tallyd answers as soon as a shard is there (a new job's
  // first shard reaches an idle worker at once, not at its next poll). Stop() cancels the call.
  request.set_max_wait_ms(kLeaseWaitMs);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(30));
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return std::nullopt;
    request.set_worker_id(worker_id_);
    lease_call_ = &ctx;
  }
  v1::AcquireShardResponse response;
  const double t0 = NowUnix();
  grpc::Status s = stub_->AcquireShard(&ctx, request, &response);
  {
    absl::MutexLock lock(&mu_);
    lease_call_ = nullptr;
  }
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      absl::MutexLock lock(&mu_);
      need_register_ = true;
      return std::nullopt;
    }
    // An assignment that cannot be parsed lands here too: the coordinator takes that lease back
    // once our heartbeats do not list it.
    const double delay = backoff->Next();
    Log("leasing work from ", options_.coordinator, " failed (", s.error_message(), "); retrying in ",
        absl::StrFormat("%.1f", delay), " s");
    SleepFor(delay);
    return std::nullopt;
  }
  backoff->Reset();
  if (!response.has_assignment()) {
    TrimMemoryWhenIdle();
    // retry_after_ms 0 follows a full wait; a server that did not wait gets no busy loop.
    const double retry = response.retry_after_ms() / 1000.0;
    if (retry > 0 || NowUnix() - t0 < 0.1) SleepFor(std::max(0.02, retry));
    return std::nullopt;
  }
  return std::move(*response.mutable_assignment());
}

void Worker::Accept(const v1::ShardAssignment& a) {
  LeaseKey key{a.job_id(), a.shard_id(), a.lease_id()};
  bool known_bad = false;
  {
    absl::MutexLock lock(&mu_);
    trimmed_ = false;
    LeaseBuffer& lb = leases_[a.lease_id()];
    lb.key = key;
    lb.expected = a.rows_size();
    lb.last_flush = NowUnix();
    known_bad = failed_jobs_.count(a.job_id()) > 0;
  }
  if (absl::Status ok = CheckAssignment(a); !ok.ok()) {
    Release(key, std::string(ok.message()), false);
    return;
  }
  if (known_bad) {
    Release(key, "this worker cannot run the job's model", false);
    return;
  }
  absl::Status started = StartJob(a);
  if (!started.ok()) {
    Log("cannot run job ", a.job_id(), ": ", started.message());
    Release(key, std::string(started.message()), false);
    OnFatal(JobError{a.job_id(), std::string(started.message()), false, IsWorkerLocal(started)});
    return;
  }
  std::vector<v1::ManifestRow> rows(a.rows().begin(), a.rows().end());
  absl::MutexLock lock(&mu_);
  evaluator_->pipeline->Submit(key, std::move(rows));
}

absl::Status Worker::FinishRun() {
  SdNotify("STOPPING=1");
  std::string out_of_service;
  RowEvaluator* pipeline = nullptr;
  {
    absl::MutexLock lock(&mu_);
    out_of_service = out_of_service_;
    if (evaluator_) pipeline = evaluator_->pipeline.get();  // Replaced only by this thread.
  }
  if (!out_of_service.empty()) {
    Flush(10);
    return absl::FailedPreconditionError(absl::StrCat("out of service: ", out_of_service));
  }
  // Graceful stop: finish what is in hand and send it.
  Log("stopping: finishing the rows in hand");
  if (pipeline != nullptr) pipeline->WaitIdle();
  Flush(10);
  return absl::OkStatus();
}

absl::Status Worker::CheckAssignment(const v1::ShardAssignment& a) const {
  if (a.end() - a.begin() != a.rows_size()) {
    return absl::InvalidArgumentError(absl::StrCat("assignment of shard ", a.shard_id(), " has ", a.rows_size(),
                                                   " rows for the range [", a.begin(), ", ", a.end(), ")"));
  }
  for (int i = 0; i < a.rows_size(); ++i) {
    if (a.rows(i).index() != a.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("assignment of shard ", a.shard_id(), ": row ", i,
                                                     " has index ", a.rows(i).index()));
    }
  }
  return absl::OkStatus();
}

void Worker::Release(const LeaseKey& key, const std::string& reason, bool isolate_rows) {
  v1::ReleaseShardRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  request.set_job_id(key.job_id);
  request.set_shard_id(key.shard_id);
  request.set_lease_id(key.lease_id);
  request.set_reason(reason);
  request.set_isolate_rows(isolate_rows);
  v1::ReleaseShardResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10));
  grpc::Status s = stub_->ReleaseShard(&ctx, request, &response);
  // If this fails the coordinator still takes the lease back: our heartbeats stop listing it.
  if (!s.ok()) Log("releasing shard ", key.shard_id, " of job ", key.job_id, " failed: ", s.error_message());
  DropLease(key.lease_id);
}

namespace {
// "cuda:N" -> N ("cuda" -> 0); -1 for anything else.
int CudaDeviceIndex(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return -1;
  int index = 0;
  if (device.size() > 5 && !absl::SimpleAtoi(device.substr(5), &index)) return -1;
  return index;
}
}  // namespace

std::vector<std::string> WorkerDevices(const WorkerOptions& options) {
  if (options.device.rfind("cuda", 0) != 0) return {options.device.empty() ? "cpu" : options.device};
  const int first = std::max(0, CudaDeviceIndex(options.device));
  std::vector<std::string> out;
  for (int i = 0; i < std::max(1, options.gpus_per_worker); ++i) out.push_back(absl::StrCat("cuda:", first + i));
  return out;
}

absl::Status Worker::StartJob(const v1::ShardAssignment& a) {
  RowEvaluator* previous = nullptr;  // evaluator_ is replaced only by this thread.
  {
    absl::MutexLock lock(&mu_);
    if (evaluator_ && evaluator_->job_id == a.job_id()) return absl::OkStatus();
    if (evaluator_) previous = evaluator_->pipeline.get();
  }
  if (previous != nullptr) {
    // One model at a time: let the previous job's rows finish before loading the next model.
    previous->WaitIdle();
    std::unique_ptr<Evaluator> old;
    {
      absl::MutexLock lock(&mu_);
      old = std::move(evaluator_);
    }
    old->pipeline.reset();
    if (old->runner) {  // Kept for the next job, which may run the same model.
      idle_runner_key_ = old->runner_key;
      idle_runner_ = std::move(old->runner);
    }
    old.reset();
  }
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
  if (config.predictions()) {
    // No model: score the manifest's predictions on the CPU, one row per thread.
    const int threads = options_.threads > 0 ? options_.threads
                                             : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    Log("job ", job_id, ": scoring predictions on ", threads, " thread(s)");
    evaluator->pipeline = std::make_unique<ScoringPipeline>(config, threads, on_result, on_fatal, on_timeout);
    absl::MutexLock lock(&mu_);
    evaluator_ = std::move(evaluator);
    return absl::OkStatus();
  }
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
  PipelineOptions po;
  po.decode_threads = options_.threads;
  po.default_batch_size = DefaultBatchSize(evaluator->runner->is_cuda());
  ASSIGN_OR_RETURN(po.batch_size, WorkerBatchSize(config, po.default_batch_size));
  po.max_memory = config.max_memory;
  po.cold_runner = evaluator->runner->is_cuda() && !reused;
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
  po.decode_device = evaluator->runner->is_cuda() ? CudaDeviceIndex(WorkerDevices(options_).front()) : -1;
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
  po.any_input_size = config.input_height > 0;
  po.max_image_pixels = config.max_image_pixels;
  po.batch_timeout_seconds = config.batch_timeout_seconds;
  po.nonfinite_warn = config.nonfinite == NonfinitePolicy::kWarn;
  po.ignore_index = config.ignore_index;
  po.label_map = config.label_map;
  po.num_thresholds = config.thresholds.size();
  po.thumbnails = config.thumbnails;
  po.empty_score = config.empty_score;
  po.all_foreground = config.IsForegroundClass(0);
  if (!config.save_predictions.empty()) {
    ASSIGN_OR_RETURN(po.save_predictions, PreparePredictionFolder(config.save_predictions));
  }
  evaluator->pipeline = std::make_unique<Pipeline>(evaluator->runner.get(), po, on_result, on_fatal, on_timeout);
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

void Worker::OnResult(const LeaseKey& lease, v1::ImageResult result) {
  absl::MutexLock lock(&mu_);
  ++images_total_;
  auto it = leases_.find(lease.lease_id);
  if (it == leases_.end()) return;  // Revoked meanwhile.
  it->second.pending.push_back(std::move(result));
  ++it->second.delivered;
  // The leasing loop waits for room in the backlog; the reporter for complete shards.
  wake_leaser_ = true;
  if (it->second.delivered >= it->second.expected) wake_reporter_ = true;
}

void Worker::OnFatal(const JobError& error) {
  std::vector<LeaseKey> drop;
  {
    absl::MutexLock lock(&mu_);
    failed_jobs_[error.job_id] = error.message;
    job_errors_.push_back(error);
    if (error.worker_local) out_of_service_ = error.message;
    for (auto& [id, lb] : leases_) {
      if (error.worker_local || lb.key.job_id == error.job_id) drop.push_back(lb.key);
    }
  }
  // Results already produced are still sent; the rows not yet evaluated go back to the coordinator
  // (it also takes them back when it hears of the error).
  absl::MutexLock lock(&mu_);
  for (const LeaseKey& key : drop) {
    if (evaluator_) evaluator_->pipeline->Drop(key.lease_id);
  }
  wake_leaser_ = wake_reporter_ = true;
}

void Worker::OnTimeout(const LeaseKey& lease, const std::vector<int64_t>& indices, const std::string& what,
                       double seconds) {
  const std::string message = absl::StrFormat("timed out after %.0f s (%s; --batch-timeout)", seconds, what);
  if (indices.size() == 1) {
    v1::ImageResult r;
    r.set_index(indices[0]);
    r.set_error(message);
    OnResult(lease, std::move(r));
  }
  Flush(10);
  // A batch: nobody knows which row hangs, so its rows are retried one by one (by a fresh process).
  if (indices.size() > 1) Release(lease, message, true);
  Log(message, "; restarting (exit code ", kExitRestart, ")");
  std::_Exit(kExitRestart);  // The stuck thread cannot be stopped; the supervisor restarts us.
}

void Worker::Flush(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      bool pending = !job_errors_.empty();
      for (const auto& [id, lb] : leases_) pending |= !lb.pending.empty() || lb.delivered >= lb.expected;
      if (!pending) return;
      wake_reporter_ = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Worker::TrimMemoryWhenIdle() {
  RowEvaluator* pipeline = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (trimmed_ || !leases_.empty() || (evaluator_ && evaluator_->pipeline->Backlog() > 0)) return;
    trimmed_ = true;
    if (evaluator_) pipeline = evaluator_->pipeline.get();  // Replaced only by this thread.
  }
  if (pipeline) pipeline->ReleaseIdleBuffers();
  malloc_trim(0);
}

void Worker::DropLease(int64_t lease_id) {
  absl::MutexLock lock(&mu_);
  leases_.erase(lease_id);
  if (evaluator_) evaluator_->pipeline->Drop(lease_id);
}

bool Worker::Send(const LeaseKey& key, std::vector<v1::ImageResult>* results, bool complete) {
  v1::ReportResultsRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
    if (evaluator_ && evaluator_->job_id == key.job_id) *request.mutable_stats() = evaluator_->pipeline->Stats();
  }
  // The class count of the job these results belong to, whatever model this worker runs now.
  request.set_num_classes(ClassesOf(*results));
  request.set_job_id(key.job_id);
  request.set_shard_id(key.shard_id);
  request.set_lease_id(key.lease_id);
  request.set_shard_complete(complete);
  for (v1::ImageResult& r : *results) *request.add_results() = std::move(r);
  v1::ReportResultsResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(60));
  grpc::Status s = stub_->ReportResults(&ctx, request, &response);
  if (s.ok()) {
    if (response.abandon()) DropLease(key.lease_id);
    return true;
  }
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    Log("the coordinator no longer knows this worker (", s.error_message(), "); dropping shard ", key.shard_id);
    absl::MutexLock lock(&mu_);
    need_register_ = true;
    return true;  // Nothing to retry: the lease is gone with the coordinator's memory of us.
  }
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    // The coordinator ended the lease when it rejected the results; say so explicitly too, so the
    // shard cannot stay orphaned whichever side saw what.
    Log("the coordinator rejected results for shard ", key.shard_id, " of job ", key.job_id, ": ", s.error_message());
    Release(key, absl::StrCat("results rejected: ", s.error_message()), false);
    return true;
  }
  // Keep the results and try again: they are not lost while this process lives.
  results->clear();
  for (v1::ImageResult& r : *request.mutable_results()) results->push_back(std::move(r));
  Log("sending results to ", options_.coordinator, " failed (", s.error_message(), "); will retry");
  return false;
}

bool Worker::SendJobError(const JobError& error) {
  v1::ReportJobErrorRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  request.set_job_id(error.job_id);
  request.set_message(error.message);
  request.set_definitive(error.definitive);
  request.set_worker_local(error.worker_local);
  v1::ReportJobErrorResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10));
  grpc::Status s = stub_->ReportJobError(&ctx, request, &response);
  return s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND;
}

void Worker::ReporterLoop() {
  Backoff backoff(0.25, 2.0);
  while (true) {
    std::vector<JobError> errors;
    struct Batch {
      LeaseKey key;
      std::vector<v1::ImageResult> results;
      bool complete;
    };
    std::vector<Batch> batches;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&wake_reporter_), absl::Milliseconds(100));
      wake_reporter_ = false;
      if (done_) return;
      const double now = NowUnix();
      for (auto& [id, lb] : leases_) {
        const bool complete = lb.delivered >= lb.expected;
        if (lb.pending.empty() && !complete) continue;
        if (!complete && now - lb.last_flush < kFlushSeconds) continue;
        Batch b{lb.key, std::move(lb.pending), complete};
        lb.pending.clear();
        lb.last_flush = now;
        batches.push_back(std::move(b));
      }
      // Results first: rows evaluated before a model error still count.
      if (batches.empty()) errors.swap(job_errors_);
    }
    bool failed = false;
    for (Batch& b : batches) {
      if (failed || !Send(b.key, &b.results, b.complete)) {
        // Put the results back in front, to be sent again.
        failed = true;
        absl::MutexLock lock(&mu_);
        auto it = leases_.find(b.key.lease_id);
        if (it != leases_.end()) {
          it->second.pending.insert(it->second.pending.begin(), std::make_move_iterator(b.results.begin()),
                                    std::make_move_iterator(b.results.end()));
        }
        continue;
      }
      if (b.complete) {
        absl::MutexLock lock(&mu_);
        auto it = leases_.find(b.key.lease_id);
        if (it != leases_.end() && it->second.pending.empty()) leases_.erase(it);
      }
    }
    for (const JobError& e : errors) {
      if (!SendJobError(e)) {
        failed = true;
        absl::MutexLock lock(&mu_);
        job_errors_.push_back(e);
      }
    }
    if (failed) {
      const double delay = backoff.Next();
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(delay));
    } else {
      backoff.Reset();
    }
  }
}

v1::WorkerGauges Worker::Gauges(std::deque<std::pair<double, int64_t>>* samples) {
  constexpr double kRateWindowSeconds = 10;
  v1::WorkerGauges g;
  const double now = NowUnix();
  g.set_images_total(images_total_);
  samples->emplace_back(now, images_total_);
  // Keep one sample at least the window old (the rate's start), and nothing older than that.
  while (samples->size() > 2 && now - (*samples)[1].first >= kRateWindowSeconds) samples->pop_front();
  const auto& [t0, n0] = samples->front();
  if (now > t0) g.set_images_per_second(static_cast<double>(images_total_ - n0) / (now - t0));
  if (evaluator_ != nullptr) {
    g.set_job_id(evaluator_->job_id);
    g.set_images_held(evaluator_->pipeline->HeldRows());
  }
  if (evaluator_ != nullptr && evaluator_->runner != nullptr) {
    for (const GpuUsage& u : evaluator_->runner->Stats().gpus) {
      v1::GpuStats* gs = g.add_gpus();
      gs->set_device(u.device);
      gs->set_name(u.name);
      gs->set_peak_memory_bytes(u.peak_memory_bytes);
      gs->set_memory_used_bytes(u.memory_used_bytes);
      gs->set_memory_total_bytes(u.memory_total_bytes);
    }
  }
  return g;
}

void Worker::HeartbeatLoop() {
  SdWatchdog watchdog;  // WatchdogSec= of the unit: this loop (it takes mu_) proves the worker alive.
  std::deque<std::pair<double, int64_t>> rate_samples;
  {
    absl::MutexLock lock(&mu_);
    rate_samples.emplace_back(NowUnix(), images_total_);  // The rate's start before the first heartbeat.
  }
  bool sent_held = false;  // The last heartbeat said rows were held (Job.images_held).
  while (true) {
    v1::HeartbeatRequest request;
    double period = 1.0;
    {
      absl::MutexLock lock(&mu_);
      // One period, or less when rows start or stop being held: progress shows them at once.
      const absl::Time until = absl::Now() + absl::Seconds(heartbeat_seconds_);
      while (!done_ && absl::Now() < until) {
        mu_.AwaitWithTimeout(absl::Condition(&done_), std::min(absl::Milliseconds(100), until - absl::Now()));
        if (evaluator_ != nullptr && (evaluator_->pipeline->HeldRows() > 0) != sent_held) break;
      }
      if (done_) return;
      watchdog.Kick();
      period = heartbeat_seconds_;
      request.set_worker_id(worker_id_);
      for (auto& [id, lb] : leases_) {
        v1::HeldLease* h = request.add_leases();
        h->set_job_id(lb.key.job_id);
        h->set_shard_id(lb.key.shard_id);
        h->set_lease_id(lb.key.lease_id);
      }
      *request.mutable_gauges() = Gauges(&rate_samples);
      sent_held = request.gauges().images_held() > 0;
    }
    v1::HeartbeatResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(std::max(2.0, period * 2)));
    grpc::Status s = stub_->Heartbeat(&ctx, request, &response);
    if (!s.ok()) {
      Log("heartbeat to ", options_.coordinator, " failed: ", s.error_message());
      continue;
    }
    if (response.reregister()) {
      absl::MutexLock lock(&mu_);
      need_register_ = true;
    }
    for (const v1::HeldLease& r : response.revoked()) {
      Log("lease of shard ", r.shard_id(), " of job ", r.job_id(), " was revoked; dropping it");
      DropLease(r.lease_id());
    }
  }
}

}  // namespace tally
