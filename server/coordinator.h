// The coordinator's core: jobs, the shard ledger, worker leases and report building. Plain C++
// with no gRPC dependency; coordinator_service.cc adapts it to the wire.
//
// Scheduling: a job's manifest is cut into shards [begin, end). Workers pull shards one at a time
// (AcquireShard), oldest job first. A worker's leases live as long as it heartbeats; when it stops
// (process killed, host gone) its shards go back to the front of the queue. A shard is done when
// every one of its rows has a committed result (evaluated or failed), whoever sent it: results
// are keyed by manifest index, so a re-run can never count a row twice. A shard abandoned by
// `max_shard_attempts` workers fails its remaining rows with a reason instead of looping forever.
//
// Thread-safe. Methods never hold the internal lock across database I/O.
#ifndef TALLY_SERVER_COORDINATOR_H_
#define TALLY_SERVER_COORDINATOR_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/tally.pb.h"
#include "server/job_store.h"

namespace tally {

struct CoordinatorOptions {
  std::string state_dir;            // Holds tally.db and reports/<job_id>/.
  double lease_seconds = 10.0;      // A worker silent for this long loses its shards.
  double heartbeat_seconds = 1.0;   // Told to workers at registration.
  int max_shard_attempts = 3;
  // Unix time in seconds; tests inject a fake clock. Default: the wall clock.
  std::function<double()> clock;
  // Run lease expiry and report building on a background thread. Tests may drive them by hand
  // with ExpireLeases() and RunFinalizers().
  bool background_thread = true;
};

class Coordinator {
 public:
  // Opens or creates the state directory and database; resumes unfinished jobs found there.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();

  // Client API. Errors: INVALID_ARGUMENT for a bad spec or manifest, NOT_FOUND for a missing
  // model/manifest/job, FAILED_PRECONDITION for "not until the job has finished".
  absl::StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  std::vector<v1::Job> ListJobs(int limit);
  // Folder holding the report files of a finished job.
  absl::StatusOr<std::string> ReportDir(const std::string& job_id);

  // Worker API. NOT_FOUND for an unknown worker id: the worker should register again.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& request);
  absl::StatusOr<v1::AcquireShardResponse> AcquireShard(const v1::AcquireShardRequest& request);
  absl::StatusOr<v1::ReportResultsResponse> ReportResults(const v1::ReportResultsRequest& request);
  absl::Status ReportJobError(const v1::ReportJobErrorRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Takes shards back from workers silent for longer than the lease. Called periodically by the
  // background thread.
  void ExpireLeases();
  // Builds the reports of jobs that have reached the end. Called by the background thread.
  void RunFinalizers();

 private:
  enum class ShardPhase { kPending, kLeased, kDone };
  struct Shard {
    int64_t begin = 0;
    int64_t end = 0;
    ShardPhase phase = ShardPhase::kPending;
    int attempts = 0;
    int64_t lease_id = 0;
    std::string worker_id;
    int64_t committed = 0;  // Rows of this shard with a committed result.
  };
  struct JobEntry {
    JobRecord record;
    std::vector<Shard> shards;
    std::deque<int64_t> pending;
    int64_t shards_done = 0;
    bool finalize_queued = false;
    std::set<std::string> known_workers;  // Workers with a job_workers row.
  };
  struct WorkerEntry {
    v1::RegisterWorkerRequest info;
    double last_seen = 0;
    std::set<std::pair<std::string, int64_t>> leases;  // (job_id, shard_id)
  };
  // Work to do after the lock is released.
  struct Deferred {
    std::vector<JobRecord> job_updates;
    std::vector<std::tuple<std::string, int64_t, int>> shard_done;  // job, shard, attempts
    std::vector<std::pair<std::string, int64_t>> poisoned;           // shards out of attempts
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store);
  absl::Status Resume();
  double Now() const { return options_.clock(); }
  v1::Job Snapshot(const JobEntry& job, double now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a job (FAILED or CANCELLED) and revokes its leases.
  void EndJobLocked(JobEntry* job, v1::JobState state, const std::string& error, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseShardLocked(JobEntry* job, int64_t shard_id, const std::string& why, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteLocked(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits results and does the accounting; shared by workers' reports and poisoned shards.
  absl::StatusOr<bool> CommitAndAccount(const std::string& job_id, int64_t shard_id, const std::string& worker_id,
                                        const std::vector<v1::ImageResult>& results, bool shard_complete);
  void FailPoisonedShard(const std::string& job_id, int64_t shard_id);
  void Apply(Deferred& deferred);
  void BackgroundLoop();
  std::string ReportPath(const std::string& job_id) const;

  const CoordinatorOptions options_;
  const std::unique_ptr<JobStore> store_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);  // Submission order.
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_worker_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::string> finalize_queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread background_;
};

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_H_
