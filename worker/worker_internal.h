// Internal to the worker (worker/worker*.cc).
#ifndef TALLY_WORKER_WORKER_INTERNAL_H_
#define TALLY_WORKER_WORKER_INTERNAL_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace tally {

// The deadline of an RPC made now that may take `seconds`.
inline std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

inline std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace tally

#endif  // TALLY_WORKER_WORKER_INTERNAL_H_
