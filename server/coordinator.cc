#include "server/coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/job/job_config.h"
#include "common/io/image_io.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/io/manifest.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/security/sha256.h"
#include "common/io/thumbnail.h"
#include "server/sharding.h"
#include "common/base/status_macros.h"
#include "server/job_spec_validation.h"
#include "server/compare.h"
#include "server/report_writer.h"

namespace tally {
namespace {

// Moves the thumbnails out of `results` (stored results carry none), each with its row's Dice.
std::vector<StoredThumbnail> TakeThumbnails(std::vector<v1::ImageResult>* results, EmptyScore empty) {
  std::vector<StoredThumbnail> out;
  for (v1::ImageResult& r : *results) {
    for (v1::Thumbnail& t : *r.mutable_thumbnails()) {
      StoredThumbnail st;
      st.index = r.index();
      st.class_index = t.class_index();
      st.dice = RowDice(r.classes(t.class_index()), empty);  // In range: CheckResults.
      st.slice = t.slice();
      st.jpeg = std::move(*t.mutable_jpeg());
      out.push_back(std::move(st));
    }
    r.clear_thumbnails();
  }
  return out;
}


std::string RandomHex(int digits) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string out;
  for (int i = 0; i < digits; ++i) out.push_back("0123456789abcdef"[rng() % 16]);
  return out;
}

std::string NewJobId(double now) {
  const std::time_t secs = static_cast<std::time_t>(now);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return absl::StrCat("j", stamp, "-", RandomHex(6));
}

// Rows read from the manifest and inserted per transaction while a job is submitted.
constexpr size_t kSubmitBatchRows = 10000;

// A job summary for listings: the spec keeps only what identifies the job.
v1::Job Summary(v1::Job job) {
  job.clear_summary();
  v1::JobSpec small;
  small.set_model(job.spec().model());
  small.set_manifest(job.spec().manifest());
  small.set_name(job.spec().name());
  *small.mutable_labels() = job.spec().labels();
  *job.mutable_spec() = std::move(small);
  return job;
}

// The part of a database error worth showing a user ("database or disk is full").
std::string StorageProblem(const absl::Status& s) {
  const absl::string_view m = s.message();
  const size_t colon = m.rfind(": ");
  return std::string(colon == absl::string_view::npos ? m : m.substr(colon + 2));
}

bool IsStorageFailure(const absl::Status& s) { return absl::IsResourceExhausted(s) || absl::IsUnavailable(s); }

std::string RowName(const ManifestRow& r) {
  return absl::StrCat("row ", r.index, " (manifest line ", r.line, ", id '", r.id, "', image '", r.image, "')");
}

}  // namespace

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
  for (JobRecord& rec : records) {
    auto entry = std::make_unique<JobEntry>();
    const std::string id = rec.job.job_id();
    if (IsTerminal(rec.job.state())) {
      struct stat st;
      rec.job.set_report_ready(stat((ReportPath(id) + "/report.json").c_str(), &st) == 0);
    } else {
      const int64_t n = rec.job.images_total();
      const int64_t num_shards = NumShards(n, rec.shard_size);
      ASSIGN_OR_RETURN(std::vector<ShardState> states, store_->ReadShardStates(id, num_shards));
      ASSIGN_OR_RETURN(std::vector<int64_t> done_rows, store_->ReadResultIndices(id));
      for (const ShardRange& r : MakeShards(n, rec.shard_size)) {
        Shard s;
        s.begin = r.begin;
        s.end = r.end;
        entry->shards.push_back(s);
      }
      entry->base_shards = num_shards;
      entry->committed_rows.assign(n, false);
      for (int64_t idx : done_rows) {
        if (idx >= 0 && idx < n) entry->committed_rows[idx] = true;
        if (rec.shard_size > 0 && idx / rec.shard_size < num_shards) entry->shards[idx / rec.shard_size].committed++;
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

v1::Job Coordinator::Snapshot(const JobEntry& entry, double now) const {
  v1::Job job = entry.record.job;
  const int64_t done = job.images_evaluated() + job.images_failed();
  double rate = 0;
  if (job.started_unix() > 0) {
    const double end = IsTerminal(job.state()) && job.finished_unix() > 0 ? job.finished_unix() : now;
    const double elapsed = end - job.started_unix();
    if (elapsed > 0) rate = done / elapsed;
  }
  job.set_images_per_second(rate);
  const int64_t remaining = job.images_total() - done;
  job.set_eta_seconds(IsTerminal(job.state()) ? 0 : (rate > 0 ? remaining / rate : -1));
  std::set<std::string> active;
  for (const Shard& s : entry.shards) {
    if (s.phase == ShardPhase::kLeased && !s.worker_id.empty()) active.insert(s.worker_id);
  }
  job.set_workers_active(static_cast<int32_t>(active.size()));
  if (!IsTerminal(job.state())) {
    int64_t held = 0;
    for (const std::string& id : active) {
      auto w = workers_.find(id);
      if (w != workers_.end() && w->second.gauges.job_id() == job.job_id()) held += w->second.gauges.images_held();
    }
    job.set_images_held(held);
  }
  if (!IsTerminal(job.state()) && !storage_error_.empty()) {
    job.set_stalled(absl::StrCat("stalled: ", storage_error_));
  }
  return job;
}

// Streams the manifest into the database in bounded batches; the job is not visible until its
// shards are stored too. On any error, the rows stored so far are deleted again.
absl::StatusOr<JobRecord> Coordinator::StoreManifest(const v1::JobSpec& spec, const std::string& job_id) {
  ManifestLimits limits;
  limits.max_rows = options_.max_manifest_rows;
  ASSIGN_OR_RETURN(std::unique_ptr<ManifestReader> reader, ManifestReader::Open(spec.manifest(), limits));
  if (spec.model().empty() && !reader->has_prediction()) {
    return absl::InvalidArgumentError(absl::StrCat("no model given, and manifest '", reader->path(),
                                                   "' has no 'prediction' column to score instead"));
  }
  // Only Python models read the other columns (prompts, ...): other jobs do not store them.
  const bool keep_columns = ParseModelRef(spec.model()).python;
  if (keep_columns) reader->KeepExtraColumns();
  RETURN_IF_ERROR(store_->BeginSubmission(job_id));
  auto stream = [&]() -> absl::Status {
    std::vector<ManifestRow> batch;
    while (true) {
      RETURN_IF_ERROR(reader->NextBatch(kSubmitBatchRows, &batch));
      if (batch.empty()) return absl::OkStatus();
      RETURN_IF_ERROR(store_->InsertManifestRows(job_id, batch));
    }
  };
  if (absl::Status s = stream(); !s.ok()) {
    absl::Status cleanup = store_->DeleteJob(job_id);
    if (!cleanup.ok()) Log("removing the rows of the refused submission ", job_id, " failed: ", cleanup.ToString());
    return s;
  }
  JobRecord rec;
  rec.job.set_job_id(job_id);
  *rec.job.mutable_spec() = spec;
  rec.job.mutable_spec()->set_manifest(reader->path());
  rec.job.mutable_spec()->set_manifest_sha256(Sha256FileHex(reader->path()));
  if (!spec.model().empty()) rec.job.mutable_spec()->set_model_sha256(Sha256FileHex(ParseModelRef(spec.model()).path));
  if (keep_columns) {
    for (const std::string& c : reader->extra_columns()) rec.job.mutable_spec()->add_manifest_columns(c);
  }
  rec.job.set_state(v1::JOB_STATE_QUEUED);
  rec.job.set_created_unix(Now());
  rec.job.set_images_total(reader->rows_read());
  int64_t requested = spec.shard_size();
  if (requested == 0 && spec.model().empty()) {
    // Scoring a row (a 3D volume especially) costs far more than a model's image: smaller shards
    // spread a small set over every worker.
    requested = std::clamp<int64_t>((rec.job.images_total() + 255) / 256, 1, 1024);
  }
  rec.shard_size = EffectiveShardSize(rec.job.images_total(), requested, spec.batch_alignment());
  return rec;
}

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& in, const std::string& owner) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ValidateJobSpec(in));
  const std::string job_id = NewJobId(Now());
  ASSIGN_OR_RETURN(JobRecord rec, StoreManifest(spec, job_id));
  rec.job.set_owner(owner);
  if (absl::Status s = store_->CreateJob(rec); !s.ok()) {
    store_->DeleteJob(job_id).IgnoreError();
    NoteStorage(s);
    return s;
  }
  auto entry = std::make_unique<JobEntry>();
  for (const ShardRange& r : MakeShards(rec.job.images_total(), rec.shard_size)) {
    Shard s;
    s.begin = r.begin;
    s.end = r.end;
    entry->pending.push_back(static_cast<int64_t>(entry->shards.size()));
    entry->shards.push_back(s);
  }
  entry->base_shards = static_cast<int64_t>(entry->shards.size());
  entry->committed_rows.assign(rec.job.images_total(), false);
  entry->record = rec;
  Log("job ", job_id, " submitted: ", rec.job.images_total(), " images in ", entry->shards.size(), " shards of ",
      rec.shard_size, rec.job.spec().model().empty() ? ", scoring predictions" : ", model ",
      rec.job.spec().model());
  absl::MutexLock lock(&mu_);
  job_order_.push_back(job_id);
  JobEntry* raw = entry.get();
  jobs_[job_id] = std::move(entry);
  NoteWorkLocked();
  MaybeCompleteLocked(raw);  // An empty manifest is done at once.
  return Snapshot(*raw, Now());
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return Snapshot(*it->second, Now());
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const std::optional<std::string>& owner) {
  const int limit = request.limit() <= 0 ? 20 : std::min(request.limit(), 1000);
  const std::string& page_token = request.page_token();
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse out;
  const double now = Now();
  auto it = job_order_.rbegin();
  if (!page_token.empty()) {
    it = std::find(job_order_.rbegin(), job_order_.rend(), page_token);
    if (it == job_order_.rend() || (owner && jobs_.at(*it)->record.job.owner() != *owner)) {
      return absl::InvalidArgumentError(absl::StrCat("page token '", page_token, "' names no job"));
    }
    ++it;
  }
  for (; it != job_order_.rend(); ++it) {
    if (out.jobs_size() >= limit) {
      out.set_next_page_token(out.jobs(out.jobs_size() - 1).job_id());
      break;
    }
    const JobEntry& entry = *jobs_.at(*it);
    if (owner && entry.record.job.owner() != *owner) continue;
    if (request.state() != v1::JOB_STATE_UNSPECIFIED && entry.record.job.state() != request.state()) continue;
    bool labelled = true;
    for (const auto& [key, value] : request.labels()) {
      auto l = entry.record.job.spec().labels().find(key);
      labelled &= l != entry.record.job.spec().labels().end() && l->second == value;
    }
    if (!labelled) continue;
    *out.add_jobs() = Summary(Snapshot(entry, now));
  }
  return out;
}

