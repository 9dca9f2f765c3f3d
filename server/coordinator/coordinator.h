// The coordinator's core: jobs, the shard ledger, worker leases and report building. Plain C++
// with no gRPC dependency; the service files adapt it to the wire.
//
// Scheduling: a job's manifest is cut into shards [begin, end). Workers pull shards one at a time
// (AcquireShard), oldest job first. A shard is done when every one of its rows has a committed
// result (evaluated or failed), whoever sent it: results are keyed by manifest index, so a re-run
// can never count a row twice.
//
// Invariant: every lease ends in a commit, an explicit release or an expiry. A lease is released
// when the worker gives it back (ReleaseShard), when its results are rejected, when the worker's
// heartbeat stops listing it, when the worker is taken out of service or goes silent for
// `lease_seconds`, and when the worker makes no progress for the job's batch timeout. A shard lost
// with its worker (not given back unbegun) is split into single-row shards, each leased alone on its
// worker (Shard::suspect), so that only a row that crashes or hangs workers fails (naming the row,
// once lost `max_shard_attempts` times in all) and its neighbours are evaluated.
//
// Job-level failure: a model error reported by one worker takes that worker off the job; the job
// fails when a second worker (or every worker in service) reports the same error, or at once when
// the worker says it is definitive. A worker-local problem (its device, its copy of the model)
// takes the worker out of service instead.
//
// Thread-safe. Methods never hold the internal lock across database I/O.
#ifndef TALLY_SERVER_COORDINATOR_COORDINATOR_H_
#define TALLY_SERVER_COORDINATOR_COORDINATOR_H_

#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sources/manifest.h"
#include "common/job/job_config.h"
#include "proto/tally.pb.h"
#include "server/store/job_store.h"
#include "server/report/live_report.h"
#include "common/job/row_order.h"
#include "metrics/bounded_mean.h"

namespace tally {

struct CoordinatorOptions {
  std::string state_dir;            // Holds tally.db and reports/<job_id>/.
  double lease_seconds = 10.0;      // A worker silent for this long loses its shards.
  double heartbeat_seconds = 1.0;   // Told to workers at registration.
  int max_shard_attempts = 2;
  int64_t max_manifest_rows = 50'000'000;
  // COCO annotation, results and panoptic JSON files larger than this are refused (--max-json-file-size).
  int64_t max_json_file_bytes = kDefaultMaxJsonFileBytes;
  // A submission's files (manifest, COCO JSON) must be read within this many seconds
  // (--submit-read-timeout), so that no submission holds a submission thread without bound.
  double submit_read_seconds = 300;
  double retain_days = 0;           // Finished jobs older than this are deleted; 0 = kept forever.
  // Unix time in seconds; tests inject a fake clock. Default: the wall clock.
  std::function<double()> clock;
  // Run lease expiry and report building on a background thread. Tests may drive them by hand
  // with ExpireLeases() and RunFinalizers().
  bool background_thread = true;
  // Fair share (README "Operating tallyd"): an owner's weight among owners with work (token name ->
  // weight; 1 when not listed; "" is the owner of jobs submitted without tokens).
  std::map<std::string, double> owner_weights;
  // A worker moves to a job that waits at an equal share only after this long on its current job
  // (one worker, two jobs: each in turn), so that workers do not switch models at every shard.
  double share_quantum_seconds = 30;
  // tallyd --prediction-store, --store-max-bytes: for jobs with a model that name no store (a job's
  // "off" opts out).
  std::string prediction_store;
  int64_t store_max_bytes = 0;
};


// What /metrics shows (server/http/metrics_exporter.h): counters since this tallyd started, gauges now.
struct CoordinatorMetrics {
  std::map<std::string, int64_t> jobs_by_state;  // queued, running, succeeded, failed, cancelled: all present.
  int64_t images_evaluated = 0;   // Rows committed with a result, since start.
  int64_t images_failed = 0;      // Rows committed as failed (bad input, a lost row), since start.
  int64_t images_remaining = 0;   // Rows of unfinished jobs without a committed result, now.
  int64_t shards_leased = 0;      // Leases granted.
  int64_t shards_expired = 0;     // Leases taken back from silent or stuck workers.
  int64_t shards_speculated = 0;  // Speculative copies granted (--speculate-after).
  int64_t shards_retried = 0;     // Shards queued again: a lease that ended without a commit put its shard
                                  // back whole, or each single row it was split into.
  int64_t workers_registered = 0; // In service now.
  int64_t workers_busy = 0;       // Of those, holding a lease.
  int64_t workers_out_of_service = 0;
  // Time to commit one ReportResults (one SQLite transaction): cumulative counts per upper bound.
  std::vector<double> commit_bounds;
  std::vector<uint64_t> commit_counts;  // Cumulative: commit_counts[i] = commits taking <= commit_bounds[i].
  uint64_t commit_count = 0;
  double commit_seconds_sum = 0;
  int64_t database_bytes = 0;     // tally.db and its write-ahead log.
  struct Worker {
    std::string worker_id;
    std::string name;
    std::string device;
    bool busy = false;
    v1::WorkerGauges gauges;
  };
  std::vector<Worker> workers;    // In service.
  // Running jobs' live estimates (docs/metrics.md "Answers before the end"), by job.
  std::vector<std::pair<std::string, std::vector<v1::LiveEstimate>>> live;
};

class Coordinator {
 public:
  // Opens or creates the state directory and database; resumes unfinished jobs found there.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();

