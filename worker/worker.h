// The worker's control plane: registers with the coordinator, leases shards, feeds them to the
// evaluation pipeline of the current job, streams results back and heartbeats. All calls go from
// the worker to the coordinator (the worker serves nothing).
//
// Threads: Run()'s thread leases shards; a reporter thread sends results (every row of a shard,
// then `shard_complete`); a heartbeat thread keeps the leases alive and learns about revoked ones.
// A coordinator that cannot be reached is retried with backoff capped near the heartbeat interval
// (so a restarted coordinator sees its workers back within a few seconds), and said so in the
// log; buffered results are kept meanwhile.
//
// Every lease ends in a commit or an explicit release: results the coordinator rejects, and
// assignments this worker cannot use, are released with the reason. A problem of this worker's
// own (its device, its copy of the model) takes it out of service (Run returns FAILED_PRECONDITION,
// exit code 3); a decode or forward pass past the batch timeout fails those rows (or, for a batch,
// hands its rows back to be retried one by one) and ends the process with exit code 75, for its
// supervisor to restart it.
#ifndef TALLY_WORKER_WORKER_H_
#define TALLY_WORKER_WORKER_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/backoff.h"
#include "common/security/channel_security.h"
#include "common/job/job_config.h"
#include "grpcpp/grpcpp.h"
#include "proto/tally.grpc.pb.h"
#include "worker/interfaces/model_runner.h"
#include "worker/pipeline/pipeline.h"
#include "worker/interfaces/row_evaluator.h"

namespace tally {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  ClientSecurityOptions security;   // TLS files and the worker token (common/security/channel_security.h).
  std::string device = "cpu";       // cpu | cuda:N
  std::string name;                 // Shown in reports; default host:device.
  int threads = 0;                  // Decode/metric threads (and intra-op threads on CPU); 0 = this
                                    // worker's share of the cores (DefaultThreads in worker.cc).
  int default_batch_size = 0;       // For jobs that leave it to the worker; 0 = 8 on CPU, 32 on CUDA.
                                    // Must divide kDefaultBatchAlignment (common/job/job_config.h).
  double max_connect_seconds = 0;   // Give up registering after this long; 0 = never.
  int max_leases = 16;              // Shards held at once; the backlog target usually limits first.
  // Started by this tallyd (its pid, from TALLY_SPAWNED_BY): the worker ends within a second of that
  // process's end, whatever the way it ended; 0 = not spawned.
  int spawned_by = 0;
  bool count_logit_ties = false;
  // Off by default: with benchmark mode each process times and picks its own convolution
  // algorithms, so two GPUs can round differently (measured: DeepLabV3, 3e-6 of pixels flipped
  // between a 1-GPU and a 2-GPU run) for no measured speed-up; see BENCHMARKS.md.
  bool cudnn_benchmark = false;
  // TorchScript's profiling executor optimisations (fusion). Off by default: on the benchmark
  // models they gave no speed and cost 0.7-1 s of start-up, 3 s more with the layout trial
  // (BENCHMARKS.md).
  bool jit_optimize = false;
  // Where --channels-last auto's trial results are kept between processes (one small file per
  // model file's SHA-256, runner options, batch shape, GPU and library versions), so a model that
  // was tried on this machine starts without the trial; "" keeps none.
  std::string cache_dir;
  // Extra passes over a fresh CUDA model's first batch before its results: only the JIT optimiser
  // needs them (its first passes run unoptimised and round differently). Without them the first
  // batch is its own warm-up and the steady rate is timed from its end.
  int warmup_batches = 0;
  bool warm_up_device = true;  // ModelRunnerOptions::warm_up_device.
  // Python models: once a job's model is loaded, start the next job's model
  // process with the installed modules it will need imported (ModelRunnerOptions::spare_interpreter).
  bool spare_interpreter = true;
  int staging_slots = 3;  // PipelineOptions::staging_slots.
  double gpu_memory_limit_gib = 0;  // Cap on this worker's device memory (0 = none).
  // GPUs this worker owns, from `device` on (cuda:N .. cuda:N+K-1): Python models get them all;
  // TorchScript jobs need K = 1.
  int gpus_per_worker = 1;
  // Host memory this worker's rows may use, bytes (--max-worker-memory): > 0 as given; 0 = the
  // default, the cgroup's limit (else physical memory, divided among the host's GPUs for a GPU
  // worker) less what the process holds once the job's model is loaded; < 0 = no budget.
  int64_t max_worker_memory = 0;
  // Workers sharing this host's memory (--host-workers; 0: unknown): the default budget is its share.
  int host_workers = 0;
};

