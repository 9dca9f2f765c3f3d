// Follows (tally follow DIR): tallyd's loop that watches each follow's checkpoint folder, takes each
// complete checkpoint (server/follow/checkpoint_watch.h), evaluates it as an ordinary job, races it
// against the best checkpoint so far (metrics/paired_race.h) and stops it once it is decided worse,
// and keeps the follow's record (server/follow/follow_store.h) and curve
// (server/follow/follow_curve.h) up to date. Everything a follow decided is in its record, saved at
// every change, so a restarted tallyd goes on where it was: a checkpoint taken is never taken again,
// and one that landed meanwhile is taken then.
//
// One job at a time a follow: when evaluations fall behind the trainer, the newest checkpoint taken
// goes next, and with --catch-up newest (the default) the older ones waiting are skipped (listed),
// with all they run afterwards, newest first. A job that fails as a whole (its model did not load:
// a checkpoint incomplete or not a model) sends its checkpoint back to settle, up to --load-retries
// times, then the checkpoint is failed with the job's reason.
//
// The race: each checkpoint's job evaluates its rows in a seeded random order; the rows done in
// that order (a prefix of it: the order fixed before any value is seen) are paired with the best
// checkpoint's values on the same rows, and the job is cancelled as soon as the paired interval lies
// below -margin. A checkpoint not decided worse runs to its end and becomes the best when its mean
// beats the best's.
//
// --on-new-best 'CMD' runs CMD (/bin/sh -c, on tallyd's host, at most 10 minutes) when a checkpoint
// becomes the best, with TALLY_FOLLOW, TALLY_STEP, TALLY_CHECKPOINT (its path in the trainer's
// folder), TALLY_TAKEN (the taken link), TALLY_JOB, TALLY_METRIC, TALLY_METRIC_VALUE, TALLY_METRIC_LO
// and TALLY_METRIC_HI in its environment; its exit status and output's tail are recorded.
//
// Driven by Tick (tallyd's follow thread, or a test's clock); thread-safe.
#ifndef TALLY_SERVER_FOLLOW_FOLLOW_MANAGER_H_
#define TALLY_SERVER_FOLLOW_FOLLOW_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "metrics/paired_race.h"
#include "proto/tally.pb.h"
#include "server/follow/checkpoint_watch.h"
#include "server/store/job_store.h"

namespace tally {

// A follow's job as the manager sees it.
struct FollowJobView {
  enum class State { kRunning, kSucceeded, kFailed, kCancelled };
  State state = State::kRunning;
  std::string error;  // kFailed: why.
  int64_t rows_total = 0;
  int64_t rows_evaluated = 0;
  // The follow's metric over the rows evaluated: its mean (what "best" compares) and the job's
  // other means, each with its 95 % interval.
  double mean = 0;
  std::vector<v1::FollowMetric> metrics;
};

// What the manager needs of the coordinator (and a test of a fake).
class FollowJobs {
 public:
  virtual ~FollowJobs() = default;
  // Submits `spec` (its model a taken checkpoint) for `owner` (the follow's): the job's id.
  virtual absl::StatusOr<std::string> Submit(const v1::JobSpec& spec, const std::string& owner) = 0;
  // NOT_FOUND when the job is gone (deleted).
  virtual absl::StatusOr<FollowJobView> View(const std::string& job_id, const std::string& metric) = 0;
  // The metric's value of each row (by manifest index; NaN where the row has none) of a finished job.
  virtual absl::StatusOr<std::vector<double>> RowValues(const std::string& job_id, const std::string& metric) = 0;
  // The metric's values of the rows at order positions first, first + 1, ... of a random-order job,
  // as (manifest index, value), up to the first position without a result yet.
  virtual absl::StatusOr<std::vector<std::pair<int64_t, double>>> OrderedValues(const std::string& job_id,
                                                                             const std::string& metric,
                                                                             int64_t first) = 0;
  virtual absl::Status Cancel(const std::string& job_id, const std::string& reason) = 0;
};

// A following follow's figures for /metrics (docs/operations.md "Metrics endpoint").
struct FollowGauges {
  std::string follow_id;
  int64_t last_step = -1;        // The largest step evaluated (best, not better or worse); -1: none.
  int64_t best_step = -1;
  int64_t lag_checkpoints = 0;   // Checkpoints the trainer wrote that are not decided yet.
  double lag_seconds = 0;        // Since the oldest of them landed (0: none).
};

class FollowManager {
 public:
  // `state_root`: where follows keep their links and report folders (STATE/follows/<id>/).
  FollowManager(JobStore* store, FollowJobs* jobs, std::string state_root);
  ~FollowManager();

  // The follows of the database, each following one watched again.
  absl::Status Load();
  // A new follow. INVALID_ARGUMENT when its spec cannot work (no folder, a bad --step-regex).
  absl::StatusOr<v1::Follow> Create(v1::FollowSpec spec, const std::string& owner, double now);
  absl::StatusOr<v1::Follow> Get(const std::string& follow_id) const;
  std::vector<v1::Follow> List() const;
  // Stops a follow (its job too).
  absl::StatusOr<v1::Follow> Cancel(const std::string& follow_id);
  // Deletes an ended follow's record and state folder (its links, curve and hook logs); its jobs
  // stay, ordinary jobs. FAILED_PRECONDITION while it follows.
  absl::Status Delete(const std::string& follow_id);
  // The follow's report folder (curve.csv, curve.json, curve.html).
  std::string ReportFolder(const std::string& follow_id) const;

  // One round over every following follow at `now` (unix seconds).
  void Tick(double now);
  // Every following follow's figures at `now`.
  std::vector<FollowGauges> Gauges(double now) const;

 private:
  struct Live;  // A following follow's watcher and race.
  void TickFollow(Live* live, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TakeReady(Live* live, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StartNext(Live* live, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CheckRunning(Live* live, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Race(Live* live, v1::FollowCheckpoint* c, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Decide(Live* live, v1::FollowCheckpoint* c, const FollowJobView& view, double now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Finished(Live* live, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Save(Live* live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // --on-new-best: the follow's command for checkpoint `c`, on a thread of its own; its exit status
  // and output's tail land in the checkpoint's `hook`.
  void StartHook(Live* live, v1::FollowCheckpoint* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HookDone(const std::string& follow_id, const std::string& name, const std::string& outcome)
      ABSL_LOCKS_EXCLUDED(mu_);

  JobStore* const store_;
  FollowJobs* const jobs_;
  const std::string state_root_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Live>> follows_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::thread> hooks_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};  // Hooks still running are stopped.
};

}  // namespace tally

#endif  // TALLY_SERVER_FOLLOW_FOLLOW_MANAGER_H_
