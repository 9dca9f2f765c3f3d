// A follow's curve (tally follow): per checkpoint step, each metric's mean with its 95 % interval,
// the rows evaluated, the race's decision against the best so far, and the best step so far; written
// as curve.csv, curve.json and curve.html (each metric against the step with its interval as a
// band, inline SVG: no script, no CDN) in the follow's report folder.
#ifndef TALLY_SERVER_FOLLOW_FOLLOW_CURVE_H_
#define TALLY_SERVER_FOLLOW_FOLLOW_CURVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tally {

// One metric of a checkpoint's report (e.g. "dice_mean[1]"): its mean and 95 % interval (NaN
// where none).
struct CurveMetric {
  std::string name;
  double mean = 0;
  double lo = 0;
  double hi = 0;
};

struct CurvePoint {
  int64_t step = -1;
  std::string checkpoint;  // The file's name in the trainer's folder.
  std::string job;         // Its job's id ("" where it never ran).
  int64_t rows = 0;        // Rows evaluated.
  int64_t rows_total = 0;  // Rows of the manifest.
  // "best" (became the best), "not better", "worse" (decided by the race and stopped), "failed",
  // "gone", "skipped" (--catch-up newest passed it), "running".
  std::string decision;
  std::string reason;       // Why it failed, was skipped or is gone.
  int64_t best_step = -1;   // The best checkpoint's step once this one is decided.
  // The race against the best: rows paired and the interval of the mean difference (NaN: no race).
  int64_t race_rows = 0;
  double race_lo = 0;
  double race_hi = 0;
  std::vector<CurveMetric> metrics;
  // When the file landed (its modification time), was taken, and was decided (unix seconds; 0:
  // not yet). curve.json only.
  double landed_unix = 0;
  double taken_unix = 0;
  double decided_unix = 0;
};

struct FollowCurve {
  std::string follow;   // The follow's id.
  std::string folder;   // The trainer's folder.
  std::string metric;   // The one the race and "best" go by.
  std::vector<CurvePoint> points;  // By step.
};

// The three files' text.
std::string CurveCsv(const FollowCurve& curve);
std::string CurveJson(const FollowCurve& curve);
std::string CurveHtml(const FollowCurve& curve);
// The three files into `folder` (each written whole: a temporary file, then a rename).
absl::Status WriteCurveFiles(const FollowCurve& curve, const std::string& folder);

}  // namespace tally

#endif  // TALLY_SERVER_FOLLOW_FOLLOW_CURVE_H_
