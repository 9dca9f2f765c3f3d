// Progress display for `tally run` and `tally watch`: a bar on a terminal (redrawn in place), or a
// line every few seconds when stderr is not a terminal (logs, CI).
#ifndef TALLY_CLIENT_PROGRESS_H_
#define TALLY_CLIENT_PROGRESS_H_

#include <string>

#include "proto/tally.pb.h"

namespace tally {

// "1:02:03", "4:05", "12s".
std::string FormatDuration(double seconds);
// "0.9542 [0.9123, 0.9781]": an estimate with its 95% interval (a betting interval: not symmetric),
// or the estimate alone where there is none (NaN: too few rows, or rows that are no random sample).
std::string WithInterval(double mean, double low, double high, int digits = 4);

class ProgressPrinter {
 public:
  ProgressPrinter();
  // Shows the job's progress; cheap to call often (output is throttled).
  void Update(const v1::Job& job);
  // Prints a message on its own line without garbling the bar.
  void Note(const std::string& message);
  // Final line.
  void Done(const v1::Job& job);

 private:
  std::string Line(const v1::Job& job) const;
  bool tty_;
  double last_print_ = 0;
  bool bar_shown_ = false;
  std::string last_stalled_;
  bool last_held_ = false;
  int64_t last_done_ = -1;
};

}  // namespace tally

#endif  // TALLY_CLIENT_PROGRESS_H_
