#include "server/access/visibility.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tally {

absl::StatusOr<v1::Job> VisibleJob(Coordinator* core, const Caller& caller, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = core->GetJob(job_id);
  if (job.ok() && !caller.CanSee(job->owner())) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job;
}

v1::ListWorkersResponse VisibleWorkers(Coordinator* core, const Caller& caller) {
  v1::ListWorkersResponse out = core->ListWorkers();
  if (caller.sees_all) return out;
  for (v1::WorkerInfo& w : *out.mutable_workers()) {
    std::vector<std::string> mine;
    for (const std::string& j : w.jobs()) {
      if (VisibleJob(core, caller, j).ok()) mine.push_back(j);
    }
    w.clear_jobs();
    for (std::string& j : mine) w.add_jobs(std::move(j));
    if (!w.gauges().job_id().empty() && !VisibleJob(core, caller, w.gauges().job_id()).ok()) {
      w.mutable_gauges()->clear_job_id();
      w.mutable_gauges()->clear_images_held();
    }
    if (!w.reason_job_id().empty() && !VisibleJob(core, caller, w.reason_job_id()).ok()) {
      w.clear_reason_job_id();
      w.set_reason("a problem with another owner's job on this host (an admin token shows it)");
    }
  }
  return out;
}

}  // namespace tally