v1::ListWorkersResponse Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse out;
  for (const auto& [id, w] : workers_) {
    v1::WorkerInfo* info = out.add_workers();
    info->set_worker_id(id);
    info->set_name(w.info.name());
    info->set_device(w.info.device());
    info->set_hostname(w.info.hostname());
    info->set_pid(w.info.pid());
    info->set_state("serving");
    info->set_registered_unix(w.registered);
    info->set_last_seen_unix(w.last_seen);
    *info->mutable_gauges() = w.gauges;
    std::set<std::string> jobs;
    for (const auto& lease : w.leases) jobs.insert(lease.first);
    for (const std::string& j : jobs) info->add_jobs(j);
  }
  for (const v1::WorkerInfo& r : retired_) *out.add_workers() = r;
  return out;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id) {
  Deferred deferred;
  v1::Job snapshot;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    if (!IsTerminal(it->second->record.job.state())) {
      EndJobLocked(it->second.get(), v1::JOB_STATE_CANCELLED, "cancelled by request", &deferred);
    }
    snapshot = Snapshot(*it->second, Now());
  }
  Apply(deferred);
  return snapshot;
}

absl::Status Coordinator::DeleteJob(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    const v1::Job& job = it->second->record.job;
    if (!IsTerminal(job.state()) || it->second->finalize_queued) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has not ended",
                                                        IsTerminal(job.state()) ? " (its report is being built)" : "",
                                                        "; cancel it first, then delete it once it has ended"));
    }
    job_order_.erase(std::find(job_order_.begin(), job_order_.end(), job_id));
    jobs_.erase(it);
  }
  RETURN_IF_ERROR(store_->DeleteJob(job_id));
  RETURN_IF_ERROR(RemoveTree(ReportPath(job_id)));
  Log("job ", job_id, " deleted");
  return absl::OkStatus();
}

void Coordinator::ApplyRetention() {
  if (options_.retain_days <= 0) return;
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    const double now = Now();
    if (now - last_retention_ < 60) return;
    last_retention_ = now;
    const double cutoff = now - options_.retain_days * 86400.0;
    for (const std::string& id : job_order_) {
      const JobEntry& job = *jobs_.at(id);
      const v1::Job& j = job.record.job;
      if (IsTerminal(j.state()) && !job.finalize_queued && j.finished_unix() > 0 && j.finished_unix() < cutoff) {
        expired.push_back(id);
      }
    }
  }
  for (const std::string& id : expired) {
    absl::Status s = DeleteJob(id);
    if (!s.ok()) Log("retention: deleting job ", id, " failed: ", s.ToString());
  }
}

