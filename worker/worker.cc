// The worker's control plane (worker/worker.h): registration, the run loop that leases shards
// while it has room for them, assignments accepted and leases released. A job's runner and
// pipeline are made in worker_job.cc; results and heartbeats go out from worker_reporter.cc.
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
#include "base/clock.h"
#include "common/security/data_roots.h"
#include "common/job/job_config.h"
#include "base/backoff.h"
#include "base/log.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/process/sd_notify.h"
#include "base/status_macros.h"
#include "common/process/subprocess.h"
#include "worker/python/python_runner.h"
#include "worker/scoring/scoring.h"
#include "worker/worker_internal.h"

namespace tally {

// --threads 0: this worker's share of the cores it may run on: all of them for a CPU worker; for a
// GPU worker, divided among the host's GPUs (/dev/nvidiaN), one worker per GPU as the systemd
// template and `tallyd --spawn-workers` run them.
int DefaultThreads(const std::string& device) {
  const int cores = static_cast<int>(AllowedCpus().size());
  if (device.rfind("cuda", 0) != 0) return std::max(1, cores);
  return std::max(1, cores / std::max(1, HostGpus()));
}

int HostGpus() {
  int gpus = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    gpus += name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
            name.find_first_not_of("0123456789", 6) == std::string::npos;
  }
  return gpus;
}

