#include "base/log.h"
#include "base/clock.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <string>

namespace tally {
namespace {
std::string& Name() {
  static std::string* name = new std::string("tally");
  return *name;
}
}  // namespace

void SetLogName(absl::string_view name) { Name() = std::string(name); }

void LogLine(absl::string_view message) {
  const double now = NowUnix();
  const std::time_t secs = static_cast<std::time_t>(now);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  const int millis = static_cast<int>((now - static_cast<double>(secs)) * 1000);
  char ms[8];
  std::snprintf(ms, sizeof(ms), ".%03dZ", millis);
  std::string line = absl::StrCat(stamp, ms, " ", Name(), ": ", message, "\n");
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace tally
