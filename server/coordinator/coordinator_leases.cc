// Coordinator: the shard ledger and leases: granting the oldest pending shard (at once or as a
// long poll), releases, expiry of silent or stuck workers, poisoned rows split off and failed, and
// the job-wide answers workers agree on (the layout trial).
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

std::string RowName(const ManifestRow& r) {
  return absl::StrCat("row ", r.index, " (manifest line ", r.line, ", id '", r.id, "', image '", r.image, "')");
}

}  // namespace

std::optional<Coordinator::Grant> Coordinator::GrantShardLocked(const std::string& worker_id, WorkerEntry* worker,
                                                                Deferred* deferred) {
  const double now = Now();
  worker->last_seen = now;
  // A worker that held nothing starts its progress clock with its first lease.
  if (worker->leases.empty()) worker->last_progress = now;
  worker->restored = false;
  if (draining_) return std::nullopt;  // Stopping: no new leases (BeginDrain).
  // Pending shards first, of the jobs in fair-share order (coordinator_schedule.cc); then, at a
  // job's tail, a straggler's shard copied (--speculate-after), oldest job first.
  const std::vector<std::string> fair = LeaseOrderLocked(worker_id, *worker);
  for (int pass = 0; pass < 2; ++pass) for (const std::string& id : pass == 0 ? fair : job_order_) {
    JobEntry& job = *jobs_.at(id);
    const v1::JobState state = job.record.job.state();
    if (IsTerminal(state) || job.excluded_workers.count(worker_id)) continue;
    if (job.pending.empty() != (pass == 1)) continue;
    if (pass == 0 && !MayLeaseMoreLocked(job)) continue;
    Grant g;
    g.job_id = id;
    g.worker_id = worker_id;
    if (pass == 0 && !CanaryLetsInLocked(&job, worker_id, &g, deferred)) {
      if (!g.canary) continue;  // Waiting for its canary's verdict.
    } else if (pass == 1) {
      g.shard_id = SpeculateLocked(&job, worker_id, worker);
      if (g.shard_id < 0) continue;
      g.speculative = true;
    } else {
      // A suspect row goes to a worker holding nothing else, and such a worker takes nothing more.
      if (HoldsSuspectLocked(*worker)) return std::nullopt;
      g.shard_id = TakePendingLocked(&job, *worker);
      if (g.shard_id < 0) continue;
      Shard& s = job.shards[g.shard_id];
      s.phase = ShardPhase::kLeased;
      s.attempts++;
      s.lease_id = next_lease_id_++;
      s.worker_id = worker_id;
      s.lease_unix = now;
      s.restored = false;
      worker->leases.insert({id, g.shard_id});
    }
    if (worker->current_job != id) {
      worker->current_job = id;
      worker->current_since = now;
    }
    const Shard s = g.canary ? g.shard : job.shards[g.shard_id];
    if (!g.canary) counters_.shards_leased++;
    if (state == v1::JOB_STATE_QUEUED) {
      job.record.job.set_state(v1::JOB_STATE_RUNNING);
      job.record.job.set_started_unix(now);
      deferred->job_updates.push_back(job.record);
    }
    if (!g.canary && job.known_workers.insert(worker_id).second) {  // A canary alone evaluates nothing of the job.
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
    g.expected_rows = ExpectedRowsLocked(job);
    g.order = job.order;
    return g;
  }
  return std::nullopt;
}

int64_t Coordinator::TakePendingLocked(JobEntry* job, const WorkerEntry& worker) {
  auto next = job->pending.begin();
  while (next != job->pending.end()) {
    if (job->shards[*next].phase == ShardPhase::kDone) {
      // Done meanwhile (CommitAndAccount takes those out of the queue; this is the guard): leased
      // again, it would count done a second time and end the job before its last rows are in.
      next = job->pending.erase(next);
    } else if (!worker.leases.empty() && job->shards[*next].suspect) {
      ++next;  // Suspect rows only to a worker holding nothing else.
    } else {
      const int64_t shard_id = *next;
      job->pending.erase(next);
      return shard_id;
    }
  }
  return -1;
}

int64_t Coordinator::RowsInFlight(const JobEntry& job) {
  int64_t rows = 0;
  for (const Shard& s : job.shards) {
    if (s.phase == ShardPhase::kLeased) rows += s.end - s.begin;
  }
  return rows;
}

bool Coordinator::MayLeaseMoreLocked(const JobEntry& job) const {
  if (job.record.job.spec().until_ci() <= 0 || job.stopped_early) return true;
  const int64_t in_flight = RowsInFlight(job);
  // Draining for the final check: none leased until every leased row is in (a lease lost on the way
  // leaves none in flight and no commit to run the check: leasing goes on).
  if (job.ci_draining) return in_flight == 0;
  const int64_t cap = std::max<int64_t>(2 * static_cast<int64_t>(workers_.size()) * job.record.shard_size,
                                        job.live_rows / 4);
  return in_flight < cap;
}

// The job's rows, not this worker's share: the layout chosen once serves every worker, and the
// choice (hence, in bf16 and fp16, every value) must not depend on how many there are. Found on four
// H200s: one GPU ran the trial and chose channels-last, four skipped it, and 19 images differed.
int64_t Coordinator::ExpectedRowsLocked(const JobEntry& job) const {
  const v1::Job& j = job.record.job;
  return std::max<int64_t>(0, job.planned - j.images_evaluated() - j.images_failed());
}

absl::StatusOr<v1::AcquireShardResponse> Coordinator::BuildAssignment(const Grant& g) {
  // The shard's positions' rows, in that order (--order random: spread over the manifest).
  absl::StatusOr<std::vector<ManifestRow>> rows;
  if (g.order.random()) {
    std::vector<int64_t> indices;
    for (int64_t p = g.shard.begin; p < g.shard.end; ++p) indices.push_back(g.order.IndexAt(p));
    rows = store_->ReadRowsAt(g.job_id, indices);
  } else {
    rows = store_->ReadRows(g.job_id, g.shard.begin, g.shard.end);
  }
  if (rows.ok() && g.spec.coco_results_in_rows()) {
    if (absl::Status s = store_->ReadDetections(g.job_id, &*rows); !s.ok()) rows = s;
  }
  if (!rows.ok()) {
    Deferred undo;
    {
      absl::MutexLock lock(&mu_);
      auto jit = jobs_.find(g.job_id);
      if (jit != jobs_.end()) {
        ReleaseShardLocked(jit->second.get(), g.shard_id, "reading its rows failed", false, &undo, &g.worker_id);
      }
    }
    Apply(undo);
    return rows.status();
  }
  v1::AcquireShardResponse response;
  v1::ShardAssignment* a = response.mutable_assignment();
  a->set_job_id(g.job_id);
  *a->mutable_spec() = g.spec;
  a->set_shard_id(g.shard_id);
  a->set_lease_id(g.speculative ? g.shard.spec_lease_id : g.shard.lease_id);  // A canary's: in g.shard.
  a->set_begin(g.shard.begin);
  a->set_end(g.shard.end);
  a->set_expected_rows(g.expected_rows);
  for (ManifestRow& r : *rows) {  // Moved into the message: a COCO row's detections are 26 KB.
    v1::ManifestRow* row = a->add_rows();
    row->set_index(r.index);
    row->set_id(std::move(r.id));
    row->set_image_path(std::move(r.image_path));
    row->set_mask_path(std::move(r.mask_path));
    row->set_prediction_path(std::move(r.prediction_path));
    row->set_error(std::move(r.error));
    for (const std::string& v : r.columns) row->add_columns(v);
    if (r.has_coco_image) {
      row->set_has_coco_image(true);
      row->set_coco_image_id(r.coco_image_id);
    }
    if (r.has_coco_ann_ids) {
      row->set_has_coco_ann_ids(true);
      for (int64_t id : r.coco_ann_ids) row->add_coco_ann_ids(id);
    }
    if (!r.coco_detections.empty()) row->set_coco_detections(std::move(r.coco_detections));
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

double Coordinator::SpeculateAfter(const JobEntry& job) const {
  const double given = job.record.job.spec().speculate_after();
  if (given < 0) return -1;  // Off.
  if (given > 0) return given;
  if (job.shard_seconds.empty()) return -1;  // No shard has finished: no median to go by yet.
  std::vector<double> t = job.shard_seconds;
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return std::max(10.0, 3 * t[t.size() / 2]);
}

int64_t Coordinator::SpeculateLocked(JobEntry* job, const std::string& worker_id, WorkerEntry* worker) {
  if (job->stopped_early) return -1;
  if (job->record.job.spec().canary_rows() > 0) {  // Only workers its canary let in.
    auto c = job->canaries.find(worker_id);
    if (c == job->canaries.end() || !c->second.LetsIn()) return -1;
  }
  const std::string& job_id = job->record.job.job_id();
  for (const auto& lease : worker->leases) {
    if (lease.first == job_id) return -1;  // Still busy with this job.
  }
  const double after = SpeculateAfter(*job);
  if (after < 0) return -1;
  const double now = Now();
  int64_t best = -1;
  for (size_t i = 0; i < job->shards.size(); ++i) {
    const Shard& s = job->shards[i];
    if (s.phase != ShardPhase::kLeased || s.worker_id.empty() || s.worker_id == worker_id || !s.spec_worker_id.empty() ||
        now - s.lease_unix <= after) {
      continue;
    }
    if (best < 0 || s.lease_unix < job->shards[best].lease_unix) best = static_cast<int64_t>(i);
  }
  if (best < 0) return -1;
  Shard& s = job->shards[best];
  s.spec_worker_id = worker_id;
  s.spec_lease_id = next_lease_id_++;
  s.spec_lease_unix = now;
  worker->leases.insert({job_id, best});
  counters_.shards_speculated++;
  Log("shard ", best, " of job ", job_id, " leased to ", s.worker_id, " for ", absl::StrFormat("%.1f", now - s.lease_unix),
      " s (over ", absl::StrFormat("%.1f", after), " s, --speculate-after): a speculative copy goes to ", worker_id);
  return best;
}

void Coordinator::ForgetShardLeasesLocked(const std::string& job_id, int64_t shard_id, const Shard& shard) {
  for (const std::string* w : {&shard.worker_id, &shard.spec_worker_id}) {
    auto wit = w->empty() ? workers_.end() : workers_.find(*w);
    if (wit != workers_.end()) wit->second.leases.erase({job_id, shard_id});
  }
  // A suspect row's worker took nothing more while it held it (HoldsSuspectLocked): its long poll is
  // answered now, not at its deadline (5 s a row after a crash, without this).
  if (shard.suspect) NoteWorkLocked();
}

int64_t Coordinator::OwnerShard(const JobEntry& job, int64_t index) const {
  auto it = job.row_shard.find(index);
  if (it != job.row_shard.end()) return it->second;
  return std::max<int64_t>(0, BaseShardAt(job, job.order.PositionOf(index)));
}

int64_t Coordinator::BaseShardAt(const JobEntry& job, int64_t position) {
  const auto end = job.shards.begin() + job.base_shards;
  auto it = std::upper_bound(job.shards.begin(), end, position,
                             [](int64_t p, const Shard& s) { return p < s.begin; });
  if (it == job.shards.begin()) return -1;
  --it;
  return position < it->end ? static_cast<int64_t>(it - job.shards.begin()) : -1;
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
  const std::string& compile = request.compile();
  if (!compile.empty() && compile != "on" && compile != "off") {
    return absl::InvalidArgumentError("ResolveLayout: compile must be on or off");
  }
  if (layout.empty() && decode.empty() && compile.empty()) {
    return absl::InvalidArgumentError("ResolveLayout: nothing proposed");
  }
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
  if (!compile.empty() && spec->compile_resolved().empty()) {
    updated.set_compile_resolved(compile);
    *updated.mutable_compile_trial() = request.compile_trial();
    Log("job ", request.job_id(), ": --compile ", compile == "on" ? "kept" : "declined", " (worker ",
        request.worker_id(), "'s trial: eager ", absl::StrFormat("%.2f", request.compile_trial().eager_ms()),
        " ms, compiled ", absl::StrFormat("%.2f", request.compile_trial().compiled_ms()), " ms a batch)");
  }
  if (updated.channels_last_resolved() != spec->channels_last_resolved() ||
      updated.decode_resolved() != spec->decode_resolved() ||
      updated.compile_resolved() != spec->compile_resolved()) {
    RETURN_IF_ERROR(store_->UpdateSpec(request.job_id(), updated));
    *spec = std::move(updated);
  }
  v1::ResolveLayoutResponse response;
  if (!layout.empty()) response.set_channels_last(spec->channels_last_resolved());
  if (!decode.empty()) response.set_decode(spec->decode_resolved());
  if (!compile.empty()) response.set_compile(spec->compile_resolved());
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
    if (request.shard_id() == kCanaryShard) {
      auto c = job.canaries.find(request.worker_id());
      if (c != job.canaries.end() && c->second.lease_id == request.lease_id() && c->second.completed == 0) {
        Log("worker ", request.worker_id(), " gave back its canary of job ", request.job_id(), ": ", request.reason());
        job.canaries.erase(c);
      }
      return absl::OkStatus();
    }
    if (request.shard_id() < 0 || request.shard_id() >= static_cast<int64_t>(job.shards.size())) {
      return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), " has no shard ", request.shard_id()));
    }
    Shard& shard = job.shards[request.shard_id()];
    if (!shard.Holds(request.worker_id(), request.lease_id())) return absl::OkStatus();
    Log("worker ", request.worker_id(), " released shard ", request.shard_id(), " of job ", request.job_id(), ": ",
        request.reason());
    const bool copy = shard.spec_worker_id == request.worker_id();
    if (request.isolate_rows() && shard.end - shard.begin > 1 && !IsTerminal(job.record.job.state()) && !copy &&
        shard.spec_worker_id.empty()) {
      wit->second.leases.erase({request.job_id(), request.shard_id()});
      shard.phase = ShardPhase::kPending;
      shard.worker_id.clear();
      counters_.shards_retried += SplitShardLocked(&job, request.shard_id());
    } else {
      ReleaseShardLocked(&job, request.shard_id(), request.reason(), !request.not_started(), &deferred,
                         &request.worker_id());
    }
  }
  Apply(deferred);
  return absl::OkStatus();
}

