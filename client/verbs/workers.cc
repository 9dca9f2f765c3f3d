// tally workers: registered workers, and those out of service with the reason.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/verbs/verb_util.h"

namespace tally {

int WorkersVerb(const WorkersFlags& f) {
  auto client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  auto workers = (*client)->Workers();
  if (!workers.ok()) return Finish(workers.status());
  if (f.json) {
    std::cout << ToJson(*workers) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-14s %-16s %-8s %-15s %-20s %s\n", "WORKER", "NAME", "DEVICE", "STATE", "HOST:PID",
                               "JOBS");
  for (const auto& w : workers->workers()) {
    std::cout << absl::StrFormat("%-14s %-16s %-8s %-15s %-20s %s\n", w.worker_id(), w.name(), w.device(), w.state(),
                                 absl::StrCat(w.hostname(), ":", w.pid()), absl::StrJoin(w.jobs(), ","));
    if (!w.reason().empty()) std::cout << "  reason: " << w.reason() << "\n";
  }
  return 0;
}

}  // namespace tally
