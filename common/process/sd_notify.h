// systemd's readiness and watchdog protocol (sd_notify(3)), without libsystemd: a datagram to the
// socket named by $NOTIFY_SOCKET. Both daemons run as Type=notify units (deploy/): READY=1 once
// they serve, STOPPING=1 when asked to stop, and WATCHDOG=1 from their main loop at half the unit's
// WatchdogSec, so systemd restarts a process that hangs. Outside systemd every call does nothing.
#ifndef TALLY_COMMON_PROCESS_SD_NOTIFY_H_
#define TALLY_COMMON_PROCESS_SD_NOTIFY_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tally {

// Sends `state` ("READY=1", "STATUS=...", ...); false when there is no socket or it failed.
bool SdNotify(const std::string& state);
// How often to send WATCHDOG=1 ($WATCHDOG_USEC / 2, for this process), in seconds; 0: no watchdog.
double SdWatchdogInterval();

// Sends WATCHDOG=1 at most every SdWatchdogInterval(); call it from the loop whose progress proves
// the process alive. Thread-safe.
class SdWatchdog {
 public:
  SdWatchdog();
  void Kick() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const double interval_;
  absl::Mutex mu_;
  double last_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_SD_NOTIFY_H_