  // Client API. Errors: INVALID_ARGUMENT for a bad spec or manifest, NOT_FOUND for a missing
  // model/manifest/job, FAILED_PRECONDITION for "not until the job has finished".
  // SubmitJob streams the manifest into the database; it blocks for as long as that takes.
  // `owner` is the name of the token that submitted the job ("" without tokens).
  absl::StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec, const std::string& owner = "");
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  // Deletes a finished job's rows, results and reports. Blocks on the database.
  absl::Status DeleteJob(const std::string& job_id);
  // Newest first, summaries only, `request.limit` at a time (0 = 20, at most 1000) after the job
  // `request.page_token`, narrowed by `request.state` and `request.labels`. With `owner`, only the
  // jobs that token name submitted.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                const std::optional<std::string>& owner = std::nullopt);
  v1::ListWorkersResponse ListWorkers();
  // Folder holding the report files of a finished job.
  absl::StatusOr<std::string> ReportDir(const std::string& job_id);
  // Builds one report over the rows of several finished jobs, in the order given (tally merge),
  // and returns its folder. INVALID_ARGUMENT when their settings differ (metrics, classes, ...);
  // FAILED_PRECONDITION while one has no report yet. Blocks on the database.
  absl::StatusOr<std::string> MergeReports(const std::vector<std::string>& job_ids);
  // A running job's report over the rows committed so far, in a new folder (the caller removes it).
  absl::StatusOr<std::string> PartialReport(const std::string& job_id);
  // Pairs two finished runs of the same manifest (server/report/compare.h) and returns the folder of the
  // comparison files. Blocks on the database.
  absl::StatusOr<std::string> CompareJobs(const std::string& a, const std::string& b);
  // Calls `fn` for every committed result of a job, in index order (a follow's race reads a job's
  // per-row values). Blocks on the database.
  absl::Status ForEachResult(const std::string& job_id, const JobStore::ResultFn& fn);
  // The database, where follows keep their records beside the jobs (server/follow/follow_store.h).
  JobStore* store() const { return store_.get(); }
  // False while the database cannot be written (disk full) or while draining: health reports NOT_SERVING.
  bool Serving();
  // A graceful stop (SIGTERM): no lease is granted from now on and long polls answer at once; results,
  // heartbeats and releases are taken as before, so that workers deliver what they hold.
  void BeginDrain();
  // Shards leased now (of jobs not ended) by workers heard from within two heartbeats, not counting
  // those this tallyd spawned unless `spawned`: a drain is complete at 0 once the spawned workers
  // have exited.
  int64_t LeasesOutstanding(bool spawned = true);
  // Writes the handoff (v1::Handoff) the next tallyd on this state folder restores: the workers in
  // service (not those spawned by this tallyd) and their leases. `clean`: written by a drained stop.
  // Also called every few seconds by the background thread, so that a killed tallyd hands over too.
  absl::Status SaveHandoff(bool clean);
  // The figures /metrics exports.
  CoordinatorMetrics Metrics();