absl::StatusOr<std::string> Coordinator::MergeReports(const std::vector<std::string>& job_ids) {
  if (job_ids.size() < 2) return absl::InvalidArgumentError("merge needs two jobs or more");
  if (job_ids.size() > 1000) return absl::InvalidArgumentError("merge takes at most 1000 jobs");
  std::vector<JobRecord> parts;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : job_ids) {
      ASSIGN_OR_RETURN(JobRecord record, FinishedRecordLocked(id));
      parts.push_back(std::move(record));
    }
  }
  // One job's settings must describe them all: the report shows them once.
  ASSIGN_OR_RETURN(const JobConfig first, JobConfigFromSpec(parts[0].job.spec()));
  JobRecord merged;
  merged.job = parts[0].job;
  merged.job.set_job_id(absl::StrCat("merge-", parts.size(), "-", job_ids.front(), "-", job_ids.back()));
  std::vector<std::string> manifests;
  int64_t total = 0, evaluated = 0, failed = 0;
  for (const JobRecord& p : parts) {
    ASSIGN_OR_RETURN(const JobConfig c, JobConfigFromSpec(p.job.spec()));
    const auto differs = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat("cannot merge ", p.job.job_id(), " with ", parts[0].job.job_id(),
                                                     ": their ", what, " differ"));
    };
    if (c.metrics != first.metrics) return differs("metrics");
    if (p.job.num_classes() != parts[0].job.num_classes() || c.regions != first.regions) return differs("classes");
    if (c.include_background != first.include_background || c.empty_score != first.empty_score ||
        c.iou_thresholds != first.iou_thresholds || c.thresholds != first.thresholds) {
      return differs("aggregation settings (--include-background, --empty-score, --iou-thresholds, --thresholds)");
    }
    manifests.push_back(p.job.spec().manifest());
    total += p.job.images_total();
    evaluated += p.job.images_evaluated();
    failed += p.job.images_failed();
    merged.job.set_created_unix(std::min(merged.job.created_unix(), p.job.created_unix()));
    merged.job.set_finished_unix(std::max(merged.job.finished_unix(), p.job.finished_unix()));
    merged.last_result_unix = std::max(merged.last_result_unix, p.last_result_unix);
    if (p.job.state() != v1::JOB_STATE_SUCCEEDED) merged.job.set_state(p.job.state());
  }
  merged.job.mutable_spec()->set_manifest(absl::StrJoin(manifests, " + "));
  // Provenance: one model hash if every part ran the same file; no single manifest hash.
  for (const JobRecord& p : parts) {
    if (p.job.spec().model_sha256() != parts[0].job.spec().model_sha256()) merged.job.mutable_spec()->clear_model_sha256();
  }
  merged.job.mutable_spec()->clear_manifest_sha256();
  merged.job.mutable_spec()->set_name(absl::StrCat("merge of ", absl::StrJoin(job_ids, ", ")));
  merged.job.set_images_total(total);
  merged.job.set_images_evaluated(evaluated);
  merged.job.set_images_failed(failed);
  std::vector<const JobRecord*> pointers;
  for (const JobRecord& p : parts) pointers.push_back(&p);
  const std::string dir = absl::StrCat(options_.state_dir, "/merged/", merged.job.job_id(), "-", RandomHex(6));
  RETURN_IF_ERROR(WriteMergedReports(store_.get(), pointers, merged, dir));
  return dir;
}

absl::StatusOr<std::string> Coordinator::CompareJobs(const std::string& a, const std::string& b) {
  JobRecord run_a, run_b;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(run_a, FinishedRecordLocked(a));
    ASSIGN_OR_RETURN(run_b, FinishedRecordLocked(b));
  }
  ASSIGN_OR_RETURN(const Comparison c, ::tally::CompareJobs(store_.get(), run_a, run_b));
  const std::string dir = absl::StrCat(options_.state_dir, "/merged/compare-", a, "-", b, "-", RandomHex(6));
  RETURN_IF_ERROR(WriteComparison(c, dir));
  return dir;
}

absl::StatusOr<JobRecord> Coordinator::FinishedRecordLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const v1::Job& job = it->second->record.job;
  if (!job.report_ready()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no report yet (", job.images_evaluated() + job.images_failed(), "/",
        job.images_total(), " images done); reports are built when the job ends"));
  }
  return it->second->record;
}

absl::StatusOr<std::string> Coordinator::ReportDir(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FinishedRecordLocked(job_id).status());
  return ReportPath(job_id);
}

bool Coordinator::Serving() {
  absl::MutexLock lock(&mu_);
  return storage_error_.empty();
}

namespace {
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
        m.images_remaining += std::max<int64_t>(0, j.images_total() - j.images_evaluated() - j.images_failed());
      }
    }
    m.images_evaluated = counters_.images_evaluated;
    m.images_failed = counters_.images_failed;
    m.shards_leased = counters_.shards_leased;
    m.shards_expired = counters_.shards_expired;
    m.shards_retried = counters_.shards_retried;
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

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(const v1::RegisterWorkerRequest& request) {
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("w", next_worker_seq_++, "-", RandomHex(4));
  WorkerEntry& w = workers_[id];
  w.info = request;
  w.registered = w.last_seen = w.last_progress = Now();
  Log("worker ", id, " registered: ", request.name(), " device ", request.device(), " (", request.device_name(),
      ") pid ", request.pid(), " on ", request.hostname());
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_seconds(options_.heartbeat_seconds);
  return response;
}

std::optional<Coordinator::Grant> Coordinator::GrantShardLocked(const std::string& worker_id, WorkerEntry* worker,
                                                                Deferred* deferred) {
  const double now = Now();
  worker->last_seen = now;
  // A worker that held nothing starts its progress clock with its first lease.
  if (worker->leases.empty()) worker->last_progress = now;
  for (const std::string& id : job_order_) {
    JobEntry& job = *jobs_.at(id);
    const v1::JobState state = job.record.job.state();
    if (IsTerminal(state) || job.pending.empty() || job.excluded_workers.count(worker_id)) continue;
    Grant g;
    g.job_id = id;
    g.shard_id = job.pending.front();
    job.pending.pop_front();
    Shard& s = job.shards[g.shard_id];
    s.phase = ShardPhase::kLeased;
    s.attempts++;
    s.lease_id = next_lease_id_++;
    s.worker_id = worker_id;
    s.lease_unix = now;
    worker->leases.insert({id, g.shard_id});
    counters_.shards_leased++;
    if (state == v1::JOB_STATE_QUEUED) {
      job.record.job.set_state(v1::JOB_STATE_RUNNING);
      job.record.job.set_started_unix(now);
      deferred->job_updates.push_back(job.record);
    }
    if (job.known_workers.insert(worker_id).second) {
      WorkerRecord wr;
      wr.worker_id = worker_id;
      wr.name = worker->info.name();
      wr.device = worker->info.device();
      wr.first_lease_unix = now;
      wr.stats.set_device(worker->info.device());
      wr.stats.set_gpu_name(worker->info.device_name());
      g.new_worker = wr;
    }
    g.spec = job.record.job.spec();
    g.shard = s;
    return g;
  }
  return std::nullopt;
}

