// A plain fork-join over indices (the metrics library, common/coco/coco_json.cc parse of COCO results, the
// worker's concurrent result calls), for work whose result does not depend on how it is shared
// (each index writes only its own output).
#ifndef TALLY_METRICS_PARALLEL_FOR_H_
#define TALLY_METRICS_PARALLEL_FOR_H_

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace tally {

// The cores this process may run on (its CPU affinity: `taskset -c 0`, a container's cpuset), at
// least 1. std::thread::hardware_concurrency() counts the machine's, which on a one-core share of a
// 16-core box makes 16 threads take turns on one core.
inline int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

// Runs fn(k) for k in [0, n) on up to `threads` threads (this one included), each taking the next
// k as it frees up.
template <typename Fn>
void ParallelFor(size_t n, int threads, Fn fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < n; k = next++) fn(k);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace tally

#endif  // TALLY_METRICS_PARALLEL_FOR_H_
