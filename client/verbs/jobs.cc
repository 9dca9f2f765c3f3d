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
  // Owners once tokens are in use (an admin sees everyone's jobs; others see their own).
  bool owners = false;
  for (const auto& job : page.jobs()) owners |= !job.owner().empty();
  std::cout << absl::StrFormat("%-28s %-10s %17s %7s  %-19s  %-19s  ", "JOB", "STATE", "DONE/TOTAL", "FAILED",
                               "CREATED (UTC)", "FINISHED (UTC)")
            << (owners ? absl::StrFormat("%-16s ", "OWNER") : "") << absl::StrFormat("%-20s %s\n", "NAME", "LABELS");
  for (const auto& job : page.jobs()) {
    std::vector<std::string> l;
    for (const auto& [k, v] : job.spec().labels()) l.push_back(absl::StrCat(k, "=", v));
    std::sort(l.begin(), l.end());
    std::cout << absl::StrFormat("%-28s %-10s %8d/%-8d %7d  %-19s  %-19s  ", job.job_id(), JobStateName(job.state()),
                                 job.images_evaluated() + job.images_failed(), job.images_total(), job.images_failed(),
                                 Time(job.created_unix()), Time(job.finished_unix()))
              << (owners ? absl::StrFormat("%-16s ", Clip(job.owner().empty() ? "-" : job.owner(), 16)) : "")
              << absl::StrFormat("%-20s %s\n", Clip(job.spec().name().empty() ? "-" : job.spec().name(), 20),
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

// A value as one shell word: as it is when plain, else in single quotes.
std::string ShellQuote(const std::string& v) {
  if (!v.empty() && v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,+") ==
                        std::string::npos) {
    return v;
  }
  std::string out = "'";
  for (char ch : v) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// The command for the next page: this one's connection, filters and page size, with the token.
std::string NextPageCommand(const JobsFlags& f, const std::string& token) {
  std::string cmd = "tally jobs";
  const ConnectionFlags& c = f.connection;
  for (const auto& [flag, value] : std::vector<std::pair<const char*, std::string>>{
           {"server", c.server}, {"tls-ca", c.tls_ca}, {"tls-cert", c.tls_cert}, {"tls-key", c.tls_key},
           {"tls-server-name", c.tls_server_name}, {"token-file", c.token_file}, {"state", f.state}}) {
    if (!value.empty()) absl::StrAppend(&cmd, " --", flag, " ", ShellQuote(value));
  }
  for (const std::string& label : f.labels) absl::StrAppend(&cmd, " --label ", ShellQuote(label));
  if (f.limit != 20) absl::StrAppend(&cmd, " --limit ", f.limit);
  absl::StrAppend(&cmd, " --page-token ", token);
  return cmd;
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
  if (!page->next_page_token().empty()) std::cerr << "more: " << NextPageCommand(f, page->next_page_token()) << "\n";
  return 0;
}

}  // namespace tally