  // Worker API. NOT_FOUND for an unknown worker id: the worker should register again.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& request);
  // The oldest pending shard for the worker, or none now (retry_after_ms); never waits, whatever
  // max_wait_ms says.
  absl::StatusOr<v1::AcquireShardResponse> AcquireShard(const v1::AcquireShardRequest& request);
  // AcquireShard as a long poll (AcquireShardRequest.max_wait_ms > 0): with no shard to grant now,
  // the request waits (up to max_wait_ms, at most kMaxAcquireWaitMs) and `done` runs as soon as a
  // shard is granted to it, or with an empty response (retry_after_ms) when the wait ends, when
  // StopWaiting is called or when the coordinator goes away. `done` runs exactly once, on the
  // calling thread or the coordinator's waiter thread, without the lock held; it must not block.
  // Returns an id for CancelAcquire, or 0 when `done` has already run.
  using AcquireDone = std::function<void(absl::StatusOr<v1::AcquireShardResponse>)>;
  static constexpr int kMaxAcquireWaitMs = 5000;
  int64_t AcquireShardAsync(const v1::AcquireShardRequest& request, AcquireDone done);
  // The caller gave up (its RPC was cancelled): `done` runs now with CANCELLED, unless it has run.
  void CancelAcquire(int64_t id);
  // Ends every wait now (empty responses) and answers later long polls at once: for shutdown.
  void StopWaiting();
  absl::StatusOr<v1::ReportResultsResponse> ReportResults(const v1::ReportResultsRequest& request);
  absl::Status ReportJobError(const v1::ReportJobErrorRequest& request);
  absl::Status ReleaseShard(const v1::ReleaseShardRequest& request);
  // First proposal wins: the job's channels-last choice (kept in its spec and the database), for
  // jobs whose spec leaves it to the workers' trial. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::ResolveLayoutResponse> ResolveLayout(const v1::ResolveLayoutRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Takes shards back from workers silent for longer than the lease, and from workers that made
  // no progress for the job's batch timeout. Called periodically by the background thread.
  void ExpireLeases();
  // Builds the reports of jobs that have reached the end. Called by the background thread.
  void RunFinalizers();
  // Deletes finished jobs older than `retain_days`. Called by the background thread.
  void ApplyRetention();
  // `wake` is called (outside the coordinator's locks, on the thread that wrote it) each time a
  // job's report has been written or has failed: WatchJob streams answer then instead of at their
  // next interval. Returns a handle for RemoveReportListener, after which `wake` is never called.
  int64_t AddReportListener(std::function<void()> wake);
  void RemoveReportListener(int64_t handle);

