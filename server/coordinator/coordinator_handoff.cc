// Coordinator: restarts nobody notices. A graceful stop drains (no new leases, results still taken)
// and hands the workers in service and their leases to the next tallyd on the same state folder
// (v1::Handoff in the database, also saved every few seconds while serving, so that a killed tallyd
// hands over too). The next tallyd restores them: a worker keeps its identity, its heartbeats and
// its finished results are accepted, and no row it evaluated is evaluated again. A worker that does
// not come back within a lease period loses its shards without an attempt counted (the restart,
// not the rows, ended them).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/job/rpc.h"
#include "server/coordinator/coordinator.h"

namespace tally {
namespace {

constexpr const char* kHandoffKey = "handoff";
// Lease ids the next tallyd skips after a handoff saved while serving: leases granted between the
// last save and a kill keep ids no new lease reuses.
constexpr int64_t kLeaseIdGap = 1'000'000;

}  // namespace

void Coordinator::BeginDrain() {
  absl::MutexLock lock(&mu_);
  if (draining_) return;
  draining_ = true;
  no_waiting_ = true;  // Long polls answer now (nothing to grant), and later ones at once.
  NoteWorkLocked();
}

int64_t Coordinator::LeasesOutstanding(bool spawned) {
  absl::MutexLock lock(&mu_);
  // A worker silent for two heartbeats has stopped (or is stopping) and delivers nothing more: the
  // drain does not wait for its shards, which the next tallyd restores for it if it comes back.
  const double heard = Now() - std::max(1.0, 2 * options_.heartbeat_seconds);
  int64_t n = 0;
  for (const auto& [id, w] : workers_) {
    if ((spawned || !w.info.spawned()) && w.last_seen >= heard) n += static_cast<int64_t>(w.leases.size());
  }
  return n;
}

absl::Status Coordinator::SaveHandoff(bool clean) {
  v1::Handoff handoff;
  {
    absl::MutexLock lock(&mu_);
    last_handoff_save_ = Now();
    handoff.set_next_lease_id(next_lease_id_);
    handoff.set_next_worker_seq(next_worker_seq_);
    handoff.set_saved_unix(Now());
    handoff.set_clean(clean);
    for (const auto& [id, w] : workers_) {
      if (w.info.spawned()) continue;  // Ends with this tallyd: nothing to wait for.
      v1::Handoff::Worker* out = handoff.add_workers();
      out->set_worker_id(id);
      *out->mutable_info() = w.info;
      out->set_registered_unix(w.registered);
      for (const auto& [job_id, shard_id] : w.leases) {
        const JobEntry& job = *jobs_.at(job_id);
        // The manifest's own shards only: single-row shards are made again by the next tallyd.
        if (shard_id < 0 || shard_id >= job.base_shards) continue;
        const Shard& s = job.shards[shard_id];
        if (s.worker_id != id) continue;  // A speculative copy: the lease itself is handed over.
        v1::Handoff::Lease* l = out->add_leases();
        l->set_job_id(job_id);
        l->set_shard_id(shard_id);
        l->set_lease_id(s.lease_id);
      }
    }
  }
  return store_->PutState(kHandoffKey, handoff.SerializeAsString());
}

absl::Status Coordinator::RestoreHandoff() {
  ASSIGN_OR_RETURN(std::optional<std::string> bytes, store_->GetState(kHandoffKey));
  if (!bytes.has_value()) return absl::OkStatus();
  v1::Handoff handoff;
  if (!handoff.ParseFromString(*bytes)) {
    Log("the previous tallyd's handoff cannot be read; workers register again");
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  const double now = Now();
  next_lease_id_ = std::max(next_lease_id_, handoff.next_lease_id() + (handoff.clean() ? 0 : kLeaseIdGap));
  next_worker_seq_ = std::max<int64_t>(next_worker_seq_, handoff.next_worker_seq());
  int64_t leases = 0;
  for (const v1::Handoff::Worker& saved : handoff.workers()) {
    RestoreWorkerLocked(saved, now);
    leases += static_cast<int64_t>(workers_[saved.worker_id()].leases.size());
  }
  if (handoff.workers_size() > 0) {
    Log("restored ", handoff.workers_size(), " worker(s) holding ", leases, " shard(s) from the previous tallyd (",
        handoff.clean() ? "stopped cleanly" : "saved while serving", "); they carry on where they were");
  }
  return absl::OkStatus();
}

void Coordinator::RestoreWorkerLocked(const v1::Handoff::Worker& saved, double now) {
  WorkerEntry& w = workers_[saved.worker_id()];
  w.info = saved.info();
  w.registered = saved.registered_unix();
  w.last_seen = w.last_progress = now;
  w.restored = true;
  for (const v1::Handoff::Lease& l : saved.leases()) {
    auto jit = jobs_.find(l.job_id());
    if (jit == jobs_.end() || IsTerminal(jit->second->record.job.state())) continue;
    JobEntry& job = *jit->second;
    if (l.shard_id() < 0 || l.shard_id() >= job.base_shards) continue;
    Shard& s = job.shards[l.shard_id()];
    auto pending = std::find(job.pending.begin(), job.pending.end(), l.shard_id());
    if (s.phase != ShardPhase::kPending || pending == job.pending.end()) continue;  // Done since.
    job.pending.erase(pending);
    s.phase = ShardPhase::kLeased;
    s.lease_id = l.lease_id();
    s.worker_id = saved.worker_id();
    s.lease_unix = now;
    s.restored = true;
    s.attempts = std::max(s.attempts, 1);
    w.leases.insert({l.job_id(), l.shard_id()});
    w.current_job = l.job_id();
    w.current_since = now;
    if (job.record.job.state() == v1::JOB_STATE_QUEUED) job.record.job.set_state(v1::JOB_STATE_RUNNING);
  }
}

}  // namespace tally