absl::StatusOr<v1::AcquireShardResponse> Coordinator::BuildAssignment(const Grant& g) {
  absl::StatusOr<std::vector<ManifestRow>> rows = store_->ReadRows(g.job_id, g.shard.begin, g.shard.end);
  if (!rows.ok()) {
    Deferred undo;
    {
      absl::MutexLock lock(&mu_);
      auto jit = jobs_.find(g.job_id);
      if (jit != jobs_.end()) ReleaseShardLocked(jit->second.get(), g.shard_id, "reading its rows failed", false, &undo);
    }
    Apply(undo);
    return rows.status();
  }
  v1::AcquireShardResponse response;
  v1::ShardAssignment* a = response.mutable_assignment();
  a->set_job_id(g.job_id);
  *a->mutable_spec() = g.spec;
  a->set_shard_id(g.shard_id);
  a->set_lease_id(g.shard.lease_id);
  a->set_begin(g.shard.begin);
  a->set_end(g.shard.end);
  for (const ManifestRow& r : *rows) {
    v1::ManifestRow* row = a->add_rows();
    row->set_index(r.index);
    row->set_id(r.id);
    row->set_image_path(r.image_path);
    row->set_mask_path(r.mask_path);
    row->set_prediction_path(r.prediction_path);
    row->set_error(r.error);
    for (const std::string& v : r.columns) row->add_columns(v);
  }
  return response;
}

v1::AcquireShardResponse Coordinator::NothingNow(bool waited) {
  v1::AcquireShardResponse response;
  // After a long poll's full wait the worker asks again at once. A worker that does not wait
  // (max_wait_ms 0; shutting down) asks again this soon: a new job's first shard waits at most
  // this long for it.
  response.set_retry_after_ms(waited ? 0 : 100);
  return response;
}

absl::StatusOr<v1::AcquireShardResponse> Coordinator::FinishGrant(const std::string& worker_id, const Grant& grant) {
  if (grant.new_worker) {
    absl::Status s = store_->UpsertWorker(grant.job_id, *grant.new_worker);
    if (!s.ok()) Log("recording worker ", worker_id, " failed: ", s.ToString());
  }
  return BuildAssignment(grant);
}

absl::StatusOr<v1::AcquireShardResponse> Coordinator::AcquireShard(const v1::AcquireShardRequest& request) {
  v1::AcquireShardRequest now = request;
  now.set_max_wait_ms(0);  // Answered on this thread, before AcquireShardAsync returns.
  absl::StatusOr<v1::AcquireShardResponse> answer = absl::InternalError("not answered");
  AcquireShardAsync(now, [&answer](absl::StatusOr<v1::AcquireShardResponse> r) { answer = std::move(r); });
  return answer;
}

int64_t Coordinator::AcquireShardAsync(const v1::AcquireShardRequest& request, AcquireDone done) {
  Deferred deferred;
  std::optional<Grant> grant;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    known = wit != workers_.end();
    if (known) grant = GrantShardLocked(request.worker_id(), &wit->second, &deferred);
    const int wait_ms = std::min(request.max_wait_ms(), kMaxAcquireWaitMs);
    if (known && !grant && wait_ms > 0 && !no_waiting_ && !stopping_) {
      const int64_t id = next_waiter_++;
      waiters_[id] = AcquireWaiter{request.worker_id(), absl::Now() + absl::Milliseconds(wait_ms), std::move(done)};
      NoteWorkLocked();  // The waiter thread learns its deadline.
      return id;
    }
  }
  Apply(deferred);
  if (!known) {
    done(absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again")));
  } else {
    done(grant ? FinishGrant(request.worker_id(), *grant) : NothingNow(false));
  }
  return 0;
}

void Coordinator::CancelAcquire(int64_t id) {
  AcquireDone done;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;  // Answered already.
    done = std::move(it->second.done);
    waiters_.erase(it);
  }
  done(absl::CancelledError("the caller gave up waiting for a shard"));
}

void Coordinator::StopWaiting() {
  absl::MutexLock lock(&mu_);
  no_waiting_ = true;
  NoteWorkLocked();
}

bool Coordinator::WaiterWorkLocked() const { return work_epoch_ != waiter_seen_epoch_ || stopping_; }

void Coordinator::WaiterLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [id, w] : waiters_) next = std::min(next, w.deadline);
    mu_.AwaitWithDeadline(absl::Condition(this, &Coordinator::WaiterWorkLocked), next);
    waiter_seen_epoch_ = work_epoch_;
    const bool ending = stopping_ || no_waiting_;
    const absl::Time now = absl::Now();
    // Oldest waiter first: each gets what GrantShardLocked gives it now, or its answer when its
    // wait is over.
    struct Answer {
      AcquireWaiter waiter;
      std::optional<Grant> grant;
      bool known = true;
    };
    std::vector<Answer> answers;
    Deferred deferred;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      AcquireWaiter& w = it->second;
      auto wit = workers_.find(w.worker_id);
      const bool known = wit != workers_.end();  // Retired or forgotten meanwhile: it registers again.
      std::optional<Grant> grant;
      if (known && !stopping_) grant = GrantShardLocked(w.worker_id, &wit->second, &deferred);
      if (grant || ending || !known || now >= w.deadline) {
        answers.push_back(Answer{std::move(w), std::move(grant), known});
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    mu_.Unlock();
    Apply(deferred);
    for (Answer& a : answers) {
      if (!a.known) {
        a.waiter.done(absl::NotFoundError(absl::StrCat("unknown worker '", a.waiter.worker_id, "'; register again")));
      } else {
        a.waiter.done(a.grant ? FinishGrant(a.waiter.worker_id, *a.grant) : NothingNow(/*waited=*/!ending));
      }
    }
    mu_.Lock();
    if (stopping_ && waiters_.empty()) return;
  }
}

