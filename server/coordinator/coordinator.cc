// Coordinator: construction and resumption from the database, the background loop (expiry,
// finalisers, retention), storage health and the figures behind /metrics. The other
// responsibilities live beside it: coordinator_jobs.cc (job lifecycle), coordinator_leases.cc
// (shard ledger and leases), coordinator_workers.cc (worker registry), coordinator_results.cc
// (result admission). One object and one lock: the invariants span jobs, shards and workers.
#include "server/coordinator/coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "common/job/job_config.h"
#include "common/formats/decode.h"
#include "base/file_util.h"
#include "base/log.h"
#include "common/sources/manifest.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/security/sha256.h"
#include "common/formats/thumbnail.h"
#include "server/store/sharding.h"
#include "base/status_macros.h"
#include "common/job/job_spec_validation.h"
#include "server/report/compare.h"
#include "server/report/report_writer.h"

namespace tally {
namespace {

// The part of a database error worth showing a user ("database or disk is full").
std::string StorageProblem(const absl::Status& s) {
  const absl::string_view m = s.message();
  const size_t colon = m.rfind(": ");
  return std::string(colon == absl::string_view::npos ? m : m.substr(colon + 2));
}

bool IsStorageFailure(const absl::Status& s) { return absl::IsResourceExhausted(s) || absl::IsUnavailable(s); }

}  // namespace

std::string Coordinator::RandomHex(int digits) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string out;
  for (int i = 0; i < digits; ++i) out.push_back("0123456789abcdef"[rng() % 16]);
  return out;
}

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  if (!options.clock) options.clock = NowUnix;
  if (options.state_dir.empty()) return absl::InvalidArgumentError("coordinator: state_dir is required");
  RETURN_IF_ERROR(MakeDirs(options.state_dir + "/reports"));
  ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store, JobStore::Open(options.state_dir + "/tally.db"));
  const bool background = options.background_thread;
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), std::move(store)));
  RETURN_IF_ERROR(c->Resume());
  RETURN_IF_ERROR(c->RestoreHandoff());
  if (background) c->background_ = std::thread([p = c.get()] { p->BackgroundLoop(); });
  c->waiter_thread_ = std::thread([p = c.get()] { p->WaiterLoop(); });
  return c;
}

Coordinator::~Coordinator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (background_.joinable()) background_.join();
  if (waiter_thread_.joinable()) waiter_thread_.join();  // Answers every waiter left.
}

std::string Coordinator::ReportPath(const std::string& job_id) const {
  return options_.state_dir + "/reports/" + job_id;
}

double Coordinator::BatchTimeout(const JobEntry& job) const {
  const double t = job.record.job.spec().batch_timeout_seconds();
  return t > 0 ? t : kDefaultBatchTimeoutSeconds;
}

absl::Status Coordinator::Resume() {
  ASSIGN_OR_RETURN(std::vector<JobRecord> records, store_->LoadJobs());
  // Spools of the last run are rebuilt from the database below (live_report.h).
  RETURN_IF_ERROR(RemoveTree(options_.state_dir + "/spool"));
  for (JobRecord& rec : records) {
    auto entry = std::make_unique<JobEntry>();
    const std::string id = rec.job.job_id();
    if (IsTerminal(rec.job.state())) {
      struct stat st;
      rec.job.set_report_ready(stat((ReportPath(id) + "/report.json").c_str(), &st) == 0);
    } else {
      const int64_t n = rec.job.images_total();
      entry->record = rec;
      PlanJob(entry.get());
      const std::vector<ShardRange> ranges = JobShards(rec.job.spec(), entry->planned, rec.shard_size);
      const int64_t num_shards = static_cast<int64_t>(ranges.size());
      ASSIGN_OR_RETURN(std::vector<ShardState> states, store_->ReadShardStates(id, num_shards));
      ASSIGN_OR_RETURN(std::vector<int64_t> done_rows, store_->ReadResultIndices(id));
      for (const ShardRange& r : ranges) {
        Shard s;
        s.begin = r.begin;
        s.end = r.end;
        entry->shards.push_back(s);
      }
      entry->base_shards = num_shards;
      entry->committed_rows.assign(n, false);
      for (int64_t idx : done_rows) {
        if (idx >= 0 && idx < n) entry->committed_rows[idx] = true;
        const int64_t shard = BaseShardAt(*entry, entry->order.PositionOf(idx));
        if (shard >= 0) entry->shards[shard].committed++;
      }
      for (int64_t i = 0; i < num_shards; ++i) {
        Shard& s = entry->shards[i];
        if (states[i] == ShardState::kDone || s.committed >= s.end - s.begin) {
          s.phase = ShardPhase::kDone;
          entry->shards_done++;
        } else {
          entry->pending.push_back(i);
        }
      }
      // The live estimates and the report kept as rows arrive, again from the committed results.
      std::shared_ptr<LiveReport> live;
      {
        absl::MutexLock lock(&mu_);
        live = LiveReportLocked(entry.get(), /*replay=*/true);
      }
      RETURN_IF_ERROR(store_->ForEachResult(id, [&](const v1::ImageResult& r, const RowNames& names) {
        AddLive(entry.get(), r);
        if (live != nullptr) live->AddOne(r, names);
        return absl::OkStatus();
      }));
      Log("resuming job ", id, ": ", entry->shards_done, "/", num_shards, " shards already done");
    }
    entry->record = std::move(rec);
    absl::MutexLock lock(&mu_);
    job_order_.push_back(id);
    JobEntry* raw = entry.get();
    jobs_[id] = std::move(entry);
    MaybeCompleteLocked(raw);
  }
  return absl::OkStatus();
}