void Coordinator::ExpireLeases() {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const double now = Now();
    for (auto it = workers_.begin(); it != workers_.end();) {
      WorkerEntry& w = it->second;
      const double silent = now - w.last_seen;
      if (w.restored && silent > options_.lease_seconds) {
        // Handed over by the previous tallyd and not back: the restart ended its leases, not its rows.
        Log("worker ", it->first, " (", w.info.name(), ") did not come back after the restart: its ",
            w.leases.size(), " shard(s) go back to the queue");
        ReleaseWorkerLeasesLocked(&w, it->first, "", "its worker did not come back after a restart", false, &deferred);
        it = workers_.erase(it);
        continue;
      }
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
        const double quiet = now - std::max(s.LeaseOf(it->first).second, w.last_progress);
        if (quiet > BatchTimeout(job) + options_.lease_seconds) stuck.emplace_back(job_id, shard_id);
      }
      counters_.shards_expired += static_cast<int64_t>(stuck.size());
      for (const auto& [job_id, shard_id] : stuck) {
        JobEntry* job = jobs_.at(job_id).get();
        ReleaseShardLocked(job, shard_id,
                           absl::StrCat("worker ", it->first, " (", w.info.name(), ") made no progress for ",
                                        absl::StrFormat("%.0f", BatchTimeout(*job) + options_.lease_seconds), " s"),
                           true, &deferred, &it->first, /*with_worker=*/true);
      }
      ++it;
    }
    // Jobs whose rows are all in, waiting for canaries under way (CanariesUnderWayLocked): done once
    // those end, their workers are gone or the wait is over.
    for (auto& [job_id, job] : jobs_) {
      if (job->rows_done_at > 0) MaybeCompleteLocked(job.get());
    }
  }
  Apply(deferred);
}

