// tally compare A B --out DIR: two runs of the same manifest, paired (server/report/compare.h).
#include <iostream>

#include "client/verbs/verb_util.h"

namespace tally {

int CompareVerb(const JobVerbFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  if (f.jobs.empty()) return UsageError("compare", "tally compare needs a job id");
  if (f.jobs.size() != 2) return UsageError("compare", "tally compare takes two job ids: A (the base) and B");
  if (f.out.empty()) return UsageError("compare", "tally compare needs --out DIR");
  auto ids = ResolveJobIds(**client, f.jobs);
  if (!ids.ok()) return Finish(ids.status());
  auto files = (*client)->CompareJobs((*ids)[0], (*ids)[1], f.out);
  if (!files.ok()) return Finish(files.status());
  for (const std::string& file : *files) std::cout << file << "\n";
  return 0;
}

}  // namespace tally
