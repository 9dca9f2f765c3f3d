// tally submit: a job to tallyd; prints its id (or the Job with --json).
#include <iostream>

#include "client/job_flags.h"
#include "client/verbs/verb_util.h"

namespace tally {

int SubmitVerb(const SubmitFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  auto spec = SpecFromFlags(f.job);
  if (!spec.ok()) return UsageError("submit", std::string(spec.status().message()));
  auto job = (*client)->Submit(*spec);
  if (!job.ok()) return Finish(job.status());
  for (const std::string& w : job->spec().manifest_warnings()) std::cerr << "tally submit: warning: " << w << "\n";
  std::cout << (f.json ? ToJson(*job) : job->job_id()) << "\n";
  return 0;
}

}  // namespace tally
