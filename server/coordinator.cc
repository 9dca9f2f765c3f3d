#include "server/coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/metrics.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "server/report_writer.h"

namespace tally {
namespace {

// Shards are aligned to this many rows when the job leaves the batch size to the worker, so that
// batch boundaries fall on the same indices whichever worker runs a shard (8, 16 and 32 divide it).
constexpr int64_t kDefaultBatchAlignment = 32;

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
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

// Checks a submitted spec and fills defaults. Errors name the field.
absl::Status NormalizeSpec(v1::JobSpec* spec) {
  if (spec->model().empty()) return absl::InvalidArgumentError("job spec: 'model' is required");
  if (spec->manifest().empty()) return absl::InvalidArgumentError("job spec: 'manifest' is required");
  spec->set_model(AbsolutePath(spec->model()));
  struct stat st;
  if (stat(spec->model().c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", spec->model(), "' does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("model '", spec->model(), "' is a directory, not a TorchScript file"));
  }
  ASSIGN_OR_RETURN(std::vector<Metric> metrics, ParseMetricNames({spec->metrics().begin(), spec->metrics().end()}));
  spec->clear_metrics();
  for (Metric m : metrics) spec->add_metrics(std::string(MetricName(m)));
  const std::string& p = spec->precision();
  if (p.empty()) {
    spec->set_precision("fp32");
  } else if (p != "fp32" && p != "bf16" && p != "fp16") {
    return absl::InvalidArgumentError(absl::StrCat("job spec: precision '", p, "' is not one of fp32, bf16, fp16"));
  }
  for (auto* field : {spec->mutable_mean(), spec->mutable_std()}) {
    if (field->size() == 1) {
      const float v = field->Get(0);
      field->Add(v);
      field->Add(v);
    }
    if (field->size() != 0 && field->size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: mean/std need 1 or 3 values (R,G,B), got ", field->size()));
    }
  }
  for (float s : spec->std()) {
    if (!(s > 0)) return absl::InvalidArgumentError("job spec: every std value must be > 0");
  }
  if ((spec->input_height() > 0) != (spec->input_width() > 0) || spec->input_height() < 0 || spec->input_width() < 0) {
    return absl::InvalidArgumentError("job spec: input size needs both a height and a width > 0");
  }
  if (spec->batch_size() < -1) return absl::InvalidArgumentError("job spec: batch_size must be >= 1, 0 (default) or -1 (auto)");
  if (spec->shard_size() < 0) return absl::InvalidArgumentError("job spec: shard_size must be >= 0");
  if (spec->spacing_y() < 0 || spec->spacing_x() < 0) return absl::InvalidArgumentError("job spec: spacing must be > 0");
  if (spec->nsd_tolerance() < 0) return absl::InvalidArgumentError("job spec: nsd_tolerance must be >= 0");
  if (spec->max_memory() < 0) return absl::InvalidArgumentError("job spec: max_memory must be >= 0");
  return absl::OkStatus();
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
  return c;
}

Coordinator::~Coordinator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (background_.joinable()) background_.join();
}

std::string Coordinator::ReportPath(const std::string& job_id) const {
  return options_.state_dir + "/reports/" + job_id;
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
      const int64_t num_shards = rec.shard_size > 0 ? (n + rec.shard_size - 1) / rec.shard_size : 0;
      ASSIGN_OR_RETURN(std::vector<ShardState> states, store_->ReadShardStates(id, num_shards));
      ASSIGN_OR_RETURN(std::vector<int64_t> done_rows, store_->ReadResultIndices(id));
      for (const ShardRange& r : MakeShards(n, rec.shard_size)) {
        Shard s;
        s.begin = r.begin;
        s.end = r.end;
        entry->shards.push_back(s);
      }
      for (int64_t idx : done_rows) {
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
  return job;
}

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& in) {
  v1::JobSpec spec = in;
  RETURN_IF_ERROR(NormalizeSpec(&spec));
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(AbsolutePath(spec.manifest())));
  spec.set_manifest(manifest.path);
  const double now = Now();
  JobRecord rec;
  rec.job.set_job_id(NewJobId(now));
  *rec.job.mutable_spec() = spec;
  rec.job.set_state(v1::JOB_STATE_QUEUED);
  rec.job.set_created_unix(now);
  rec.job.set_images_total(static_cast<int64_t>(manifest.rows.size()));
  const int64_t alignment = spec.batch_size() > 0 ? spec.batch_size() : kDefaultBatchAlignment;
  rec.shard_size = EffectiveShardSize(rec.job.images_total(), spec.shard_size(), alignment);
  RETURN_IF_ERROR(store_->CreateJob(rec, manifest.rows));
  auto entry = std::make_unique<JobEntry>();
  for (const ShardRange& r : MakeShards(rec.job.images_total(), rec.shard_size)) {
    Shard s;
    s.begin = r.begin;
    s.end = r.end;
    entry->pending.push_back(static_cast<int64_t>(entry->shards.size()));
    entry->shards.push_back(s);
  }
  entry->record = rec;
  Log("job ", rec.job.job_id(), " submitted: ", rec.job.images_total(), " images in ", entry->shards.size(),
      " shards of ", rec.shard_size, ", model ", spec.model());
  absl::MutexLock lock(&mu_);
  job_order_.push_back(rec.job.job_id());
  JobEntry* raw = entry.get();
  jobs_[rec.job.job_id()] = std::move(entry);
  MaybeCompleteLocked(raw);  // An empty manifest is done at once.
  return Snapshot(*raw, now);
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return Snapshot(*it->second, Now());
}

std::vector<v1::Job> Coordinator::ListJobs(int limit) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  const double now = Now();
  for (auto it = job_order_.rbegin(); it != job_order_.rend(); ++it) {
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
    out.push_back(Snapshot(*jobs_.at(*it), now));
  }
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

absl::StatusOr<std::string> Coordinator::ReportDir(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const v1::Job& job = it->second->record.job;
  if (!job.report_ready()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no report yet (", job.images_evaluated() + job.images_failed(), "/",
        job.images_total(), " images done); reports are built when the job ends"));
  }
  return ReportPath(job_id);
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(const v1::RegisterWorkerRequest& request) {
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("w", next_worker_seq_++, "-", RandomHex(4));
  WorkerEntry& w = workers_[id];
  w.info = request;
  w.last_seen = Now();
  Log("worker ", id, " registered: ", request.name(), " device ", request.device(), " (", request.device_name(),
      ") pid ", request.pid(), " on ", request.hostname());
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_seconds(options_.heartbeat_seconds);
  response.set_lease_seconds(options_.lease_seconds);
  return response;
}

absl::StatusOr<v1::AcquireShardResponse> Coordinator::AcquireShard(const v1::AcquireShardRequest& request) {
  v1::AcquireShardResponse response;
  Deferred deferred;
  std::string job_id;
  v1::JobSpec spec;
  Shard leased;
  int64_t shard_id = -1;
  std::vector<std::pair<std::string, WorkerRecord>> new_workers;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again"));
    }
    WorkerEntry& worker = wit->second;
    const double now = Now();
    worker.last_seen = now;
    for (const std::string& id : job_order_) {
      JobEntry& job = *jobs_.at(id);
      const v1::JobState state = job.record.job.state();
      if (IsTerminal(state) || job.pending.empty()) continue;
      shard_id = job.pending.front();
      job.pending.pop_front();
      Shard& s = job.shards[shard_id];
      s.phase = ShardPhase::kLeased;
      s.attempts++;
      s.lease_id = next_lease_id_++;
      s.worker_id = request.worker_id();
      worker.leases.insert({id, shard_id});
      if (state == v1::JOB_STATE_QUEUED) {
        job.record.job.set_state(v1::JOB_STATE_RUNNING);
        job.record.job.set_started_unix(now);
        deferred.job_updates.push_back(job.record);
      }
      if (job.known_workers.insert(request.worker_id()).second) {
        WorkerRecord wr;
        wr.worker_id = request.worker_id();
        wr.name = worker.info.name();
        wr.device = worker.info.device();
        wr.first_lease_unix = now;
        wr.stats.set_device(worker.info.device());
        wr.stats.set_gpu_name(worker.info.device_name());
        new_workers.emplace_back(id, wr);
      }
      job_id = id;
      spec = job.record.job.spec();
      leased = s;
      break;
    }
  }
  Apply(deferred);
  for (const auto& [jid, wr] : new_workers) {
    absl::Status s = store_->UpsertWorker(jid, wr);
    if (!s.ok()) Log("recording worker ", wr.worker_id, " failed: ", s.ToString());
  }
  if (shard_id < 0) {
    response.set_retry_after_ms(200);
    return response;
  }
  absl::StatusOr<std::vector<ManifestRow>> rows = store_->ReadRows(job_id, leased.begin, leased.end);
  if (!rows.ok()) {
    Deferred undo;
    {
      absl::MutexLock lock(&mu_);
      JobEntry& job = *jobs_.at(job_id);
      ReleaseShardLocked(&job, shard_id, "reading its rows failed", &undo);
      workers_[request.worker_id()].leases.erase({job_id, shard_id});
    }
    Apply(undo);
    return rows.status();
  }
  v1::ShardAssignment* a = response.mutable_assignment();
  a->set_job_id(job_id);
  *a->mutable_spec() = spec;
  a->set_shard_id(shard_id);
  a->set_lease_id(leased.lease_id);
  a->set_begin(leased.begin);
  a->set_end(leased.end);
  for (const ManifestRow& r : *rows) {
    v1::ManifestRow* row = a->add_rows();
    row->set_index(r.index);
    row->set_id(r.id);
    row->set_image(r.image_path);
    row->set_mask(r.mask_path);
    row->set_error(r.error);
  }
  return response;
}

