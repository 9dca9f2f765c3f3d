// tally status | cancel | delete | report JOB: one job, by id or unambiguous prefix.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/verbs/verb_util.h"

namespace tally {
namespace {

// Connects and resolves the one job id `verb` takes into `id`; returns 0 or the exit code.
int OneJob(const std::string& verb, const JobVerbFlags& f, std::unique_ptr<TallyClient>* client, std::string* id) {
  auto connected = Connect(f.connection);
  if (!connected.ok()) return Finish(connected.status());
  *client = *std::move(connected);
  if (f.jobs.empty()) return UsageError(verb, absl::StrCat("tally ", verb, " needs a job id"));
  if (f.jobs.size() > 1) return UsageError(verb, absl::StrCat("tally ", verb, " takes one job id"));
  auto resolved = ResolveJobId(**client, f.jobs[0]);
  if (!resolved.ok()) return Finish(resolved.status());
  *id = *resolved;
  return 0;
}

}  // namespace

int StatusVerb(const JobVerbFlags& f) {
  std::unique_ptr<TallyClient> client;
  std::string id;
  if (const int rc = OneJob("status", f, &client, &id); rc != 0) return rc;
  auto job = client->Get(id);
  if (!job.ok()) return Finish(job.status());
  if (f.json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    PrintJob(*job);
    if (!job->summary().empty()) std::cout << "\n" << job->summary();
  }
  return 0;
}

int CancelVerb(const JobVerbFlags& f) {
  std::unique_ptr<TallyClient> client;
  std::string id;
  if (const int rc = OneJob("cancel", f, &client, &id); rc != 0) return rc;
  auto job = client->Cancel(id);
  if (!job.ok()) return Finish(job.status());
  if (f.json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    PrintJob(*job);
  }
  return 0;
}

int DeleteVerb(const JobVerbFlags& f) {
  std::unique_ptr<TallyClient> client;
  std::string id;
  if (const int rc = OneJob("delete", f, &client, &id); rc != 0) return rc;
  if (absl::Status s = client->Delete(id); !s.ok()) return Finish(s);
  std::cout << "deleted " << id << "\n";
  return 0;
}

int ReportVerb(const JobVerbFlags& f) {
  std::unique_ptr<TallyClient> client;
  std::string id;
  if (const int rc = OneJob("report", f, &client, &id); rc != 0) return rc;
  if (f.out.empty()) return UsageError("report", "tally report needs --out DIR");
  auto files = client->FetchReport(id, f.out, f.partial);
  if (!f.partial && absl::IsFailedPrecondition(files.status())) {  // A job still running.
    return Finish(absl::FailedPreconditionError(absl::StrCat(
        files.status().message(), "; `tally report ", id, " --partial --out DIR` writes the rows done so far")));
  }
  if (!files.ok()) return Finish(files.status());
  for (const std::string& file : *files) std::cout << file << "\n";
  return 0;
}

}  // namespace tally
