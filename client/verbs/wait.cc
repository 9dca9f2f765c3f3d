// tally wait JOB...: until every job has ended (and its report is ready), or --timeout. The exit
// code is the worst of the jobs' (failed > cancelled > too many failed rows > succeeded).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/verbs/verb_util.h"
#include "common/job/rpc.h"

namespace tally {
namespace {

int Rank(int code) {
  return code == kExitFailed ? 3 : code == kExitCancelled ? 2 : code == kExitTooManyFailedRows ? 1 : 0;
}

}  // namespace

int WaitVerb(const JobVerbFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  if (f.jobs.empty()) return UsageError("wait", "tally wait needs a job id");
  const absl::Time deadline = f.timeout > 0 ? absl::Now() + absl::Seconds(f.timeout) : absl::InfiniteFuture();
  // tallyd restarting (connection refused, UNAVAILABLE) is ridden through from the first call on:
  // its jobs resume where they were.
  std::vector<std::string> pending;
  if (int code = ResolveJobIdsPatiently(**client, f, "wait", &pending); code != kExitSucceeded) return code;
  int worst = kExitSucceeded;
  absl::Time unreachable_since = absl::InfiniteFuture();
  while (!pending.empty()) {
    std::vector<std::string> still;
    bool unreachable = false;
    for (const std::string& id : pending) {
      auto job = (*client)->Get(id);
      if (absl::IsUnavailable(job.status())) {
        unreachable = true;
        still.push_back(id);
        continue;
      }
      if (!job.ok()) return Finish(job.status());
      if (!IsTerminal(job->state()) || !job->report_ready()) {
        still.push_back(id);
        continue;
      }
      if (f.json) {
        std::cout << ToJson(*job) << std::endl;
      } else {
        PrintJob(*job);
      }
      if (Rank(JobExitCode(*job)) > Rank(worst)) worst = JobExitCode(*job);
    }
    pending = std::move(still);
    if (pending.empty()) break;
    if (unreachable && unreachable_since == absl::InfiniteFuture()) {
      unreachable_since = absl::Now();
      std::cerr << "tally wait: the coordinator is not answering (restarting?); waiting for it\n";
    } else if (!unreachable) {
      unreachable_since = absl::InfiniteFuture();
    }
    if (unreachable && f.timeout <= 0 && absl::Now() - unreachable_since > absl::Seconds(kUnreachableSeconds)) {
      return Finish(absl::UnavailableError(absl::StrCat("the coordinator has not answered for ", kUnreachableSeconds,
                                                        " s")));
    }
    if (absl::Now() >= deadline) {
      std::cerr << "tally wait: timed out after " << f.timeout << " s; still running: " << absl::StrJoin(pending, ", ")
                << "\n";
      return kExitTimedOut;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  return worst;
}

}  // namespace tally