absl::StatusOr<v1::ReportResultsResponse> Coordinator::ReportResults(const v1::ReportResultsRequest& request) {
  v1::ReportResultsResponse response;
  Deferred deferred;
  bool lease_valid = false;
  WorkerRecord worker_record;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again"));
    }
    const double now = Now();
    wit->second.last_seen = now;
    auto jit = jobs_.find(request.job_id());
    if (jit == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", request.job_id(), "'"));
    JobEntry& job = *jit->second;
    if (IsTerminal(job.record.job.state())) {
      response.set_abandon(true);
      return response;
    }
    if (request.shard_id() < 0 || request.shard_id() >= static_cast<int64_t>(job.shards.size())) {
      return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), " has no shard ", request.shard_id()));
    }
    const Shard& shard = job.shards[request.shard_id()];
    for (const v1::ImageResult& r : request.results()) {
      if (r.index() < shard.begin || r.index() >= shard.end) {
        return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " outside shard [",
                                                       shard.begin, ", ", shard.end, ")"));
      }
    }
    int32_t classes = job.record.job.num_classes();
    if (request.num_classes() > 0 && classes == 0) {
      job.record.job.set_num_classes(request.num_classes());
      deferred.job_updates.push_back(job.record);
      classes = request.num_classes();
    } else if (request.num_classes() > 0 && request.num_classes() != classes) {
      EndJobLocked(&job,
                   v1::JOB_STATE_FAILED,
                   absl::StrCat("workers disagree on the number of classes of model '", job.record.job.spec().model(),
                                "': ", classes, " and ", request.num_classes()),
                   &deferred);
      classes = -1;
    }
    if (classes >= 0) {
      for (const v1::ImageResult& r : request.results()) {
        if (r.error().empty() && r.classes_size() != classes) {
          return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", r.classes_size(),
                                                         " classes; the job has ", classes));
        }
      }
    }
    lease_valid = shard.phase == ShardPhase::kLeased && shard.lease_id == request.lease_id();
    if (request.has_stats()) {
      worker_record.worker_id = request.worker_id();
      worker_record.name = wit->second.info.name();
      worker_record.device = wit->second.info.device();
      worker_record.last_result_unix = now;
      worker_record.stats = request.stats();
    }
    if (classes < 0) {
      response.set_abandon(true);
    }
  }
  Apply(deferred);
  if (response.abandon()) return response;
  std::vector<v1::ImageResult> results(request.results().begin(), request.results().end());
  ASSIGN_OR_RETURN(bool shard_done, CommitAndAccount(request.job_id(), request.shard_id(), request.worker_id(),
                                                     results, request.shard_complete() && lease_valid));
  if (!worker_record.worker_id.empty()) {
    absl::Status s = store_->UpsertWorker(request.job_id(), worker_record);
    if (!s.ok()) Log("recording statistics of worker ", request.worker_id(), " failed: ", s.ToString());
  }
  response.set_abandon(!lease_valid || (shard_done && !request.shard_complete()));
  return response;
}