// Exit codes of tally-worker besides 0 (stopped), 1 (error) and 2 (usage).
inline constexpr int kExitOutOfService = 3;  // A local problem; restarting will not help.
inline constexpr int kExitRestart = 75;      // Timed out in a decode or forward pass; restart me.
// The coordinator refused this worker's token (unknown, or not a worker token) kMaxRefusals times
// in a row: restarting with the same token will not help (sysexits' EX_NOPERM).
inline constexpr int kExitRefused = 77;
inline constexpr int kMaxRefusals = 3;

// What a model on a worker with these options is given: {"cpu"} or {"cuda:N", ...}
// (gpus_per_worker of them, from `device` on).
std::vector<std::string> WorkerDevices(const WorkerOptions& options);

// The model runner of a job on the worker's devices (WorkerDevices), with the job's settings and
// the worker's: TorchScript or Python by the model's name. Checks the model (and a Python
// interpreter named by path) against the data roots.
// `trial_cache_key` (LayoutTrialKey) keys its on-disk layout trials (WorkerOptions::cache_dir) with
// the network the runner loads; "" keeps none.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateJobRunner(const JobConfig& config, const WorkerOptions& options,
                                                             const std::string& trial_cache_key = "");
// What a runner from CreateJobRunner is, for reuse by a later job: the model file's SHA-256 (the
// coordinator's, from the job spec; where it has none, the file's path, size, inode and mtime)
// and every option the runner was built with except the memory layout, which a runner changes in
// place (ModelRunner::SetChannelsLast).
std::string RunnerKey(const JobConfig& config, const std::string& model_sha256, const WorkerOptions& options);
// What a kept --channels-last auto trial depends on besides the network and the batch shape: the
// runner's options of RunnerKey without the model file's identity. Layout speed is a property of a
// network, not of its weights: a new checkpoint of a network tried on this machine needs no trial.
std::string LayoutTrialKey(const JobConfig& config, const WorkerOptions& options);

