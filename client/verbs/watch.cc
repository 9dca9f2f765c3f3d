// tally watch JOB: progress until the job ends (NDJSON with --json); the exit code says how it ended.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/progress.h"
#include "client/verbs/verb_util.h"

namespace tally {

int WatchVerb(const JobVerbFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  if (f.jobs.empty()) return UsageError("watch", "tally watch needs a job id");
  if (f.jobs.size() > 1) return UsageError("watch", "tally watch takes one job id");
  auto id = ResolveJobId(**client, f.jobs[0]);
  if (!id.ok()) return Finish(id.status());
  const absl::Time deadline = f.timeout > 0 ? absl::Now() + absl::Seconds(f.timeout) : absl::InfiniteFuture();
  bool timed_out = false;
  ProgressPrinter progress;
  auto job = (*client)->Watch(
      *id, 500,
      [&](const v1::Job& j) {
        if (f.json) {
          std::cout << ToJson(j) << std::endl;  // One object per line (NDJSON).
        } else {
          progress.Update(j);
        }
      },
      [&] {
        timed_out = absl::Now() >= deadline;
        return !timed_out;
      },
      [&](const std::string& why) { progress.Note("tally watch: lost the coordinator (" + why + "); reconnecting"); });
  if (timed_out) {
    std::cerr << "tally watch: timed out after " << f.timeout << " s; the job goes on\n";
    return kExitTimedOut;
  }
  if (!job.ok()) return Finish(job.status());
  if (!f.json) {
    progress.Done(*job);
    PrintJob(*job);
  }
  return JobExitCode(*job);
}

}  // namespace tally