bool Coordinator::Serving() {
  absl::MutexLock lock(&mu_);
  return storage_error_.empty() && !draining_;
}

namespace {
// How often the workers and their leases are saved for the next tallyd while serving.
constexpr double kHandoffSaveSeconds = 2.0;
// Upper bounds of the commit-latency histogram, in seconds (a commit is one SQLite transaction:
// about a millisecond on a local SSD, tens of milliseconds on network storage).
constexpr double kCommitBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}  // namespace

void Coordinator::NoteCommitLocked(double seconds) {
  constexpr size_t kBounds = std::size(kCommitBounds);
  if (counters_.commit_buckets.empty()) counters_.commit_buckets.assign(kBounds + 1, 0);
  size_t b = 0;
  while (b < kBounds && seconds > kCommitBounds[b]) ++b;
  counters_.commit_buckets[b]++;
  counters_.commit_count++;
  counters_.commit_seconds_sum += seconds;
}

CoordinatorMetrics Coordinator::Metrics() {
  CoordinatorMetrics m;
  for (v1::JobState state : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    m.jobs_by_state[JobStateName(state)] = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      const v1::Job& j = job->record.job;
      m.jobs_by_state[JobStateName(j.state())]++;
      if (!IsTerminal(j.state())) {
        m.images_remaining += std::max<int64_t>(0, job->planned - j.images_evaluated() - j.images_failed());
        v1::Job estimates;  // Only its live estimates: no copy of the job.
        FillLive(*job, &estimates);
        if (estimates.live_size() > 0) m.live.emplace_back(id, std::vector<v1::LiveEstimate>(estimates.live().begin(), estimates.live().end()));
      }
    }
    m.images_evaluated = counters_.images_evaluated;
    m.images_failed = counters_.images_failed;
    m.shards_leased = counters_.shards_leased;
    m.shards_expired = counters_.shards_expired;
    m.shards_retried = counters_.shards_retried;
    m.shards_speculated = counters_.shards_speculated;
    m.workers_registered = static_cast<int64_t>(workers_.size());
    m.workers_out_of_service = static_cast<int64_t>(retired_.size());
    for (const auto& [id, w] : workers_) {
      const bool busy = !w.leases.empty();
      m.workers_busy += busy ? 1 : 0;
      m.workers.push_back(CoordinatorMetrics::Worker{id, w.info.name(), w.info.device(), busy, w.gauges});
    }
    uint64_t cumulative = 0;
    for (size_t b = 0; b < std::size(kCommitBounds); ++b) {
      if (b < counters_.commit_buckets.size()) cumulative += counters_.commit_buckets[b];
      m.commit_bounds.push_back(kCommitBounds[b]);
      m.commit_counts.push_back(cumulative);
    }
    m.commit_count = counters_.commit_count;
    m.commit_seconds_sum = counters_.commit_seconds_sum;
  }
  for (const char* suffix : {"", "-wal"}) {
    struct stat st;
    if (stat((options_.state_dir + "/tally.db" + suffix).c_str(), &st) == 0) m.database_bytes += st.st_size;
  }
  return m;
}

void Coordinator::NoteStorage(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    if (!storage_error_.empty()) Log("the database accepts writes again; jobs resume");
    storage_error_.clear();
  } else if (IsStorageFailure(status)) {
    const std::string problem = absl::StrCat(StorageProblem(status), " (", options_.state_dir, ")");
    if (storage_error_ != problem) Log("cannot write the database: ", status.message(), "; jobs are stalled");
    storage_error_ = problem;
  }
}

void Coordinator::Apply(Deferred& deferred) {
  for (const JobRecord& rec : deferred.job_updates) {
    absl::Status s = store_->UpdateJob(rec);
    NoteStorage(s);
    if (!s.ok()) Log("saving job ", rec.job.job_id(), " failed: ", s.ToString());
  }
  for (const auto& [job_id, shard_id, attempts] : deferred.shard_done) {
    absl::Status s = store_->SetShardState(job_id, shard_id, ShardState::kDone, attempts);
    if (!s.ok()) Log("saving shard ", shard_id, " of job ", job_id, " failed: ", s.ToString());
  }
  for (const auto& [job_id, shard_id] : deferred.poisoned) FailPoisonedRow(job_id, shard_id);
  for (const auto& [job_id, spec] : deferred.spec_updates) {
    absl::Status s = store_->UpdateSpec(job_id, spec);
    NoteStorage(s);
    if (!s.ok()) Log("saving the spec of job ", job_id, " failed: ", s.ToString());
  }
}

int64_t Coordinator::AddReportListener(std::function<void()> wake) {
  absl::MutexLock lock(&listeners_mu_);
  const int64_t handle = next_listener_++;
  report_listeners_.emplace(handle, std::move(wake));
  return handle;
}

void Coordinator::RemoveReportListener(int64_t handle) {
  absl::MutexLock lock(&listeners_mu_);
  report_listeners_.erase(handle);
}

void Coordinator::BackgroundLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Every 100 ms, or at once when a job has reached its end (its report is then written
      // without waiting out the period).
      mu_.AwaitWithTimeout(absl::Condition(this, &Coordinator::StoppingOrFinalizing), absl::Milliseconds(100));
      if (stopping_) return;
    }
    ExpireLeases();
    RunFinalizers();
    ApplyRetention();
    bool save = false;
    {
      absl::MutexLock lock(&mu_);
      save = !draining_ && Now() - last_handoff_save_ >= kHandoffSaveSeconds;
    }
    // A killed tallyd hands over too (coordinator_handoff.cc), as of a few seconds before its end.
    if (save) {
      if (absl::Status s = SaveHandoff(false); !s.ok()) NoteStorage(s);
    }
  }
}

}  // namespace tally