absl::Status Coordinator::CheckResults(const JobEntry& job, const Shard& shard,
                                       const v1::ReportResultsRequest& request, int32_t classes) const {
  for (const v1::ImageResult& r : request.results()) {
    if (r.index() < shard.begin || r.index() >= shard.end) {
      return absl::InvalidArgumentError(
          absl::StrCat("result for index ", r.index(), " outside shard [", shard.begin, ", ", shard.end, ")"));
    }
    if (!r.error().empty()) {
      if (r.thumbnails_size() > 0) return absl::InvalidArgumentError(absl::StrCat("failed row ", r.index(), " has thumbnails"));
      continue;
    }
    // classes 0: a prediction job whose class count comes from the data (each image up to its own
    // largest label).
    if (classes == 0 ? (r.classes_size() < 1 || r.classes_size() > kMaxClasses) : r.classes_size() != classes) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", r.classes_size(),
                                                     " classes; the job has ", classes));
    }
    // Every class partitions the same valid pixels (those the ignore value leaves): tp + fp + fn + tn
    // is that number for every class, and for every threshold of a sweep.
    const int64_t pixels = static_cast<int64_t>(r.height()) * r.width() * std::max(1, r.depth());
    const int64_t valid = pixels - r.mask_ignored_pixels();
    const auto implausible = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has implausible counts: ", what));
    };
    if (r.height() < 0 || r.width() < 0 || r.mask_ignored_pixels() < 0 || valid < 0) {
      return implausible(absl::StrCat("size ", r.height(), "x", r.width(), " with ", r.mask_ignored_pixels(),
                                      " ignored pixels"));
    }
    for (int k = 0; k < r.classes_size(); ++k) {
      const v1::ClassResult& c = r.classes(k);
      if (c.tp() < 0 || c.fp() < 0 || c.fn() < 0 || c.tn() < 0 || c.tp() + c.fp() + c.fn() + c.tn() != valid) {
        return implausible(absl::StrCat("class ", k, " has tp+fp+fn+tn = ", c.tp() + c.fp() + c.fn() + c.tn(),
                                        ", the image has ", valid, " valid pixels"));
      }
    }
    if (r.thumbnails_size() > r.classes_size()) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", r.thumbnails_size(),
                                                     " thumbnails for ", r.classes_size(), " classes"));
    }
    for (const v1::Thumbnail& t : r.thumbnails()) {
      // A JPEG (it is put into report.html as one) of a class of this result, and of a sane size.
      if (t.class_index() < 0 || t.class_index() >= r.classes_size() || t.jpeg().size() > kMaxThumbnailBytes ||
          t.jpeg().size() < 4 || static_cast<unsigned char>(t.jpeg()[0]) != 0xFF ||
          static_cast<unsigned char>(t.jpeg()[1]) != 0xD8 || t.slice() < 0 || t.slice() >= std::max(1, r.depth())) {
        return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has a thumbnail that is not a ",
                                                       "JPEG of one of its classes"));
      }
    }
    if (r.thresholds_size() != job.record.job.spec().thresholds_size()) {
      return implausible(absl::StrCat(r.thresholds_size(), " threshold counts for ",
                                      job.record.job.spec().thresholds_size(), " thresholds"));
    }
    for (const v1::ThresholdCounts& t : r.thresholds()) {
      if (t.tp() < 0 || t.fp() < 0 || t.fn() < 0 || t.tn() < 0 || t.tp() + t.fp() + t.fn() + t.tn() != valid) {
        return implausible(absl::StrCat("a threshold's tp+fp+fn+tn differs from the image's ", valid, " valid pixels"));
      }
    }
  }
  return absl::OkStatus();
}

int32_t Coordinator::ReconcileClassesLocked(JobEntry* job, const v1::ReportResultsRequest& request,
                                            Deferred* deferred) {
  int32_t classes = job->record.job.num_classes();
  const v1::JobSpec& spec = job->record.job.spec();
  if (spec.model().empty() && spec.regions_size() == 0 && spec.num_classes() == 0) {
    // The class count is the largest label in the whole set plus one: the most any result has.
    int32_t most = classes;
    for (const v1::ImageResult& r : request.results()) {
      if (r.error().empty() && r.classes_size() <= kMaxClasses) most = std::max(most, r.classes_size());
    }
    if (most > classes) {
      job->record.job.set_num_classes(most);
      deferred->job_updates.push_back(job->record);
    }
    return 0;
  }
  // The class count comes with the results (older workers may leave the field 0).
  int32_t reported = request.num_classes();
  for (const v1::ImageResult& r : request.results()) {
    if (reported == 0 && r.error().empty()) reported = r.classes_size();
  }
  if (reported > 0 && classes == 0) {
    job->record.job.set_num_classes(reported);
    deferred->job_updates.push_back(job->record);
    return reported;
  }
  if (reported > 0 && reported != classes) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 absl::StrCat("workers disagree on the number of classes of model '", job->record.job.spec().model(),
                              "': ", classes, " and ", reported),
                 deferred);
    return -1;
  }
  return classes;
}

absl::StatusOr<Coordinator::Admission> Coordinator::AdmitReportLocked(const v1::ReportResultsRequest& request,
                                                                      Deferred* deferred) {
  Admission a;
  auto wit = workers_.find(request.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again"));
  }
  const double now = Now();
  wit->second.last_seen = now;
  auto jit = jobs_.find(request.job_id());
  if (jit == jobs_.end() || IsTerminal(jit->second->record.job.state())) {
    a.abandon = true;  // Ended or deleted meanwhile.
    return a;
  }
  JobEntry& job = *jit->second;
  if (request.shard_id() < 0 || request.shard_id() >= static_cast<int64_t>(job.shards.size())) {
    return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), " has no shard ", request.shard_id()));
  }
  const Shard& shard = job.shards[request.shard_id()];
  a.lease_valid = shard.phase == ShardPhase::kLeased && shard.lease_id == request.lease_id() &&
                  shard.worker_id == request.worker_id();
  const int32_t classes = ReconcileClassesLocked(&job, request, deferred);
  if (classes < 0) {
    a.abandon = true;
    return a;
  }
  a.rejected = CheckResults(job, shard, request, classes);
  if (!a.rejected.ok()) {
    // A rejected report must not orphan the shard: the lease ends here.
    Log("rejected results from worker ", request.worker_id(), " (", wit->second.info.name(), ") for shard ",
        request.shard_id(), " of job ", request.job_id(), ": ", a.rejected.message());
    if (a.lease_valid) {
      ReleaseShardLocked(&job, request.shard_id(), absl::StrCat("results rejected: ", a.rejected.message()), true,
                         deferred);
    }
    return a;
  }
  if (request.has_stats()) {
    WorkerRecord wr;
    wr.worker_id = request.worker_id();
    wr.name = wit->second.info.name();
    wr.device = wit->second.info.device();
    wr.last_result_unix = now;
    wr.stats = request.stats();
    a.worker_record = std::move(wr);
  }
  if (!request.results().empty()) wit->second.last_progress = now;
  const v1::JobSpec& spec = job.record.job.spec();
  a.keep_thumbnails = spec.has_thumbnails() ? spec.thumbnails() : kDefaultThumbnails;
  a.empty_score = ParseEmptyScore(spec.empty_score()).value_or(EmptyScore::kNaN);  // Validated at submission.
  return a;
}

absl::StatusOr<v1::ReportResultsResponse> Coordinator::ReportResults(const v1::ReportResultsRequest& request) {
  Deferred deferred;
  absl::StatusOr<Admission> admitted;
  {
    absl::MutexLock lock(&mu_);
    admitted = AdmitReportLocked(request, &deferred);
    // Evaluated rows from a worker that held rows of this job: it holds none now (while it holds
    // any, every row it evaluates is held; rows that failed to decode may still come), so progress
    // does not count them twice until its next heartbeat.
    auto w = workers_.find(request.worker_id());
    if (w != workers_.end() && w->second.gauges.images_held() > 0 && w->second.gauges.job_id() == request.job_id() &&
        std::any_of(request.results().begin(), request.results().end(),
                    [](const v1::ImageResult& r) { return r.error().empty(); })) {
      w->second.gauges.set_images_held(0);
    }
  }
  Apply(deferred);
  if (!admitted.ok()) return admitted.status();
  if (!admitted->rejected.ok()) return admitted->rejected;
  v1::ReportResultsResponse response;
  if (admitted->abandon) {
    response.set_abandon(true);
    return response;
  }
  std::vector<v1::ImageResult> results(request.results().begin(), request.results().end());
  const std::vector<StoredThumbnail> thumbnails = TakeThumbnails(&results, admitted->empty_score);
  ASSIGN_OR_RETURN(const bool shard_done,
                   CommitAndAccount(request.job_id(), request.shard_id(), request.worker_id(), results,
                                    request.shard_complete() && admitted->lease_valid, thumbnails,
                                    admitted->keep_thumbnails));
  if (admitted->worker_record) {
    absl::Status s = store_->UpsertWorker(request.job_id(), *admitted->worker_record);
    if (!s.ok()) Log("recording statistics of worker ", request.worker_id(), " failed: ", s.ToString());
  }
  response.set_abandon(!admitted->lease_valid || (shard_done && !request.shard_complete()));
  return response;
}