absl::StatusOr<bool> Coordinator::CommitAndAccount(const std::string& job_id, int64_t shard_id,
                                                   const std::string& worker_id,
                                                   const std::vector<v1::ImageResult>& results, bool shard_complete) {
  std::vector<bool> new_rows;
  const double now = Now();
  RETURN_IF_ERROR(store_->CommitResults(job_id, worker_id, results, now, &new_rows));
  Deferred deferred;
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    JobEntry& job = *jobs_.at(job_id);
    Shard& shard = job.shards[shard_id];
    v1::Job& j = job.record.job;
    for (size_t i = 0; i < results.size(); ++i) {
      if (!new_rows[i]) continue;
      if (results[i].error().empty()) {
        j.set_images_evaluated(j.images_evaluated() + 1);
      } else {
        j.set_images_failed(j.images_failed() + 1);
      }
      shard.committed++;
    }
    if (!results.empty()) job.record.last_result_unix = now;
    if (shard.committed >= shard.end - shard.begin) {
      if (shard.phase != ShardPhase::kDone) {
        if (!shard.worker_id.empty()) {
          auto wit = workers_.find(shard.worker_id);
          if (wit != workers_.end()) wit->second.leases.erase({job_id, shard_id});
        }
        shard.phase = ShardPhase::kDone;
        shard.worker_id.clear();
        job.shards_done++;
        deferred.shard_done.emplace_back(job_id, shard_id, shard.attempts);
        MaybeCompleteLocked(&job);
      }
      done = true;
    } else if (shard_complete && shard.phase == ShardPhase::kLeased) {
      Log("worker ", worker_id, " finished shard ", shard_id, " of job ", job_id, " with only ", shard.committed, "/",
          shard.end - shard.begin, " rows; queueing it again");
      auto wit = workers_.find(worker_id);
      if (wit != workers_.end()) wit->second.leases.erase({job_id, shard_id});
      ReleaseShardLocked(&job, shard_id, "incomplete results", &deferred);
    }
  }
  Apply(deferred);
  return done;
}

