#include "metrics/overlap.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Ratio(double num, double den) { return den == 0 ? kNaN : num / den; }

}  // namespace

double Dice(const ConfusionCounts& c) {
  return Ratio(2.0 * static_cast<double>(c.tp), 2.0 * static_cast<double>(c.tp) +
                                                     static_cast<double>(c.fp) + static_cast<double>(c.fn));
}

double Iou(const ConfusionCounts& c) {
  return Ratio(static_cast<double>(c.tp),
               static_cast<double>(c.tp) + static_cast<double>(c.fp) + static_cast<double>(c.fn));
}

double CountMetric(Metric m, const ConfusionCounts& c) {
  const double tp = static_cast<double>(c.tp), fp = static_cast<double>(c.fp);
  const double fn = static_cast<double>(c.fn), tn = static_cast<double>(c.tn);
  switch (m) {
    case Metric::kDice: return Dice(c);
    case Metric::kIou: return Iou(c);
    case Metric::kPrecision: return Ratio(tp, tp + fp);
    case Metric::kRecall: return Ratio(tp, tp + fn);
    case Metric::kSpecificity: return Ratio(tn, tn + fp);
    case Metric::kAccuracy: return Ratio(tp + tn, tp + tn + fp + fn);
    default: return kNaN;
  }
}

absl::string_view EmptyScoreName(EmptyScore e) { return e == EmptyScore::kOne ? "one" : "nan"; }

absl::StatusOr<EmptyScore> ParseEmptyScore(absl::string_view name) {
  if (name.empty() || name == "nan") return EmptyScore::kNaN;
  if (name == "one") return EmptyScore::kOne;
  return absl::InvalidArgumentError(absl::StrCat("empty_score '", name, "' is not nan or one"));
}

double CountMetricWithEmpty(Metric m, const ConfusionCounts& c, EmptyScore empty) {
  if (empty == EmptyScore::kOne && (m == Metric::kDice || m == Metric::kIou) && c.tp + c.fp + c.fn == 0) return 1.0;
  return CountMetric(m, c);
}

}  // namespace tally
