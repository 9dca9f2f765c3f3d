// tally jobs: the caller's jobs, newest first, a page at a time, filtered by state and labels.
#include <algorithm>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/job_flags.h"
#include "client/verbs/verb_util.h"
#include "common/job/rpc.h"

namespace tally {
namespace {

std::string Time(double unix_seconds) {
  if (unix_seconds <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(static_cast<int64_t>(unix_seconds)),
                          absl::UTCTimeZone());
}

std::string Clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

void PrintJobsTable(const v1::ListJobsResponse& page) {
  std::cout << absl::StrFormat("%-28s %-10s %17s %7s  %-19s  %-19s  %-20s %s\n", "JOB", "STATE", "DONE/TOTAL",
                               "FAILED", "CREATED (UTC)", "FINISHED (UTC)", "NAME", "LABELS");
  for (const auto& job : page.jobs()) {
    std::vector<std::string> l;
    for (const auto& [k, v] : job.spec().labels()) l.push_back(absl::StrCat(k, "=", v));
    std::sort(l.begin(), l.end());
    std::cout << absl::StrFormat("%-28s %-10s %8d/%-8d %7d  %-19s  %-19s  %-20s %s\n", job.job_id(),
                                 JobStateName(job.state()), job.images_evaluated() + job.images_failed(),
                                 job.images_total(), job.images_failed(), Time(job.created_unix()),
                                 Time(job.finished_unix()), Clip(job.spec().name().empty() ? "-" : job.spec().name(), 20),
                                 absl::StrJoin(l, ","));
    if (!job.sampled().empty()) std::cout << "  " << job.sampled() << "\n";
  }
}

// --state and --label into the listing's filter. Returns 0 or the exit code of the usage error.
int Filter(const JobsFlags& f, v1::ListJobsRequest* filter) {
  const std::string state = absl::AsciiStrToLower(f.state);
  if (!state.empty()) {
    const v1::JobState s = JobStateFromName(state);
    if (s == v1::JOB_STATE_UNSPECIFIED) {
      return UsageError("jobs",
                        absl::StrCat("--state: expected queued, running, succeeded, failed or cancelled, got '", state, "'"));
    }
    filter->set_state(s);
  }
  if (absl::Status s = ParsePairs("label", f.labels, filter->mutable_labels()); !s.ok()) {
    return UsageError("jobs", std::string(s.message()));
  }
  return 0;
}

}  // namespace

int JobsVerb(const JobsFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  v1::ListJobsRequest filter;
  if (const int rc = Filter(f, &filter); rc != 0) return rc;
  auto page = (*client)->List(f.limit, f.page_token, filter);
  if (!page.ok()) return Finish(page.status());
  if (f.json) {
    std::cout << ToJson(*page) << "\n";
    return 0;
  }
  PrintJobsTable(*page);
  if (!page->next_page_token().empty()) std::cerr << "more: tally jobs --page-token " << page->next_page_token() << "\n";
  return 0;
}

}  // namespace tally