void Coordinator::ReleaseShardLocked(JobEntry* job, int64_t shard_id, const std::string& why, bool count_attempt,
                                     Deferred* deferred, const std::string* who, bool with_worker) {
  if (shard_id == kCanaryShard) {  // A canary given back unfinished: the worker gets it again later.
    if (who != nullptr) job->canaries.erase(*who);
    return;
  }
  Shard& s = job->shards[shard_id];
  if (s.phase != ShardPhase::kLeased) return;
  const std::string& job_id = job->record.job.job_id();
  if (!s.spec_worker_id.empty() && who != nullptr && *who == s.spec_worker_id) {
    // The speculative copy ends; the lease goes on.
    Log("speculative copy of shard ", shard_id, " of job ", job_id, " ended: ", why);
    if (auto w = workers_.find(s.spec_worker_id); w != workers_.end()) w->second.leases.erase({job_id, shard_id});
    s.spec_worker_id.clear();
    s.spec_lease_id = 0;
    return;
  }
  if (who != nullptr && *who != s.worker_id) return;  // Not this worker's lease (any more).
  auto wit = workers_.find(s.worker_id);
  if (wit != workers_.end()) wit->second.leases.erase({job_id, shard_id});
  if (!s.spec_worker_id.empty()) {
    // Its speculative copy carries on as the lease: no retry, no attempt counted.
    Log("shard ", shard_id, " of job ", job_id, ": ", why, "; its speculative copy on ", s.spec_worker_id,
        " goes on as the lease");
    s.worker_id = s.spec_worker_id;
    s.lease_id = s.spec_lease_id;
    s.lease_unix = s.spec_lease_unix;
    s.spec_worker_id.clear();
    s.spec_lease_id = 0;
    return;
  }
  s.worker_id.clear();
  s.lease_id = 0;
  if (!count_attempt) s.attempts = std::max(0, s.attempts - 1);
  if (IsTerminal(job->record.job.state())) {
    s.phase = ShardPhase::kPending;
    return;
  }
  if (job->stopped_early) {  // --until-ci was reached: its rows are left out with the rest.
    DropShardLocked(job, shard_id, deferred);
    MaybeCompleteLocked(job);
    return;
  }
  const bool single = s.end - s.begin == 1;
  if (count_attempt && single && s.attempts >= options_.max_shard_attempts) {
    Log("row ", s.begin, " of job ", job_id, " lost ", s.attempts, " times (", why, "); failing it");
    deferred->poisoned.emplace_back(job_id, shard_id);  // Stays leased to nobody until failed.
    return;
  }
  // Lost with its worker (it died or hung), which one of its rows may have caused: the rows not yet
  // committed are tried alone from now on, each on a worker holding nothing else, so a row that
  // crashes workers fails at its --max-shard-attempts-th loss, naming itself, and its neighbours
  // are evaluated. Other losses split the shard once it was lost --max-shard-attempts times.
  if (count_attempt && !single && (with_worker || s.attempts >= options_.max_shard_attempts)) {
    Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job_id, " lost",
        with_worker ? "" : absl::StrCat(" ", s.attempts, " times"), " (", why, "); its rows are tried one at a time",
        with_worker ? ", each alone on its worker" : "");
    s.phase = ShardPhase::kPending;
    counters_.shards_retried += SplitShardLocked(job, shard_id, /*suspect=*/with_worker);
    return;
  }
  if (count_attempt && with_worker) s.suspect = true;
  Log("shard ", shard_id, " [", s.begin, ", ", s.end, ") of job ", job_id, " queued again: ", why);
  counters_.shards_retried++;
  s.phase = ShardPhase::kPending;
  job->pending.push_front(shard_id);
  NoteWorkLocked();
}

