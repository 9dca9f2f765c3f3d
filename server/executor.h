// A small pool of threads for blocking work that must not run on gRPC's callback threads
// (streaming a manifest into the database, deleting a job), as route_guide moves blocking work
// off its reactors. Tasks run in submission order on `threads` threads; the destructor finishes
// the queued tasks and joins.
#ifndef TALLY_SERVER_EXECUTOR_H_
#define TALLY_SERVER_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tally {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  void Schedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tally

#endif  // TALLY_SERVER_EXECUTOR_H_
