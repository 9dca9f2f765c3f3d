// tally merge JOB JOB... --out DIR: one report over several finished jobs' rows, in the order given.
#include <iostream>

#include "client/verbs/verb_util.h"

namespace tally {

int MergeVerb(const JobVerbFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  if (f.jobs.empty()) return UsageError("merge", "tally merge needs a job id");
  if (f.jobs.size() < 2) return UsageError("merge", "tally merge needs two job ids or more");
  if (f.out.empty()) return UsageError("merge", "tally merge needs --out DIR");
  auto ids = ResolveJobIds(**client, f.jobs);
  if (!ids.ok()) return Finish(ids.status());
  auto files = (*client)->MergeReports(*ids, f.out);
  if (!files.ok()) return Finish(files.status());
  for (const std::string& file : *files) std::cout << file << "\n";
  return 0;
}

}  // namespace tally