int64_t Coordinator::OwnerShard(const JobEntry& job, int64_t index) const {
  auto it = job.row_shard.find(index);
  if (it != job.row_shard.end()) return it->second;
  return job.record.shard_size > 0 ? index / job.record.shard_size : 0;
}

absl::StatusOr<bool> Coordinator::CommitAndAccount(const std::string& job_id, int64_t shard_id,
                                                   const std::string& worker_id,
                                                   const std::vector<v1::ImageResult>& results, bool shard_complete,
                                                   const std::vector<StoredThumbnail>& thumbnails,
                                                   int keep_thumbnails) {
  std::vector<bool> new_rows;
  const double now = Now();
  const auto commit_start = std::chrono::steady_clock::now();
  absl::Status committed =
      store_->CommitResults(job_id, worker_id, results, now, &new_rows, thumbnails, keep_thumbnails);
  const double commit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - commit_start).count();
  NoteStorage(committed);
  RETURN_IF_ERROR(committed);
  Deferred deferred;
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    NoteCommitLocked(commit_seconds);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) return false;
    JobEntry& job = *jit->second;
    v1::Job& j = job.record.job;
    std::set<int64_t> touched = {shard_id};
    for (size_t i = 0; i < results.size(); ++i) {
      if (!new_rows[i]) continue;
      if (results[i].error().empty()) {
        j.set_images_evaluated(j.images_evaluated() + 1);
        counters_.images_evaluated++;
      } else {
        j.set_images_failed(j.images_failed() + 1);
        counters_.images_failed++;
      }
      if (results[i].index() >= 0 && results[i].index() < static_cast<int64_t>(job.committed_rows.size())) {
        job.committed_rows[results[i].index()] = true;
      }
      // Credited to the shard that owns the row now (a single-row shard after a split).
      const int64_t owner = OwnerShard(job, results[i].index());
      job.shards[owner].committed++;
      touched.insert(owner);
    }
    if (!results.empty()) job.record.last_result_unix = now;
    for (int64_t sid : touched) {
      Shard& shard = job.shards[sid];
      if (shard.split || shard.committed < shard.end - shard.begin) continue;
      if (shard.phase != ShardPhase::kDone) {
        if (!shard.worker_id.empty()) {
          auto wit = workers_.find(shard.worker_id);
          if (wit != workers_.end()) wit->second.leases.erase({job_id, sid});
        }
        shard.phase = ShardPhase::kDone;
        shard.worker_id.clear();
        job.shards_done++;
        if (sid < job.base_shards) deferred.shard_done.emplace_back(job_id, sid, shard.attempts);
        MaybeCompleteLocked(&job);
      }
    }
    Shard& shard = job.shards[shard_id];
    if (shard.phase == ShardPhase::kDone && !shard.split) {
      done = true;
    } else if (shard_complete && shard.phase == ShardPhase::kLeased) {
      Log("worker ", worker_id, " finished shard ", shard_id, " of job ", job_id, " with only ", shard.committed, "/",
          shard.end - shard.begin, " rows; queueing it again");
      ReleaseShardLocked(&job, shard_id, "incomplete results", true, &deferred);
    }
  }
  Apply(deferred);
  return done;
}

absl::Status Coordinator::ReportJobError(const v1::ReportJobErrorRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit != workers_.end()) wit->second.last_seen = Now();
    auto jit = jobs_.find(request.job_id());
    if (request.worker_local()) {
      RetireWorkerLocked(request.worker_id(), request.message(), &deferred);
    } else if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state())) {
      RecordModelErrorLocked(jit->second.get(), request, &deferred);
    }
  }
  Apply(deferred);
  return absl::OkStatus();
}

void Coordinator::RecordModelErrorLocked(JobEntry* job_entry, const v1::ReportJobErrorRequest& request,
                                         Deferred* deferred) {
  JobEntry& job = *job_entry;
  {
    auto wit = workers_.find(request.worker_id());
    Log("job ", request.job_id(), ": worker ", request.worker_id(), " reports", request.definitive() ? " (definitive)" : "",
        ": ", request.message());
    job.excluded_workers.insert(request.worker_id());
    std::set<std::string>& reporters = job.model_errors[request.message()];
    reporters.insert(request.worker_id());
    // Every worker still in service has given up on this job: nobody is left to run it.
    bool nobody_left = true;
    for (const auto& [id, w] : workers_) nobody_left &= job.excluded_workers.count(id) > 0;
    if (request.definitive() || reporters.size() >= 2 || nobody_left) {
      EndJobLocked(&job, v1::JOB_STATE_FAILED, request.message(), deferred);
    } else if (wit != workers_.end()) {
      ReleaseWorkerLeasesLocked(&wit->second, request.worker_id(), request.job_id(),
                                absl::StrCat("worker reported a model error: ", request.message()), false, deferred);
    }
  }
}

