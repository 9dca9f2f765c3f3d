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
  const absl::Time deadline = f.timeout > 0 ? absl::Now() + absl::Seconds(f.timeout) : absl::InfiniteFuture();
  // A tallyd that is restarting is waited for, as a watch already under way reconnects.
  std::vector<std::string> ids;
  if (int code = ResolveJobIdsPatiently(**client, f, "watch", &ids); code != kExitSucceeded) return code;
  const std::string* id = &ids[0];
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
  const int code = JobExitCode(*job);
  if (!f.json) {
    progress.Done(*job);
    PrintJob(*job);
    if (code == kExitTooManyFailedRows) {  // Why: the report's table, warnings and reasons.
      std::cout << job->summary();
      std::cerr << "tally watch: " << job->images_failed() << " of " << job->images_total()
                << " rows failed, more than --max-failed-fraction " << job->spec().max_failed_fraction()
                << " allows (exit code " << code << "); the reasons are above and in report.json 'failures'\n";
    }
  }
  return code;
}

}  // namespace tally
