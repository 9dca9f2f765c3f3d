// Minimal line logging to stderr ("2026-11-21T22:45:01.123Z tallyd: message"). Debian's Abseil
// 20220623 predates absl/log. Thread-safe: each line is one write(2).
#ifndef TALLY_BASE_LOG_H_
#define TALLY_BASE_LOG_H_

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"

namespace tally {

void SetLogName(absl::string_view name);
void LogLine(absl::string_view message);

template <typename... Args>
void Log(const Args&... args) {
  LogLine(absl::StrCat(args...));
}

}  // namespace tally

#endif  // TALLY_BASE_LOG_H_
