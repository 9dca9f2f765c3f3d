#include "client/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "base/clock.h"
#include "base/log.h"
#include "common/job/rpc.h"

namespace tally {

std::string WithInterval(double mean, double low, double high, int digits) {
  if (std::isnan(low) || std::isnan(high)) return absl::StrFormat("%.*f", digits, mean);
  return absl::StrFormat("%.*f [%.*f, %.*f]", digits, mean, digits, low, digits, high);
}

std::string FormatDuration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

ProgressPrinter::ProgressPrinter() : tty_(isatty(STDERR_FILENO) != 0) {}

std::string ProgressPrinter::Line(const v1::Job& job) const {
  const int64_t done = job.images_evaluated() + job.images_failed();
  // A sampled job's bar runs to its sample.
  const int64_t total = job.images_planned() > 0 && !IsTerminal(job.state()) ? job.images_planned() : job.images_total();
  const double frac = total > 0 ? static_cast<double>(done) / total : 1.0;
  std::string line;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    line = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
  }
  absl::StrAppend(&line, done, "/", total, " images (", static_cast<int>(frac * 100), "%)");
  absl::StrAppend(&line, absl::StrFormat("  %.1f img/s", job.images_per_second()));
  // A job that has ended says how, not "ETA 0s  0 workers" (its workers have let go of it).
  const bool ended = IsTerminal(job.state());
  if (!ended) absl::StrAppend(&line, "  ETA ", job.eta_seconds() >= 0 ? FormatDuration(job.eta_seconds()) : "?");
  if (job.images_failed() > 0) absl::StrAppend(&line, "  ", job.images_failed(), " failed");
  if (job.images_held() > 0) absl::StrAppend(&line, "  ", job.images_held(), " evaluated, held until the layout trial ends");
  if (ended) {
    absl::StrAppend(&line, "  ", JobStateName(job.state()));
  } else {
    absl::StrAppend(&line, "  ", job.workers_active(), " worker", job.workers_active() == 1 ? "" : "s");
  }
  if (!ended && !job.waiting().empty()) {
    absl::StrAppend(&line, "  (", job.waiting(), ")");
  } else if (job.state() == v1::JOB_STATE_QUEUED) {
    line += "  (starting)";
  }
  if (!job.stalled().empty()) absl::StrAppend(&line, "  ", job.stalled());
  // Live estimates of the foreground classes (a few; `tally status` lists them all).
  if (!ended) {
    int shown = 0;
    for (const v1::LiveEstimate& e : job.live()) {
      if (!e.foreground()) continue;
      if (shown++ == 3) {
        line += " ...";
        break;
      }
      absl::StrAppend(&line, shown == 1 ? "  dice " : ", ", e.class_id(), ": ",
                      WithInterval(e.dice_mean(), e.dice_ci_low(), e.dice_ci_high(), 3));
    }
  }
  if (!job.sampled().empty()) absl::StrAppend(&line, "  (", job.sampled(), ")");
  return line;
}

void ProgressPrinter::Update(const v1::Job& job) {
  const double now = NowUnix();
  const int64_t done = job.images_evaluated() + job.images_failed();
  if (tty_) {
    if (now - last_print_ < 0.1 && done != job.images_total()) return;
    std::fprintf(stderr, "\r\033[K%s", Line(job).c_str());
    std::fflush(stderr);
    bar_shown_ = true;
  } else {
    const bool stall_changed = job.stalled() != last_stalled_ || (job.images_held() > 0) != last_held_;
    if (now - last_print_ < 5.0 && !(last_done_ < 0) && !stall_changed) return;
    if (done == last_done_ && now - last_print_ < 30.0 && !stall_changed) return;
    std::fprintf(stderr, "%s\n", Line(job).c_str());
    last_done_ = done;
    last_stalled_ = job.stalled();
    last_held_ = job.images_held() > 0;
  }
  last_print_ = now;
}

void ProgressPrinter::Note(const std::string& message) {
  if (tty_ && bar_shown_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", message.c_str());
  bar_shown_ = false;
}

void ProgressPrinter::Done(const v1::Job& job) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s\n", Line(job).c_str());
  } else if (job.images_evaluated() + job.images_failed() != last_done_) {
    std::fprintf(stderr, "%s\n", Line(job).c_str());
  }
  bar_shown_ = false;
}

}  // namespace tally
