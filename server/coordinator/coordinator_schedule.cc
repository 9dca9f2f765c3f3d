// Coordinator: which job a worker leases from when several have rows left (README "Operating
// tallyd"). Workers, not leases, are shared: a worker runs one model at a time and switching costs a
// model load, so a worker stays on its job unless another job is further below its share.
//
//   1. Owners (token names) with rows to lease share the workers in service by weight
//      (--share-weight NAME=W, default 1): owner o's target is workers x w(o) / sum of weights.
//   2. Within an owner, only the jobs of its highest --priority take workers; they share the
//      owner's target equally.
//   3. A worker asking for a shard goes to the job whose deficit (target minus the workers on it,
//      not counting this one) is largest, owners first; it stays on its current job at an equal
//      deficit, and moves to a job with no worker at an equal deficit only after
//      share_quantum_seconds on its current one (one worker, two jobs: each in turn).
//
// Scheduling decides only who evaluates which rows, never a row's result: reports are the same
// whatever the order of leases.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/rpc.h"
#include "server/coordinator/coordinator.h"

namespace tally {
namespace {

constexpr double kEps = 1e-9;

struct Candidate {
  std::string job_id;
  std::string owner;
  int priority = 0;
  size_t age = 0;             // Submission order: smaller is older.
  double owner_deficit = 0;   // The owner's target minus its workers (this worker not counted).
  double job_deficit = 0;     // The job's share of its owner's target minus its workers.
  int workers = 0;            // On the job now (this worker not counted).
};

// Better first: owner deficit, the job's priority, its deficit, then age.
bool Before(const Candidate& a, const Candidate& b) {
  if (std::abs(a.owner_deficit - b.owner_deficit) > kEps) return a.owner_deficit > b.owner_deficit;
  if (a.owner != b.owner) return a.age < b.age;
  if (a.priority != b.priority) return a.priority > b.priority;
  if (std::abs(a.job_deficit - b.job_deficit) > kEps) return a.job_deficit > b.job_deficit;
  return a.age < b.age;
}

}  // namespace

double Coordinator::OwnerWeight(const std::string& owner) const {
  auto it = options_.owner_weights.find(owner);
  return it == options_.owner_weights.end() || !(it->second > 0) ? 1.0 : it->second;
}

bool Coordinator::WantsWorkersLocked(const JobEntry& job) const {
  return !IsTerminal(job.record.job.state()) && !job.pending.empty();
}

std::map<std::string, int> Coordinator::WorkersOnJobsLocked(const std::string& except) const {
  std::map<std::string, int> on;
  for (const auto& [id, w] : workers_) {
    if (id == except || w.current_job.empty()) continue;
    auto jit = jobs_.find(w.current_job);
    if (jit == jobs_.end() || IsTerminal(jit->second->record.job.state())) continue;
    const JobEntry& job = *jit->second;
    bool holds = false;
    for (const auto& lease : w.leases) holds |= lease.first == w.current_job;
    if (holds || WantsWorkersLocked(job)) on[w.current_job]++;
  }
  return on;
}

std::vector<std::string> Coordinator::LeaseOrderLocked(const std::string& worker_id, const WorkerEntry& worker) const {
  return LeaseOrderLocked(worker_id, worker, WorkersOnJobsLocked(worker_id));
}

std::vector<std::string> Coordinator::LeaseOrderLocked(const std::string& worker_id, const WorkerEntry& worker,
                                                       const std::map<std::string, int>& on) const {
  // Owners with rows to lease: their weights, workers and their jobs' top priority.
  std::map<std::string, double> weight;
  std::map<std::string, int> owner_workers, top_priority, top_jobs;
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < job_order_.size(); ++i) {
    const JobEntry& job = *jobs_.at(job_order_[i]);
    if (!WantsWorkersLocked(job) || job.excluded_workers.count(worker_id)) continue;
    Candidate c;
    c.job_id = job_order_[i];
    c.owner = job.record.job.owner();
    c.priority = job.record.job.spec().priority();
    c.age = i;
    auto n = on.find(c.job_id);
    c.workers = n == on.end() ? 0 : n->second;
    if (!weight.count(c.owner)) {
      weight[c.owner] = OwnerWeight(c.owner);
      top_priority[c.owner] = c.priority;
    }
    top_priority[c.owner] = std::max(top_priority[c.owner], c.priority);
    candidates.push_back(c);
  }
  for (const auto& [job_id, n] : on) {
    const std::string& owner = jobs_.at(job_id)->record.job.owner();
    if (weight.count(owner)) owner_workers[owner] += n;
  }
  for (const Candidate& c : candidates) top_jobs[c.owner] += c.priority == top_priority[c.owner] ? 1 : 0;
  double total_weight = 0;
  for (const auto& [owner, w] : weight) total_weight += w;
  const double workers = static_cast<double>(workers_.size());
  for (Candidate& c : candidates) {
    const double owner_target = workers * weight[c.owner] / total_weight;
    c.owner_deficit = owner_target - owner_workers[c.owner];
    c.job_deficit = c.priority == top_priority[c.owner] ? owner_target / top_jobs[c.owner] - c.workers : -workers;
  }
  std::sort(candidates.begin(), candidates.end(), Before);
  // Stickiness: the worker stays on its current job unless the best is strictly further below its
  // share (or, at an equal share, has no worker while this one has had its quantum).
  auto current = std::find_if(candidates.begin(), candidates.end(),
                              [&](const Candidate& c) { return c.job_id == worker.current_job; });
  if (current != candidates.end() && current != candidates.begin()) {
    const Candidate& best = candidates.front();
    const bool same_owner = best.owner == current->owner;
    const double gain = same_owner ? (best.priority != current->priority ? 1.0 : best.job_deficit - current->job_deficit)
                                   : best.owner_deficit - current->owner_deficit;
    const bool turn = best.workers == 0 && Now() - worker.current_since >= options_.share_quantum_seconds;
    if (gain <= kEps && !turn) std::rotate(candidates.begin(), current, current + 1);
  }
  std::vector<std::string> order;
  order.reserve(candidates.size());
  for (const Candidate& c : candidates) order.push_back(c.job_id);
  return order;
}