absl::Status Coordinator::ReportJobError(const v1::ReportJobErrorRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(request.job_id());
    if (jit == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", request.job_id(), "'"));
    auto wit = workers_.find(request.worker_id());
    if (wit != workers_.end()) wit->second.last_seen = Now();
    if (!IsTerminal(jit->second->record.job.state())) {
      Log("job ", request.job_id(), " failed on worker ", request.worker_id(), ": ", request.message());
      EndJobLocked(jit->second.get(), v1::JOB_STATE_FAILED, request.message(), &deferred);
    }
  }
  Apply(deferred);
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  absl::MutexLock lock(&mu_);
  auto wit = workers_.find(request.worker_id());
  if (wit == workers_.end()) {
    response.set_reregister(true);
    return response;
  }
  wit->second.last_seen = Now();
  for (const v1::HeldLease& held : request.leases()) {
    bool valid = false;
    auto jit = jobs_.find(held.job_id());
    if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state()) && held.shard_id() >= 0 &&
        held.shard_id() < static_cast<int64_t>(jit->second->shards.size())) {
      const Shard& s = jit->second->shards[held.shard_id()];
      valid = s.phase == ShardPhase::kLeased && s.lease_id == held.lease_id();
    }
    if (!valid) *response.add_revoked() = held;
  }
  return response;
}