namespace {

bool IsWorkerLocal(const absl::Status& s) {
  return absl::IsNotFound(s) || absl::IsUnavailable(s) || absl::IsUnimplemented(s);
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
  // A coordinator restarted elsewhere (a container given a new address) is looked up again within a
  // second: gRPC's default waits 30 s between lookups, and until then the channel dials the old
  // address (seen in test_containers: heartbeats failing 20 s after tallyd came back).
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  // A connection whose far end vanished without a word (this worker frozen while tallyd's container
  // was killed, then resumed) is found dead by a ping within 10 s and dialled again, instead of every
  // call on it running into its deadline until the kernel gives up on it (minutes). tallyd accepts
  // pings this often (server/server.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMillis);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  ASSIGN_OR_RETURN(w->channel_, CreateClientChannel(w->options_.coordinator, w->options_.security, args));
  w->stub_ = v1::WorkerControl::NewStub(w->channel_);
  return w;
}

Worker::~Worker() {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    for (grpc::ClientContext* call : calls_) call->TryCancel();
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

void Worker::StopLeasing() {
  absl::MutexLock lock(&mu_);
  leasing_stopped_ = true;
  if (lease_call_ != nullptr) lease_call_->TryCancel();
}

bool Worker::LeasingStopped() {
  absl::MutexLock lock(&mu_);
  return leasing_stopped_;
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
  request.set_spawned(options_.spawned_by > 0);
  const auto start = std::chrono::steady_clock::now();
  // Capped near the heartbeat interval: after a coordinator restart every worker is back within
  // about a second, without all of them dialling in the same instant.
  double heartbeat = 1.0;
  {
    absl::MutexLock lock(&mu_);
    heartbeat = heartbeat_seconds_;
  }
  Backoff backoff(0.25, std::max(0.5, heartbeat));
  int refusals = 0;
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
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED || s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      // The coordinator answered and said no: a token it does not know, or one of another role.
      // A few more tries (tallyd may be re-reading its tokens file), then the process ends with a
      // status that says so (kExitRefused), rather than retrying forever.
      const std::string why = absl::StrCat("refused by the coordinator at ", options_.coordinator, ": ",
                                           s.error_message());
      if (++refusals >= kMaxRefusals) {
        return absl::PermissionDeniedError(absl::StrCat(
            why, " (", refusals, " attempts); a worker needs a token of role worker, from --token-file or TALLY_TOKEN"));
      }
      Log(why, "; attempt ", refusals, " of ", kMaxRefusals);
      SleepFor(backoff.Next());
      continue;
    }
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
    if (assignment) Accept(std::move(*assignment));
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
    if (leasing_stopped_) {  // Restarting once flushed: wait for that, leasing nothing.
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
      return std::nullopt;
    }
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
    // Stop() cancels the long poll: not a failure to report.
    if (s.error_code() == grpc::StatusCode::CANCELLED && (Stopping() || LeasingStopped())) return std::nullopt;
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
  if (LeasingStopped()) {  // Answered just before StopLeasing() cancelled the call: given back unbegun.
    const v1::ShardAssignment& a = response.assignment();
    Release(LeaseKey{a.job_id(), a.shard_id(), a.lease_id()}, "the worker is restarting", false, false);
    return std::nullopt;
  }
  return std::move(*response.mutable_assignment());
}

void Worker::Accept(v1::ShardAssignment a) {
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
    Release(key, "this worker cannot run the job's model", false, /*started=*/false);
    return;
  }
  if (absl::Status same = CheckModelFiles(a.spec()); !same.ok()) {
    Log("refusing job ", a.job_id(), ": ", same.message());
    Release(key, std::string(same.message()), false, /*started=*/false);
    JobError error{a.job_id(), std::string(same.message())};
    error.model_mismatch = true;
    OnFatal(error);
    return;
  }
  absl::Status started = StartJob(a);
  if (!started.ok()) {
    Log("cannot run job ", a.job_id(), ": ", started.message());
    Release(key, std::string(started.message()), false, /*started=*/false);
    OnFatal(JobError{a.job_id(), std::string(started.message()), false, IsWorkerLocal(started)});
    return;
  }
  // Moved, not copied: a COCO row carries its image's detections (26 KB each in COCO val2017's).
  std::vector<v1::ManifestRow> rows(std::make_move_iterator(a.mutable_rows()->begin()),
                                    std::make_move_iterator(a.mutable_rows()->end()));
  // A random-order shard's rows are positions begin, begin + 1, ... of the job's order, scattered
  // over the manifest: its batches are aligned to positions, as a manifest-order shard's to indices.
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].set_position(a.spec().random_order() ? a.begin() + static_cast<int64_t>(i) : rows[i].index());
  }
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
  // Bounded, with the flush under the 30 s a container runtime (podman stop, Kubernetes) grants
  // before SIGKILL: rows held for an agreement from a tallyd that went away (a container restarted
  // under a new address) never finish, and their leases expire on the coordinator anyway.
  if (pipeline != nullptr && !pipeline->WaitIdle(absl::Seconds(15))) {
    Log("stopping: rows still in hand after 15 s; the coordinator takes their leases back");
  }
  Flush(10);
  return absl::OkStatus();
}

absl::Status Worker::CheckAssignment(const v1::ShardAssignment& a) const {
  if (a.end() - a.begin() != a.rows_size()) {
    return absl::InvalidArgumentError(absl::StrCat("assignment of shard ", a.shard_id(), " has ", a.rows_size(),
                                                   " rows for the range [", a.begin(), ", ", a.end(), ")"));
  }
  for (int i = 0; i < a.rows_size(); ++i) {
    if (a.spec().random_order() ? a.rows(i).index() < 0 : a.rows(i).index() != a.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("assignment of shard ", a.shard_id(), ": row ", i,
                                                     " has index ", a.rows(i).index()));
    }
  }
  return absl::OkStatus();
}

void Worker::Release(const LeaseKey& key, const std::string& reason, bool isolate_rows, bool started) {
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
  request.set_not_started(!started);
  v1::ReleaseShardResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10));
  grpc::Status s = stub_->ReleaseShard(&ctx, request, &response);
  // If this fails the coordinator still takes the lease back: our heartbeats stop listing it.
  if (!s.ok()) Log("releasing shard ", key.shard_id, " of job ", key.job_id, " failed: ", s.error_message());
  DropLease(key.lease_id);
}

}  // namespace tally