 private:
  enum class ShardPhase { kPending, kLeased, kDone };
  struct Shard {
    int64_t begin = 0;
    int64_t end = 0;
    ShardPhase phase = ShardPhase::kPending;
    int attempts = 0;
    int64_t lease_id = 0;
    std::string worker_id;
    double lease_unix = 0;   // When the current lease was granted.
    int64_t committed = 0;   // Rows of this shard with a committed result.
    bool split = false;      // Its remaining rows went to single-row shards.
    // Leased by the previous tallyd to a worker that kept its identity across the restart (v1::Handoff):
    // if that worker does not come back, the shard goes back without an attempt counted.
    bool restored = false;
    // A single row that was in a worker's hands when the worker was lost: it is leased only to a
    // worker holding nothing else (so that a second loss names it), and fails at
    // --max-shard-attempts losses.
    bool suspect = false;
    // A speculative copy (--speculate-after): a second lease of the shard to another worker; the
    // first commit of each row wins. Empty worker id: none.
    int64_t spec_lease_id = 0;
    std::string spec_worker_id;
    double spec_lease_unix = 0;
    // Does `worker` hold this shard under `lease_id` (the lease or its speculative copy)?
    bool Holds(const std::string& worker, int64_t lease) const {
      return phase == ShardPhase::kLeased && ((lease == lease_id && worker == worker_id) ||
                                             (!spec_worker_id.empty() && lease == spec_lease_id && worker == spec_worker_id));
    }
    // The lease `worker` holds (id, when granted); {0, 0} when none.
    std::pair<int64_t, double> LeaseOf(const std::string& worker) const {
      if (worker == worker_id) return {lease_id, lease_unix};
      if (!spec_worker_id.empty() && worker == spec_worker_id) return {spec_lease_id, spec_lease_unix};
      return {0, 0};
    }
  };
  struct JobEntry {
    JobRecord record;
    std::vector<Shard> shards;     // The manifest's shards, then single-row shards split off.
    int64_t base_shards = 0;       // Shards [0, base_shards) are the manifest's own.
    std::map<int64_t, int64_t> row_shard;  // Index -> single-row shard holding it.
    std::vector<bool> committed_rows;      // By index: a result is committed.
    std::deque<int64_t> pending;
    int64_t shards_done = 0;
    bool finalize_queued = false;
    double rows_done_at = 0;  // When its last shard was done while canaries were under way.
    std::set<std::string> known_workers;    // Workers with a job_workers row.
    std::set<std::string> excluded_workers; // Workers that reported a model error for this job.
    std::map<std::string, std::set<std::string>> model_errors;  // Message -> reporting workers.
    // Shards are ranges of positions; `order` gives each position's manifest index (--order).
    RowOrder order;
    int64_t planned = 0;        // Positions [0, planned) are evaluated (--sample: a prefix).
    EmptyScore empty_score = EmptyScore::kNaN;  // The spec's, for the live estimates.
    bool stopped_early = false; // --until-ci reached: shards not yet leased were dropped.
    // --until-ci's rule held on the rows so far: no new leases until those in flight are in, then
    // the rule is checked again on every row the report will hold (MaybeStopEarlyLocked).
    bool ci_draining = false;
    // Live estimates (docs/metrics.md "Answers before the end"): per class, Welford's running mean of the
    // committed rows' Dice and IoU and, for random-order jobs, their values by position for the
    // betting interval (metrics/bounded_mean.h), recomputed once the rows have grown by 1%.
    struct LiveMetric {
      int64_t n = 0;
      double mean = 0, m2 = 0;
      IntervalSample sample;
      // The interval, cached: computed under mu_ by readers too (FillLive is const).
      mutable int64_t ci_rows = -1;  // Rows the cached interval was computed from.
      mutable std::pair<double, double> ci{std::numeric_limits<double>::quiet_NaN(),
                                           std::numeric_limits<double>::quiet_NaN()};
    };
    struct LiveClass {
      LiveMetric dice, iou;
      bool in_reference = false;  // Some committed reference holds the class.
    };
    std::vector<LiveClass> live;
    int64_t live_rows = 0;      // Evaluated rows in `live`.
    std::vector<double> shard_seconds;  // Lease to done, of shards finished (speculation's median).
    // --canary: per worker, its copy of the canary rows (index -> the result's fingerprint) and
    // whether it may take the job's shards: "" (running or waiting for others), "agrees", "alone"
    // (no other worker to compare with in time), "tied" (no majority), "disagrees" (out of the job).
    struct Canary {
      int64_t lease_id = 0;
      double completed = 0;
      std::map<int64_t, std::string> rows;
      std::string verdict;
      // May its worker take the job's shards?
      bool LetsIn() const { return verdict == "agrees" || verdict == "alone" || verdict == "tied"; }
    };
    std::map<std::string, Canary> canaries;
    // The report kept as rows arrive (server/report/live_report.h); null for jobs that keep the batch path
    // and once the report is written. `live_report_off`: it cannot be complete (rows were committed
    // before it could be made): the batch path builds this job's report.
    std::shared_ptr<LiveReport> live_report;
    bool live_report_off = false;
  };
  struct WorkerEntry {
    v1::RegisterWorkerRequest info;
    double registered = 0;
    double last_seen = 0;
    double last_progress = 0;  // Last committed result (or the first lease after a quiet time).
    std::set<std::pair<std::string, int64_t>> leases;  // (job_id, shard_id)
    v1::WorkerGauges gauges;   // From its latest heartbeat.
    // Handed over by the previous tallyd (v1::Handoff) and not heard from since: silent for a lease
    // period, it is dropped and its shards go back without an attempt counted.
    bool restored = false;
    // Scheduling: the job the worker last leased from and since when.
    std::string current_job;
    double current_since = 0;
  };
  // Counters behind CoordinatorMetrics (since this process started).
  struct Counters {
    int64_t images_evaluated = 0;
    int64_t images_failed = 0;
    int64_t shards_leased = 0;
    int64_t shards_expired = 0;
    int64_t shards_retried = 0;
    int64_t shards_speculated = 0;
    std::vector<uint64_t> commit_buckets;  // Per bound of kCommitBounds, not cumulative; one more for +Inf.
    uint64_t commit_count = 0;
    double commit_seconds_sum = 0;
  };
  // Work to do after the lock is released.
  struct Deferred {
    std::vector<JobRecord> job_updates;
    std::vector<std::tuple<std::string, int64_t, int>> shard_done;  // job, shard, attempts
    std::vector<std::pair<std::string, int64_t>> poisoned;           // single rows out of attempts
    std::vector<std::pair<std::string, v1::JobSpec>> spec_updates;   // job, its spec to store
  };

