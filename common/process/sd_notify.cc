#include "common/process/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"

namespace tally {

bool SdNotify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) return false;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // Abstract namespace.
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  const bool ok = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                         addr_len) == static_cast<ssize_t>(state.size());
  close(fd);
  return ok;
}

double SdWatchdogInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* pid = std::getenv("WATCHDOG_PID");
  int64_t micros = 0, for_pid = 0;
  if (usec == nullptr || !absl::SimpleAtoi(usec, &micros) || micros <= 0) return 0;
  if (pid != nullptr && absl::SimpleAtoi(pid, &for_pid) && for_pid != getpid()) return 0;
  return static_cast<double>(micros) / 2e6;
}

SdWatchdog::SdWatchdog() : interval_(SdWatchdogInterval()) {}

void SdWatchdog::Kick() {
  if (interval_ <= 0) return;
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  {
    absl::MutexLock lock(&mu_);
    if (now - last_ < interval_) return;
    last_ = now;
  }
  SdNotify("WATCHDOG=1");
}

}  // namespace tally
