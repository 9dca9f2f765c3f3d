// Coordinator: the worker registry: registration, heartbeats (leases renewed, gauges kept),
// listing, model errors reported by workers, and taking a worker out of service.
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

absl::Status Coordinator::ReportJobError(const v1::ReportJobErrorRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(request.worker_id());
    if (wit != workers_.end()) wit->second.last_seen = Now();
    auto jit = jobs_.find(request.job_id());
    if (request.worker_local()) {
      RetireWorkerLocked(request.worker_id(), request.message(), request.job_id(), &deferred);
    } else if (request.model_mismatch()) {
      if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state())) {
        RecordModelMismatchLocked(jit->second.get(), request, &deferred);
      }
    } else if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state())) {
      RecordModelErrorLocked(jit->second.get(), request, &deferred);
    }
  }
  Apply(deferred);
  return absl::OkStatus();
}

void Coordinator::RecordModelMismatchLocked(JobEntry* job, const v1::ReportJobErrorRequest& request,
                                            Deferred* deferred) {
  Log("job ", request.job_id(), ": worker ", request.worker_id(), " refuses it: ", request.message());
  job->excluded_workers.insert(request.worker_id());
  v1::JobSpec* spec = job->record.job.mutable_spec();
  if (std::find(spec->run_warnings().begin(), spec->run_warnings().end(), request.message()) ==
      spec->run_warnings().end()) {
    spec->add_run_warnings(request.message());
    deferred->spec_updates.emplace_back(request.job_id(), *spec);
  }
  bool nobody_left = true;
  for (const auto& [id, w] : workers_) nobody_left &= job->excluded_workers.count(id) > 0;
  if (nobody_left) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 absl::StrCat("no worker in service has the job's model file: ", request.message()), deferred);
    return;
  }
  auto wit = workers_.find(request.worker_id());
  if (wit != workers_.end()) {
    ReleaseWorkerLeasesLocked(&wit->second, request.worker_id(), request.job_id(),
                              absl::StrCat("worker refused the job: ", request.message()), false, deferred);
  }
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
    worker.restored = false;
    worker.gauges = request.gauges();
    std::set<int64_t> listed;
    for (const v1::HeldLease& held : request.leases()) {
      listed.insert(held.lease_id());
      bool valid = false;
      auto jit = jobs_.find(held.job_id());
      if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state()) && held.shard_id() == kCanaryShard) {
        auto c = jit->second->canaries.find(request.worker_id());
        valid = c != jit->second->canaries.end() && c->second.lease_id == held.lease_id() && c->second.completed == 0;
      } else if (jit != jobs_.end() && !IsTerminal(jit->second->record.job.state()) && held.shard_id() >= 0 &&
          held.shard_id() < static_cast<int64_t>(jit->second->shards.size())) {
        const Shard& s = jit->second->shards[held.shard_id()];
        valid = s.Holds(request.worker_id(), held.lease_id());
      }
      if (!valid) *response.add_revoked() = held;
    }
    // Leases granted a lease period ago that the worker no longer lists were lost on its side
    // (an assignment it could not parse, results it dropped): they end here.
    std::vector<std::pair<std::string, int64_t>> lost;
    for (const auto& [job_id, shard_id] : worker.leases) {
      const auto [lease_id, lease_unix] = jobs_.at(job_id)->shards[shard_id].LeaseOf(request.worker_id());
      if (!listed.count(lease_id) && now - lease_unix > options_.lease_seconds) lost.emplace_back(job_id, shard_id);
    }
    for (const auto& [job_id, shard_id] : lost) {
      JobEntry* job = jobs_.at(job_id).get();
      // A lease handed over across a restart that the worker does not hold (the handoff was saved
      // before the worker let it go): the restart's doing, no attempt counted.
      const bool restored = job->shards[shard_id].restored;
      ReleaseShardLocked(job, shard_id, absl::StrCat("worker ", request.worker_id(), " no longer holds its lease"),
                         !restored, &deferred, &request.worker_id());
    }
  }
  Apply(deferred);
  return response;
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
    // Counted here only for a worker that went silent: lost with it.
    ReleaseShardLocked(jit->second.get(), shard_id, why, count_attempt, deferred, &worker_id,
                       /*with_worker=*/count_attempt);
  }
}

void Coordinator::RetireWorkerLocked(const std::string& worker_id, const std::string& reason, const std::string& job_id,
                                     Deferred* deferred) {
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
  info.set_reason_job_id(job_id);
  info.set_registered_unix(w.registered);
  info.set_last_seen_unix(w.last_seen);
  retired_.push_back(std::move(info));
  while (retired_.size() > 100) retired_.pop_front();
  workers_.erase(wit);
}

}  // namespace tally