void Coordinator::ExpireLeases() {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const double now = Now();
    for (auto it = workers_.begin(); it != workers_.end();) {
      const double silent = now - it->second.last_seen;
      if (silent <= options_.lease_seconds) {
        ++it;
        continue;
      }
      Log("worker ", it->first, " (", it->second.info.name(), ") silent for ", absl::StrFormat("%.1f", silent),
          " s: taking back its ", it->second.leases.size(), " shard(s)");
      for (const auto& [job_id, shard_id] : it->second.leases) {
        auto jit = jobs_.find(job_id);
        if (jit == jobs_.end()) continue;
        ReleaseShardLocked(jit->second.get(), shard_id,
                           absl::StrCat("worker ", it->first, " (", it->second.info.name(), ") stopped responding"),
                           &deferred);
      }
      it = workers_.erase(it);
    }
  }
  Apply(deferred);
}

void Coordinator::ReleaseShardLocked(JobEntry* job, int64_t shard_id, const std::string& why, Deferred* deferred) {
  Shard& s = job->shards[shard_id];
  if (s.phase != ShardPhase::kLeased) return;
  s.worker_id.clear();
  s.lease_id = 0;
  if (IsTerminal(job->record.job.state())) {
    s.phase = ShardPhase::kPending;
    return;
  }
  if (s.attempts >= options_.max_shard_attempts) {
    Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job->record.job.job_id(), " lost ", s.attempts,
        " times (", why, "); failing its remaining rows");
    deferred->poisoned.emplace_back(job->record.job.job_id(), shard_id);  // Stays leased to nobody.
    return;
  }
  Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job->record.job.job_id(), " queued again: ", why);
  s.phase = ShardPhase::kPending;
  job->pending.push_front(shard_id);
}

void Coordinator::EndJobLocked(JobEntry* job, v1::JobState state, const std::string& error, Deferred* deferred) {
  v1::Job& j = job->record.job;
  j.set_state(state);
  j.set_error(error);
  j.set_finished_unix(Now());
  job->pending.clear();
  for (Shard& s : job->shards) {
    if (s.phase == ShardPhase::kLeased) {
      auto wit = workers_.find(s.worker_id);
      if (wit != workers_.end()) wit->second.leases.erase({j.job_id(), &s - job->shards.data()});
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

void Coordinator::FailPoisonedShard(const std::string& job_id, int64_t shard_id) {
  int64_t begin = 0, end = 0;
  int attempts = 0;
  {
    absl::MutexLock lock(&mu_);
    const Shard& s = jobs_.at(job_id)->shards[shard_id];
    begin = s.begin;
    end = s.end;
    attempts = s.attempts;
  }
  std::vector<v1::ImageResult> failures;
  for (int64_t i = begin; i < end; ++i) {
    v1::ImageResult r;
    r.set_index(i);
    r.set_error(absl::StrCat("not evaluated: the workers holding shard [", begin, ", ", end, ") were lost ", attempts,
                             " times (a row of it may crash or hang the worker)"));
    failures.push_back(std::move(r));
  }
  absl::StatusOr<bool> done = CommitAndAccount(job_id, shard_id, "coordinator", failures, true);
  if (!done.ok()) Log("failing rows of shard ", shard_id, " of job ", job_id, " failed: ", done.status().ToString());
}

void Coordinator::Apply(Deferred& deferred) {
  for (const JobRecord& rec : deferred.job_updates) {
    absl::Status s = store_->UpdateJob(rec);
    if (!s.ok()) Log("saving job ", rec.job.job_id(), " failed: ", s.ToString());
  }
  for (const auto& [job_id, shard_id, attempts] : deferred.shard_done) {
    absl::Status s = store_->SetShardState(job_id, shard_id, ShardState::kDone, attempts);
    if (!s.ok()) Log("saving shard ", shard_id, " of job ", job_id, " failed: ", s.ToString());
  }
  for (const auto& [job_id, shard_id] : deferred.poisoned) FailPoisonedShard(job_id, shard_id);
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
    absl::Status s = WriteReports(store_.get(), rec, ReportPath(job_id));
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
      v1::Job& j = jobs_.at(job_id)->record.job;
      if (completing) {
        j.set_state(rec.job.state());
        j.set_error(rec.job.error());
        j.set_finished_unix(rec.job.finished_unix());
      }
      j.set_report_ready(s.ok());
      rec = jobs_.at(job_id)->record;
    }
    absl::Status saved = store_->UpdateJob(rec);
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
  }
}

}  // namespace tally