  // A shard just leased to a worker, and what to do about it after the lock is released.
  struct Grant {
    std::string job_id;
    int64_t shard_id = -1;
    Shard shard;
    v1::JobSpec spec;
    std::optional<WorkerRecord> new_worker;  // The worker's first lease of this job.
    int64_t expected_rows = 0;               // ShardAssignment.expected_rows.
    RowOrder order;                          // The job's: the shard's positions -> indices.
    std::string worker_id;                   // Who it went to, and whether as a speculative copy
    bool speculative = false;                // or the worker's canary (shard_id kCanaryShard).
    bool canary = false;
  };
  static constexpr int64_t kCanaryShard = -1;  // ShardAssignment.shard_id of a canary lease.
  // How a ReportResults request was received: what to commit and what to answer.
  struct Admission {
    bool lease_valid = false;
    bool canary = false;        // A canary's results: compared, not committed (coordinator_canary.cc).
    bool abandon = false;       // The job ended (or the workers disagree): nothing to commit.
    absl::Status rejected;      // The results cannot be right: the lease was released.
    std::optional<WorkerRecord> worker_record;
    int keep_thumbnails = 0;    // The job's thumbnails per class, and the Dice convention that orders them.
    EmptyScore empty_score = EmptyScore::kNaN;
    bool instance_job = false;  // COCO instances: class 0's thumbnails are ranked by instance F1.
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store);
  // The oldest pending shard this worker may take, leased to it; nothing when there is none.
  std::optional<Grant> GrantShardLocked(const std::string& worker_id, WorkerEntry* worker, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the first queued shard `worker` may lease out of the job's queue (dropping any done
  // meanwhile); -1 when there is none.
  int64_t TakePendingLocked(JobEntry* job, const WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ShardAssignment.expected_rows: the job's rows without a result (whatever the number of workers).
  int64_t ExpectedRowsLocked(const JobEntry& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the granted shard's rows into an assignment; releases the lease if they cannot be read.
  absl::StatusOr<v1::AcquireShardResponse> BuildAssignment(const Grant& grant) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Admission> AdmitReportLocked(const v1::ReportResultsRequest& request, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's class count after this report (set by the first results); -1 when the report
  // contradicts it and the job failed.
  int32_t ReconcileClassesLocked(JobEntry* job, const v1::ReportResultsRequest& request, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Resume();
  // The previous tallyd's workers and leases (v1::Handoff), after Resume has rebuilt the jobs.
  absl::Status RestoreHandoff();
  void RestoreWorkerLocked(const v1::Handoff::Worker& saved, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Scheduling (coordinator_schedule.cc): the jobs `worker_id` may lease from, best first: owners by
  // weighted fair share of the workers, an owner's jobs by priority, then share, then age.
  std::vector<std::string> LeaseOrderLocked(const std::string& worker_id, const WorkerEntry& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same, given `on` = WorkersOnJobsLocked(worker_id) already computed.
  std::vector<std::string> LeaseOrderLocked(const std::string& worker_id, const WorkerEntry& worker,
                                            const std::map<std::string, int>& on) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers on each job now: leasing from it or holding its leases (by job id).
  std::map<std::string, int> WorkersOnJobsLocked(const std::string& except = "") const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs with rows left to lease (not ended, pending shards): the candidates of fair share.
  bool WantsWorkersLocked(const JobEntry& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the scheduling fields of a job's snapshot (Job.workers_assigned ... waiting).
  void FillScheduleLocked(const JobEntry& job, v1::Job* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double OwnerWeight(const std::string& owner) const;
  // A job's order, planned rows and shards from its record (submission and restart).
  void PlanJob(JobEntry* entry) const;
  // Live estimates: one evaluated row in; the job's estimates out (Snapshot).
  static void AddLive(JobEntry* job, const v1::ImageResult& result);
  // A live metric's interval (random-order jobs; NaN for others), recomputed once its rows have
  // grown by 1% (at least one row) since the last, and exactly once the job has ended: a betting
  // interval costs a pass over the rows per bisection step. The cache lives in the metric
  // (mutable): callers hold mu_.
  static std::pair<double, double> LiveCi(const JobEntry& job, const JobEntry::LiveMetric& m);
  // The widest foreground Dice half-width (NaN: some class has too few rows; nullopt: no foreground
  // class yet); `exact`: every interval computed from all the rows, not the cached one.
  static std::optional<double> WidestForegroundHalfWidth(const JobEntry& job, bool exact);
  static int64_t RowsInFlight(const JobEntry& job);
  void FillLive(const JobEntry& job, v1::Job* out) const;
  // --until-ci: once every foreground class's interval is narrow enough, no more shards are leased;
  // when the leased ones are in and the rule still holds on all the rows, the shards not yet leased
  // are dropped and the job ends (else leasing goes on).
  void MaybeStopEarlyLocked(JobEntry* job, Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // --until-ci jobs: rows leased but not yet in stay under a quarter of those in (at least two shards
  // per registered worker), so that the rule can end the job before every row is leased (a small
  // job would otherwise be leased whole at once and never stop). Other jobs: always.
  bool MayLeaseMoreLocked(const JobEntry& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a shard of a job stopped early (done, its rows not evaluated).
  void DropShardLocked(JobEntry* job, int64_t shard_id, Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard leaves its workers' lease sets: the lease's and its speculative copy's.
  void ForgetShardLeasesLocked(const std::string& job_id, int64_t shard_id, const Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No straggling tail (--speculate-after): with nothing pending, a shard leased for longer than
  // the job's threshold goes to `worker_id` as well. The shard granted, or -1.
  int64_t SpeculateLocked(JobEntry* job, const std::string& worker_id, WorkerEntry* worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double SpeculateAfter(const JobEntry& job) const;
  // --canary: may `worker_id` take this job's shards? Grants its canary lease into `grant` when it
  // is due one (returns false then too).
  bool CanaryLetsInLocked(JobEntry* job, const std::string& worker_id, Grant* grant, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A canary report: checked, fingerprinted, and once complete put to the vote. Never committed.
  absl::Status AdmitCanaryLocked(JobEntry* job, const v1::ReportResultsRequest& request, int32_t classes,
                                 Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void VoteCanariesLocked(JobEntry* job, Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every row is in but a worker's canary is still under way (a slower start, a Python model
  // loading): the job waits for its vote, which may name that worker, for up to the canary's wait
  // (10 s) from its last row. ExpireLeases looks again; a canary's end completes the job at once.
  bool CanariesUnderWayLocked(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a warning to the job's reports (JobSpec.run_warnings), once.
  void WarnJobLocked(JobEntry* job, const std::string& warning, Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Now() const { return options_.clock(); }
  // `folder_text`: a manifest built from two folders (StoreFolders), kept at spec.manifest();
  // `failed_rows`: rows of those folders that fail as they are (PairedFolders::failed), after it.
  absl::StatusOr<JobRecord> StoreManifest(const v1::JobSpec& spec, const std::string& job_id,
                                          const std::string* folder_text = nullptr,
                                          std::vector<ManifestRow>* failed_rows = nullptr);
  // Tar shards (coordinator_sources.cc): the samples indexed from the tars' headers into rows.
  // The base shard (of the job's own, [0, base_shards)) holding `position`, or -1.
  static int64_t BaseShardAt(const JobEntry& job, int64_t position);
  absl::StatusOr<JobRecord> StoreShards(const v1::JobSpec& spec, const std::string& job_id);
  // Two folders (--images/--masks): paired into a manifest kept in the state folder, then stored as
  // one; files without a partner become the job's warnings.
  absl::StatusOr<JobRecord> StoreFolders(const v1::JobSpec& spec, const std::string& job_id);
  std::string FolderManifestPath(const std::string& job_id) const;
  // The limits a submission reads its client-named files with: the size cap and a deadline from now.
  ClientFileLimits SubmissionLimits() const;
  // StoreManifest's rows into the store in batches, noting ids (duplicates) and whether the first
  // image is a volume; DEADLINE_EXCEEDED once `deadline` has passed.
  absl::Status StreamManifestRows(RowSource* reader, const std::string& job_id, bool blocks,
                                  DuplicateIds* duplicates, std::optional<bool>* volumes, absl::Time deadline, const char* what = "manifest");
  // COCO instance jobs (no manifest): one row per image of the annotation file (coordinator_coco.cc).
  absl::StatusOr<JobRecord> StoreCocoImages(const v1::JobSpec& spec, const std::string& job_id);
  // Panoptic jobs: one row per reference annotation, its prediction found by image id.
  absl::StatusOr<JobRecord> StorePanopticImages(const v1::JobSpec& spec, const std::string& job_id);
  // Stores the rows of a submission made in memory (COCO jobs), in batches; on an error they are
  // discarded again.
  absl::Status StoreRows(const std::string& job_id, RowSource* rows);
  // Deletes what a refused submission stored so far (logging a failure to) and returns `why`.
  absl::Status DiscardSubmission(const std::string& job_id, absl::Status why);
  // A submission's record once its rows are stored: queued, `rows` rows, the model's hash, and the
  // shard size (jobs without a model: smaller shards, see StoreManifest).
  JobRecord QueuedRecord(const v1::JobSpec& spec, const std::string& job_id, int64_t rows) const;
  // Ids are the join key of a merged report: refuses parts whose manifests repeat ids, or that
  // share an id (two runs of one manifest are compared, not merged).
  absl::Status CheckIdsJoin(const std::vector<JobRecord>& parts);
  // After a submission's rows are stored: how many rows repeat an earlier row's id, and the
  // warning naming the first such ids (read back from the stored rows).
  absl::StatusOr<int64_t> NameDuplicates(const std::string& job_id, DuplicateIds* duplicates, std::string* message);
  v1::Job Snapshot(const JobEntry& job, double now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a job (FAILED or CANCELLED) and revokes its leases.
  void EndJobLocked(JobEntry* job, v1::JobState state, const std::string& error, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a lease that did not end in a commit. `count_attempt`: the release says something about
  // the rows (lost worker, rejected results); false when the worker, not the rows, is at fault.
  // `who`: the worker letting go (its speculative copy only ends that copy; the lease itself, with a
  // copy out, passes to the copy's worker). Null: the shard's lease.
  // Ends a shard's lease. `count_attempt`: the loss counts towards --max-shard-attempts. `with_worker`:
  // the shard was lost with its worker (silent, or no progress for the batch timeout), which a row
  // may have caused: its uncommitted rows become suspect single-row shards (Shard::suspect). Other
  // counted losses (results rejected, rows missing) queue it again whole, and split it into plain
  // single rows once it was lost --max-shard-attempts times.
  void ReleaseShardLocked(JobEntry* job, int64_t shard_id, const std::string& why, bool count_attempt,
                          Deferred* deferred, const std::string* who = nullptr, bool with_worker = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorkerLeasesLocked(WorkerEntry* worker, const std::string& worker_id, const std::string& only_job,
                                 const std::string& why, bool count_attempt, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-queues the uncommitted rows of a shard as single-row shards; returns how many (each counts as
  // a shard queued again in the metrics, so that leases = shards committed + shards queued again).
  int64_t SplitShardLocked(JobEntry* job, int64_t shard_id, bool suspect = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker` holds a suspect row (Shard::suspect).
  bool HoldsSuspectLocked(const WorkerEntry& worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteLocked(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard whose rows are all committed becomes done (once): out of its workers' lease sets and
  // of the queue, its state saved (deferred), and the job completed if it was the last.
  void MarkShardDoneLocked(JobEntry* job, int64_t shard_id, const std::string& worker_id, double now,
                           Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t OwnerShard(const JobEntry& job, int64_t index) const;
  // A copy of the record of a job whose report is built; NOT_FOUND or FAILED_PRECONDITION otherwise.
  absl::StatusOr<JobRecord> FinishedRecordLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates a report against the job; an error names what is wrong.
  absl::Status CheckResults(const JobEntry& job, const Shard& shard, const v1::ReportResultsRequest& request,
                            int32_t classes) const;
  // Commits results and does the accounting; shared by workers' reports and poisoned rows.
  absl::StatusOr<bool> CommitAndAccount(const std::string& job_id, int64_t shard_id, const std::string& worker_id,
                                        const std::vector<v1::ImageResult>& results, bool shard_complete,
                                        const std::vector<StoredThumbnail>& thumbnails = {}, int keep_thumbnails = 0);
  void FailPoisonedRow(const std::string& job_id, int64_t shard_id);
  // Calibration jobs: a model batch's fine histogram counts once, with its rows. Keeps in `results` the
  // rows whose batch's histogram is in this report whole (every row it covers here, new and evaluated)
  // or that are already committed, strips the histograms that cannot count, and returns the new
  // evaluated rows it took out: evaluated again, each alone (SplitRefusedLocked). Under
  // calibration_mu_, held until their commit is accounted.
  std::vector<int64_t> ScreenCalibration(const std::string& job_id, std::vector<v1::ImageResult>* results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(calibration_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void SplitRefused(const std::string& job_id, const std::vector<int64_t>& refused) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's LiveReport, made at its first commit where the job is eligible (null otherwise).
  // `replay`: made now for a job whose committed rows the caller feeds it from the database (Resume).
  std::shared_ptr<LiveReport> LiveReportLocked(JobEntry* job, bool replay = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SpoolPath(const std::string& job_id) const { return options_.state_dir + "/spool/" + job_id; }
  // A model error from one worker: takes the worker off the job, or fails the job (see above).
  void RecordModelErrorLocked(JobEntry* job, const v1::ReportJobErrorRequest& request, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job_id`: the job whose rows met the problem ("" if none); a client sees the reason only for its own.
  // A worker whose copy of the model differs from the job's: off the job, with a warning; the job
  // fails only when no worker in service is left for it.
  void RecordModelMismatchLocked(JobEntry* job, const v1::ReportJobErrorRequest& request, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireWorkerLocked(const std::string& worker_id, const std::string& reason, const std::string& job_id,
                          Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteStorage(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts one commit of `seconds` in the latency histogram.
  void NoteCommitLocked(double seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Apply(Deferred& deferred);
  void BackgroundLoop();
  std::string ReportPath(const std::string& job_id) const;
  // `digits` random hexadecimal digits, for job, worker and folder names.
  static std::string RandomHex(int digits);
  double BatchTimeout(const JobEntry& job) const;

  const CoordinatorOptions options_;
  const std::unique_ptr<JobStore> store_;

  mutable absl::Mutex mu_;
  absl::Mutex calibration_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // Calibration rows' screen and commit, one at a time.
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);  // Submission order.
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WorkerInfo> retired_ ABSL_GUARDED_BY(mu_);  // Out of service, newest last.
  int64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_worker_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::string> finalize_queue_ ABSL_GUARDED_BY(mu_);
  bool StoppingOrFinalizing() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !finalize_queue_.empty(); }
  absl::Mutex listeners_mu_;  // Never held with mu_.
  std::map<int64_t, std::function<void()>> report_listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int64_t next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 1;
  std::string storage_error_ ABSL_GUARDED_BY(mu_);  // Why the database cannot be written now.
  double last_retention_ ABSL_GUARDED_BY(mu_) = 0;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  double last_handoff_save_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread background_;

  // Long polls (AcquireShardAsync) waiting for a shard to grant.
  struct AcquireWaiter {
    std::string worker_id;
    absl::Time deadline;
    AcquireDone done;
  };
  // Serves the waiters whenever a shard may have become grantable, a wait ends or a waiter comes.
  void WaiterLoop();
  bool WaiterWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Something a waiter may now be granted (a job's shards queued, a shard back in its queue).
  void NoteWorkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++work_epoch_; }
  // After a grant: records the worker on the job and builds the assignment (database reads).
  absl::StatusOr<v1::AcquireShardResponse> FinishGrant(const std::string& worker_id, const Grant& grant)
      ABSL_LOCKS_EXCLUDED(mu_);
  // No shard: when to ask again (at once after a long poll's full wait, else soon).
  static v1::AcquireShardResponse NothingNow(bool waited);
  std::map<int64_t, AcquireWaiter> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t work_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiter_seen_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool no_waiting_ ABSL_GUARDED_BY(mu_) = false;  // StopWaiting was called.
  std::thread waiter_thread_;
};

// Whether a job's rows must keep their manifest columns for its groups (--group-by COLUMN) or
// slices (--find-slices); and that each column it groups by is one the source kept.
bool WantsColumns(const v1::JobSpec& spec);
absl::Status CheckGroupColumns(const v1::JobSpec& spec);

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_COORDINATOR_H_