void Coordinator::FillScheduleLocked(const JobEntry& job, v1::Job* out) const {
  if (IsTerminal(job.record.job.state())) return;
  const std::map<std::string, int> on = WorkersOnJobsLocked();
  auto n = on.find(job.record.job.job_id());
  const int assigned = n == on.end() ? 0 : n->second;
  out->set_workers_assigned(assigned);
  out->set_running_share(workers_.empty() ? 0.0 : static_cast<double>(assigned) / workers_.size());
  if (draining_) {
    out->set_waiting("tallyd is restarting: leases resume when it is back");
    return;
  }
  if (!WantsWorkersLocked(job) || assigned > 0) return;
  // Its place among the jobs that wait for a worker, in the order a free worker would take them.
  int position = 0;
  for (const std::string& id : LeaseOrderLocked("", WorkerEntry(), on)) {
    if (on.count(id)) continue;
    ++position;
    if (id == job.record.job.job_id()) break;
  }
  out->set_queue_position(position);
  int eligible = 0;
  for (const auto& [id, w] : workers_) eligible += job.excluded_workers.count(id) ? 0 : 1;
  if (workers_.empty()) {
    out->set_waiting("no worker in service yet: workers join with tally-worker --coordinator ADDRESS, or tallyd --spawn-workers");
  } else if (eligible == 0) {
    out->set_waiting("every worker in service refused this job's model (see the job's warnings)");
  } else {
    std::string others;
    for (const auto& [id, count] : on) absl::StrAppend(&others, others.empty() ? "" : ", ", id, " ", count);
    out->set_waiting(absl::StrCat("waiting for a worker (position ", position, "): ", workers_.size(),
                                  " in service, on other jobs at their fair share (", others,
                                  "); one moves here when its shards are in"));
  }
}

}  // namespace tally