absl::StatusOr<v1::ResolveLayoutResponse> Coordinator::ResolveLayout(const v1::ResolveLayoutRequest& request) {
  const std::string& layout = request.channels_last();
  const std::string& decode = request.decode();
  if (!layout.empty() && layout != "on" && layout != "off") {
    return absl::InvalidArgumentError("ResolveLayout: channels_last must be on or off");
  }
  if (!decode.empty() && decode != "cpu" && decode != "gpu") {
    return absl::InvalidArgumentError("ResolveLayout: decode must be cpu or gpu");
  }
  if (layout.empty() && decode.empty()) return absl::InvalidArgumentError("ResolveLayout: nothing proposed");
  absl::MutexLock lock(&mu_);
  auto wit = workers_.find(request.worker_id());
  if (wit != workers_.end()) wit->second.last_seen = Now();
  auto jit = jobs_.find(request.job_id());
  if (jit == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", request.job_id()));
  v1::JobSpec* spec = jit->second->record.job.mutable_spec();
  v1::JobSpec updated = *spec;
  if (!layout.empty() && spec->channels_last_resolved().empty()) {
    updated.set_channels_last_resolved(layout);
    updated.set_channels_last_trial(request.trial());
    Log("job ", request.job_id(), ": channels-last ", layout, " (worker ", request.worker_id(),
        "'s trial: ", request.trial(), ")");
  }
  if (!decode.empty() && spec->decode_resolved().empty()) {
    updated.set_decode_resolved(decode);
    updated.set_decode_trial(request.decode_trial());
    Log("job ", request.job_id(), ": JPEG decoding on the ", decode, " (worker ", request.worker_id(),
        "'s trial: ", request.decode_trial(), ")");
  }
  if (updated.channels_last_resolved() != spec->channels_last_resolved() ||
      updated.decode_resolved() != spec->decode_resolved()) {
    RETURN_IF_ERROR(store_->UpdateSpec(request.job_id(), updated));
    *spec = std::move(updated);
  }
  v1::ResolveLayoutResponse response;
  if (!layout.empty()) response.set_channels_last(spec->channels_last_resolved());
  if (!decode.empty()) response.set_decode(spec->decode_resolved());
  return response;
}

absl::Status Coordinator::ReleaseShard(const v1::ReleaseShardRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again"));
    }
    wit->second.last_seen = Now();
    auto jit = jobs_.find(request.job_id());
    if (jit == jobs_.end()) return absl::OkStatus();
    JobEntry& job = *jit->second;
    if (request.shard_id() < 0 || request.shard_id() >= static_cast<int64_t>(job.shards.size())) {
      return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), " has no shard ", request.shard_id()));
    }
    Shard& shard = job.shards[request.shard_id()];
    if (shard.phase != ShardPhase::kLeased || shard.lease_id != request.lease_id()) return absl::OkStatus();
    Log("worker ", request.worker_id(), " released shard ", request.shard_id(), " of job ", request.job_id(), ": ",
        request.reason());
    if (request.isolate_rows() && shard.end - shard.begin > 1 && !IsTerminal(job.record.job.state())) {
      wit->second.leases.erase({request.job_id(), request.shard_id()});
      shard.phase = ShardPhase::kPending;
      shard.worker_id.clear();
      SplitShardLocked(&job, request.shard_id());
    } else {
      ReleaseShardLocked(&job, request.shard_id(), request.reason(), true, &deferred);
    }
  }
  Apply(deferred);
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit == workers_.end()) {
      response.set_reregister(true);
      return response;
    }
    WorkerEntry& worker = wit->second;
    const double now = Now();
    worker.last_seen = now;
    worker.gauges = request.gauges();
    std::set<int64_t> listed;
    for (const v1::HeldLease& held : request.leases()) {
      listed.insert(held.lease_id());
      bool valid = false;
      auto jit = jobs_.find(held.job_id());
      if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state()) && held.shard_id() >= 0 &&
          held.shard_id() < static_cast<int64_t>(jit->second->shards.size())) {
        const Shard& s = jit->second->shards[held.shard_id()];
        valid = s.phase == ShardPhase::kLeased && s.lease_id == held.lease_id() && s.worker_id == request.worker_id();
      }
      if (!valid) *response.add_revoked() = held;
    }
    // Leases granted a lease period ago that the worker no longer lists were lost on its side
    // (an assignment it could not parse, results it dropped): they end here.
    std::vector<std::pair<std::string, int64_t>> lost;
    for (const auto& [job_id, shard_id] : worker.leases) {
      const Shard& s = jobs_.at(job_id)->shards[shard_id];
      if (!listed.count(s.lease_id) && now - s.lease_unix > options_.lease_seconds) lost.emplace_back(job_id, shard_id);
    }
    for (const auto& [job_id, shard_id] : lost) {
      ReleaseShardLocked(jobs_.at(job_id).get(), shard_id,
                         absl::StrCat("worker ", request.worker_id(), " no longer holds its lease"), true, &deferred);
    }
  }
  Apply(deferred);
  return response;
}

void Coordinator::ExpireLeases() {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const double now = Now();
    for (auto it = workers_.begin(); it != workers_.end();) {
      WorkerEntry& w = it->second;
      const double silent = now - w.last_seen;
      if (silent > options_.lease_seconds) {
        const std::string why = absl::StrCat("worker ", it->first, " (", w.info.name(), ") stopped responding");
        Log(why, " for ", absl::StrFormat("%.1f", silent), " s: taking back its ", w.leases.size(), " shard(s)");
        counters_.shards_expired += static_cast<int64_t>(w.leases.size());
        ReleaseWorkerLeasesLocked(&w, it->first, "", why, true, &deferred);
        it = workers_.erase(it);
        continue;
      }
      // Heartbeats alone do not keep a lease: a worker whose forward pass or decode hangs stops
      // committing results. Its leases go back after the job's batch timeout plus a lease period.
      std::vector<std::pair<std::string, int64_t>> stuck;
      for (const auto& [job_id, shard_id] : w.leases) {
        const JobEntry& job = *jobs_.at(job_id);
        const Shard& s = job.shards[shard_id];
        const double quiet = now - std::max(s.lease_unix, w.last_progress);
        if (quiet > BatchTimeout(job) + options_.lease_seconds) stuck.emplace_back(job_id, shard_id);
      }
      counters_.shards_expired += static_cast<int64_t>(stuck.size());
      for (const auto& [job_id, shard_id] : stuck) {
        JobEntry* job = jobs_.at(job_id).get();
        ReleaseShardLocked(job, shard_id,
                           absl::StrCat("worker ", it->first, " (", w.info.name(), ") made no progress for ",
                                        absl::StrFormat("%.0f", BatchTimeout(*job) + options_.lease_seconds), " s"),
                           true, &deferred);
      }
      ++it;
    }
  }
  Apply(deferred);
}

void Coordinator::ReleaseWorkerLeasesLocked(WorkerEntry* worker, const std::string& worker_id,
                                            const std::string& only_job, const std::string& why, bool count_attempt,
                                            Deferred* deferred) {
  const auto leases = worker->leases;  // ReleaseShardLocked edits the set.
  for (const auto& [job_id, shard_id] : leases) {
    if (!only_job.empty() && job_id != only_job) continue;
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) {
      worker->leases.erase({job_id, shard_id});
      continue;
    }
    ReleaseShardLocked(jit->second.get(), shard_id, why, count_attempt, deferred);
  }
}

void Coordinator::ReleaseShardLocked(JobEntry* job, int64_t shard_id, const std::string& why, bool count_attempt,
                                     Deferred* deferred) {
  Shard& s = job->shards[shard_id];
  if (s.phase != ShardPhase::kLeased) return;
  const std::string& job_id = job->record.job.job_id();
  auto wit = workers_.find(s.worker_id);
  if (wit != workers_.end()) wit->second.leases.erase({job_id, shard_id});
  s.worker_id.clear();
  s.lease_id = 0;
  if (!count_attempt) s.attempts = std::max(0, s.attempts - 1);
  if (IsTerminal(job->record.job.state())) {
    s.phase = ShardPhase::kPending;
    return;
  }
  if (s.attempts >= options_.max_shard_attempts) {
    if (s.end - s.begin == 1) {
      Log("row ", s.begin, " of job ", job_id, " lost ", s.attempts, " times (", why, "); failing it");
      deferred->poisoned.emplace_back(job_id, shard_id);  // Stays leased to nobody until failed.
      return;
    }
    Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job_id, " lost ", s.attempts, " times (", why,
        "); splitting it into single rows to find the culprit");
    s.phase = ShardPhase::kPending;
    SplitShardLocked(job, shard_id);
    counters_.shards_retried++;
    return;
  }
  Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job_id, " queued again: ", why);
  counters_.shards_retried++;
  s.phase = ShardPhase::kPending;
  job->pending.push_front(shard_id);
  NoteWorkLocked();
}