// --threads 0: this worker's share of the cores it may run on: all of them for a CPU worker; for a
// GPU worker, divided among the host's GPUs (/dev/nvidiaN).
int DefaultThreads(const std::string& device);
// The host's NVIDIA GPUs (/dev/nvidiaN): GPU workers share the host's cores and memory among them.
int HostGpus();

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker();

  // Serves until Stop(). Returns UNAVAILABLE if the coordinator could not be reached within
  // max_connect_seconds, FAILED_PRECONDITION when this worker is out of service (its device does
  // not work, the model file is missing on this host).
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Asks Run() to stop leasing, finish the rows in hand, send their results and return.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct LeaseBuffer {
    LeaseKey key;
    int64_t expected = 0;   // Rows in the shard.
    int64_t delivered = 0;  // Results produced so far.
    std::vector<v1::ImageResult> pending;  // Not yet sent.
    double last_flush = 0;
  };
  struct Evaluator {
    std::string job_id;
    std::string runner_key;                  // RunnerKey() of the runner's job: what it can be reused for.
    std::unique_ptr<ModelRunner> runner;     // Null for prediction jobs.
    // --prediction-store: the job's runner in front of `runner` (worker/store/store_runner.h).
    std::unique_ptr<ModelRunner> store_runner;
    std::unique_ptr<RowEvaluator> pipeline;  // Pipeline (model) or ScoringPipeline (predictions).
  };
  // Proposes this worker's trial for a job-wide "auto" choice (the request's channels_last and/or
  // decode) to the coordinator and returns the job's choice (first proposal wins). Retries for up
  // to a minute while the coordinator is unreachable.
  absl::StatusOr<v1::ResolveLayoutResponse> Resolve(const std::string& job_id, v1::ResolveLayoutRequest request);

  explicit Worker(WorkerOptions options);
  // The batch size this worker uses for jobs that leave it to the workers.
  int DefaultBatchSize(bool cuda) const;
  absl::Status Register(bool first);
  absl::Status StartJob(const v1::ShardAssignment& a);
  // StartJob's steps. False when `job_id` already runs here; else the previous job's rows are
  // finished and its runner kept idle for reuse.
  bool RetirePreviousJob(const std::string& job_id);
  // The idle runner when it can serve the job (true: reused), else a new one.
  absl::StatusOr<bool> TakeRunner(const JobConfig& config, const v1::ShardAssignment& a, Evaluator* evaluator);
  // TakeRunner, or for a rescore no model (every row from the prediction store); then, with
  // --prediction-store, the store's runner in front of it. The runner rows go to.
  absl::StatusOr<ModelRunner*> JobModel(const JobConfig& config, const v1::ShardAssignment& a, int batch_size,
                                        bool use_store, Evaluator* evaluator, bool* reused);
  // The host memory a job's rows may use (WorkerOptions::max_worker_memory): asked once the job's
  // model is loaded, so the default leaves what the process holds by then. 0: no budget.
  int64_t MemoryBudget() const;
  absl::StatusOr<PipelineOptions> PipelineOptionsFor(const JobConfig& config, const std::string& job_id,
                                                     const ModelRunner& runner, bool reused);
  struct JobError {
    std::string job_id;
    std::string message;
    bool definitive = false;
    bool worker_local = false;
    bool model_mismatch = false;  // ReportJobErrorRequest.model_mismatch.
  };
  // The model file (and, for Python models, each file an option names) this worker would load has
  // the SHA-256 the job was submitted with; else FAILED_PRECONDITION naming this host, the path and
  // both hashes. A file is hashed once per identity (device, inode, size, modification time).
  // Called from the leasing thread only.
  absl::Status CheckModelFiles(const v1::JobSpec& spec);
  // The SHA-256 of `path` as this worker sees it ("" if it cannot be read), from the cache.
  std::string FileHash(const std::string& path);
  // The steps of Run().
  // The coordinator forgot this worker (restarted, or it was silent too long): drop the leases
  // it no longer knows and register again.
  absl::Status ReregisterIfForgotten() ABSL_LOCKS_EXCLUDED(mu_);
  // True when the worker should lease another shard now; else waits a little for room.
  bool HasRoomForAnotherShard() ABSL_LOCKS_EXCLUDED(mu_);
  // The backlog (rows accepted, not yet delivered) under which it leases more, for `batch`.
  int64_t LeaseTargetRows(int batch) const;
  // One AcquireShard call; the assignment, or nothing (retried after a pause).
  std::optional<v1::ShardAssignment> LeaseOne(Backoff* backoff) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks an assignment, loads its job's model if needed and queues its rows, or releases it.
  void Accept(v1::ShardAssignment a) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FinishRun() ABSL_LOCKS_EXCLUDED(mu_);
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);
  // OnTimeout: the process restarts once its results are flushed; a lease taken meanwhile would be
  // lost with it (and count against its rows), so none is taken and the long poll is cancelled.
  void StopLeasing() ABSL_LOCKS_EXCLUDED(mu_);
  bool LeasingStopped() ABSL_LOCKS_EXCLUDED(mu_);

  void OnResult(const LeaseKey& lease, v1::ImageResult result);
  void OnFatal(const JobError& error);
  void OnTimeout(const LeaseKey& lease, const std::vector<int64_t>& indices, const std::string& what,
                 double seconds);
  void ReporterLoop();
  void HeartbeatLoop();
  // Sends a lease's results in as many ReportResults as the message limit needs (a row too large
  // for any fails with the reason); returns false if it must be retried later, `results` then
  // holding the rows not yet taken.
  bool Send(const LeaseKey& key, std::vector<v1::ImageResult>* results, bool complete);
  enum class SendOutcome { kSent, kRetry, kLeaseGone };
  SendOutcome SendMessage(const LeaseKey& key, std::vector<v1::ImageResult>* results, bool complete);
  bool SendJobError(const JobError& error);
  // Gives a lease back to the coordinator (best effort) and forgets it. `started` false: no row of it was
  // begun (the worker refuses the job), which is no mark against the rows.
  void Release(const LeaseKey& key, const std::string& reason, bool isolate_rows, bool started = true);
  // Checks an assignment before any of its rows is evaluated.
  absl::Status CheckAssignment(const v1::ShardAssignment& a) const;
  // Waits (up to `seconds`) until every produced result has been sent.
  void Flush(double seconds);
  void DropLease(int64_t lease_id);
  void SleepFor(double seconds);
  // Once per idle spell (no lease held, nothing queued): gives the allocator's free memory back
  // to the system, so a finished job's large images do not stay in the worker's RSS.
  void TrimMemoryWhenIdle() ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerOptions options_;
  // The last job's model, loaded, while no job runs it: the next job with the same RunnerKey (the
  // model file's SHA-256 and everything the runner was built with) takes it instead of loading
  // again (and skips the warm-up passes). Touched only by the thread that starts jobs.
  std::string idle_runner_key_;
  std::unique_ptr<ModelRunner> idle_runner_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerControl::Stub> stub_;

  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  double heartbeat_seconds_ ABSL_GUARDED_BY(mu_) = 1.0;
  std::map<int64_t, LeaseBuffer> leases_ ABSL_GUARDED_BY(mu_);           // By lease id.
  std::vector<JobError> job_errors_ ABSL_GUARDED_BY(mu_);                // To report.
  std::map<std::string, std::string> failed_jobs_ ABSL_GUARDED_BY(mu_);  // Jobs this worker cannot run.
  // FileHash's cache: path -> (its identity when hashed, the hash). The leasing thread's alone.
  std::map<std::string, std::pair<std::string, std::string>> file_hashes_;
  bool need_register_ ABSL_GUARDED_BY(mu_) = false;
  std::string out_of_service_ ABSL_GUARDED_BY(mu_);  // Non-empty: why this worker stopped serving.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;           // Stop() was called.
  bool leasing_stopped_ ABSL_GUARDED_BY(mu_) = false;  // StopLeasing() was called.
  grpc::ClientContext* lease_call_ ABSL_GUARDED_BY(mu_) = nullptr;  // The AcquireShard call in flight.
  static constexpr int kLeaseWaitMs = 2000;  // AcquireShardRequest.max_wait_ms.
  bool done_ ABSL_GUARDED_BY(mu_) = false;           // Reporter and heartbeat threads exit.
  // The reporter's and heartbeat's calls in flight (CallInFlight): cancelled when done_ is set, so
  // that the end of the process never waits on a call's deadline (a coordinator that stopped
  // answering held a worker's exit for the report call's 60 s after its 10 s flush).
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  class CallInFlight;
  // Wake-ups, each the condition of one wait: the leasing loop (a result freed room, or stop),
  // the reporter (a shard completed, an error or a flush is waiting).
  bool wake_leaser_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_reporter_ ABSL_GUARDED_BY(mu_) = false;
  // The reporter has taken results or job errors out of leases_/job_errors_ and is sending them:
  // Flush waits for it too, or a worker leaving at once (out of service) cancelled the very call
  // that said why (~Worker cancels the calls in flight).
  bool reporter_sending_ ABSL_GUARDED_BY(mu_) = false;
  bool trimmed_ ABSL_GUARDED_BY(mu_) = false;  // TrimMemoryWhenIdle ran since the last lease.
  int64_t images_total_ ABSL_GUARDED_BY(mu_) = 0;  // Rows with a result since start (WorkerGauges).

  // The gauges a heartbeat carries: rows done, their recent rate, the model's GPUs. `samples` is
  // the heartbeat thread's history of (time, images_total) for the rate.
  v1::WorkerGauges Gauges(std::deque<std::pair<double, int64_t>>* samples) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Created and replaced by Run()'s thread (under mu_); read by the others under mu_.
  std::unique_ptr<Evaluator> evaluator_ ABSL_GUARDED_BY(mu_);
  std::thread device_check_;  // A GPU's check, beside the first lease (Run).
  std::thread reporter_;
  std::thread heartbeat_;
};

}  // namespace tally

#endif  // TALLY_WORKER_WORKER_H_