bool Coordinator::HoldsSuspectLocked(const WorkerEntry& worker) const {
  for (const auto& [job_id, shard_id] : worker.leases) {
    auto jit = jobs_.find(job_id);
    if (jit != jobs_.end() && jit->second->shards[shard_id].suspect) return true;
  }
  return false;
}

int64_t Coordinator::SplitShardLocked(JobEntry* job, int64_t shard_id, bool suspect) {
  job->pending.erase(std::remove(job->pending.begin(), job->pending.end(), shard_id), job->pending.end());
  const int64_t begin = job->shards[shard_id].begin, end = job->shards[shard_id].end;
  std::vector<int64_t> children;
  for (int64_t i = begin; i < end; ++i) {  // Positions; the ledger's rows by manifest index.
    const int64_t index = job->order.IndexAt(i);
    if (job->committed_rows[index]) continue;
    Shard child;
    child.begin = i;
    child.end = i + 1;
    child.suspect = suspect;
    child.attempts = suspect ? job->shards[shard_id].attempts : 0;
    job->row_shard[index] = static_cast<int64_t>(job->shards.size());
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
  return static_cast<int64_t>(children.size());
}

void Coordinator::FailPoisonedRow(const std::string& job_id, int64_t shard_id) {
  int64_t index = 0;
  int attempts = 0;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) return;
    const Shard& s = jit->second->shards[shard_id];
    index = jit->second->order.IndexAt(s.begin);
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

}  // namespace tally