void Coordinator::SplitShardLocked(JobEntry* job, int64_t shard_id) {
  job->pending.erase(std::remove(job->pending.begin(), job->pending.end(), shard_id), job->pending.end());
  const int64_t begin = job->shards[shard_id].begin, end = job->shards[shard_id].end;
  std::vector<int64_t> children;
  for (int64_t i = begin; i < end; ++i) {
    if (job->committed_rows[i]) continue;
    Shard child;
    child.begin = i;
    child.end = i + 1;
    job->row_shard[i] = static_cast<int64_t>(job->shards.size());
    children.push_back(static_cast<int64_t>(job->shards.size()));
    job->shards.push_back(child);
  }
  Shard& parent = job->shards[shard_id];  // After the push_backs: the vector may have moved.
  parent.split = true;
  if (parent.phase != ShardPhase::kDone) {
    parent.phase = ShardPhase::kDone;  // Its rows are committed or owned by the children.
    job->shards_done++;
  }
  for (auto it = children.rbegin(); it != children.rend(); ++it) job->pending.push_front(*it);
  NoteWorkLocked();
  MaybeCompleteLocked(job);
}

void Coordinator::EndJobLocked(JobEntry* job, v1::JobState state, const std::string& error, Deferred* deferred) {
  v1::Job& j = job->record.job;
  j.set_state(state);
  j.set_error(error);
  j.set_finished_unix(Now());
  job->pending.clear();
  for (size_t i = 0; i < job->shards.size(); ++i) {
    Shard& s = job->shards[i];
    if (s.phase == ShardPhase::kLeased) {
      auto wit = workers_.find(s.worker_id);
      if (wit != workers_.end()) wit->second.leases.erase({j.job_id(), static_cast<int64_t>(i)});
      s.phase = ShardPhase::kPending;
      s.worker_id.clear();
    }
  }
  deferred->job_updates.push_back(job->record);
  if (!job->finalize_queued) {
    job->finalize_queued = true;
    finalize_queue_.push_back(j.job_id());
  }
}

void Coordinator::MaybeCompleteLocked(JobEntry* job) {
  if (job->finalize_queued || IsTerminal(job->record.job.state())) return;
  if (job->shards_done < static_cast<int64_t>(job->shards.size())) return;
  job->finalize_queued = true;
  finalize_queue_.push_back(job->record.job.job_id());
}

void Coordinator::RetireWorkerLocked(const std::string& worker_id, const std::string& reason, Deferred* deferred) {
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end()) return;
  WorkerEntry& w = wit->second;
  Log("worker ", worker_id, " (", w.info.name(), ", ", w.info.device(), " on ", w.info.hostname(),
      ") taken out of service: ", reason);
  ReleaseWorkerLeasesLocked(&w, worker_id, "", absl::StrCat("worker ", worker_id, " went out of service"), false,
                            deferred);
  v1::WorkerInfo info;
  info.set_worker_id(worker_id);
  info.set_name(w.info.name());
  info.set_device(w.info.device());
  info.set_hostname(w.info.hostname());
  info.set_pid(w.info.pid());
  info.set_state("out of service");
  info.set_reason(reason);
  info.set_registered_unix(w.registered);
  info.set_last_seen_unix(w.last_seen);
  retired_.push_back(std::move(info));
  while (retired_.size() > 100) retired_.pop_front();
  workers_.erase(wit);
}

void Coordinator::FailPoisonedRow(const std::string& job_id, int64_t shard_id) {
  int64_t index = 0;
  int attempts = 0;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) return;
    const Shard& s = jit->second->shards[shard_id];
    index = s.begin;
    attempts = s.attempts;
  }
  absl::StatusOr<std::vector<ManifestRow>> rows = store_->ReadRows(job_id, index, index + 1);
  const std::string name = rows.ok() && rows->size() == 1 ? RowName((*rows)[0]) : absl::StrCat("row ", index);
  v1::ImageResult r;
  r.set_index(index);
  r.set_error(absl::StrCat("not evaluated: ", name, " was in hand each time a worker was lost or gave up (",
                           attempts, " times); it may crash or hang the worker"));
  absl::StatusOr<bool> done = CommitAndAccount(job_id, shard_id, "coordinator", {r}, true);
  if (!done.ok()) Log("failing row ", index, " of job ", job_id, " failed: ", done.status().ToString());
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
}

void Coordinator::RunFinalizers() {
  while (true) {
    std::string job_id;
    JobRecord rec;
    {
      absl::MutexLock lock(&mu_);
      if (finalize_queue_.empty()) return;
      job_id = finalize_queue_.front();
      finalize_queue_.pop_front();
      rec = jobs_.at(job_id)->record;
    }
    const bool completing = !IsTerminal(rec.job.state());
    if (completing) {
      rec.job.set_state(v1::JOB_STATE_SUCCEEDED);
      rec.job.set_finished_unix(Now());
    }
    ReportOutcome outcome;
    absl::Status s = WriteReports(store_.get(), rec, ReportPath(job_id), &outcome);
    for (const std::string& w : outcome.warnings) Log("job ", job_id, ": warning: ", w);
    if (!s.ok()) {
      Log("building the report of job ", job_id, " failed: ", s.ToString());
      if (completing) {
        rec.job.set_state(v1::JOB_STATE_FAILED);
        rec.job.set_error(absl::StrCat("building the report failed (results are kept in the database): ",
                                       s.message()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      JobEntry& job = *jobs_.at(job_id);
      v1::Job& j = job.record.job;
      if (completing) {
        j.set_state(rec.job.state());
        j.set_error(rec.job.error());
        j.set_finished_unix(rec.job.finished_unix());
      }
      j.set_report_ready(s.ok());
      j.set_summary(outcome.summary);
      job.finalize_queued = false;
      rec = job.record;
    }
    absl::Status saved = store_->UpdateJob(rec);
    NoteStorage(saved);
    if (!saved.ok()) Log("saving job ", job_id, " failed: ", saved.ToString());
    Log("job ", job_id, " ", v1::JobState_Name(rec.job.state()), ": ", rec.job.images_evaluated(), " evaluated, ",
        rec.job.images_failed(), " failed of ", rec.job.images_total());
  }
}

void Coordinator::BackgroundLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
    }
    ExpireLeases();
    RunFinalizers();
    ApplyRetention();
  }
}

}  // namespace tally
