#include "server/access/visibility.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally {

absl::StatusOr<v1::Job> VisibleJob(Coordinator* core, const Caller& caller, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = core->GetJob(job_id);
  if (job.ok() && !caller.CanSee(job->owner())) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job;
}

absl::StatusOr<std::string> ResolveVisibleJobId(Coordinator* core, const Caller& caller, const std::string& id) {
  if (VisibleJob(core, caller, id).ok()) return id;
  std::vector<std::string> matches;
  v1::ListJobsRequest request;
  request.set_limit(1000);
  const std::optional<std::string> owner = caller.sees_all ? std::nullopt : std::optional<std::string>(caller.name);
  while (!id.empty()) {
    absl::StatusOr<v1::ListJobsResponse> page = core->ListJobs(request, owner);
    if (!page.ok()) return page.status();
    for (const v1::Job& j : page->jobs()) {
      if (j.job_id().compare(0, id.size(), id) == 0) matches.push_back(j.job_id());
    }
    if (page->next_page_token().empty() || matches.size() > 5) break;
    request.set_page_token(page->next_page_token());
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (matches.size() > 5) matches.resize(5);
  return absl::InvalidArgumentError(
      absl::StrCat("job id prefix '", id, "' is ambiguous: ", absl::StrJoin(matches, ", "), ", ..."));
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

absl::StatusOr<v1::Follow> VisibleFollow(const FollowManager& follows, const Caller& caller, const std::string& follow_id) {
  absl::StatusOr<v1::Follow> f = follows.Get(follow_id);
  if (!f.ok() || !caller.CanSee(f->owner())) return absl::NotFoundError(absl::StrCat("no follow '", follow_id, "'"));
  return f;
}

v1::ListFollowsResponse VisibleFollows(const FollowManager& follows, const Caller& caller) {
  v1::ListFollowsResponse out;
  for (v1::Follow& f : follows.List()) {
    if (caller.CanSee(f.owner())) *out.add_follows() = std::move(f);
  }
  return out;
}

}  // namespace tally
