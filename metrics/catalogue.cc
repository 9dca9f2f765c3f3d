#include "metrics/catalogue.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tally {
absl::string_view MetricName(Metric m) {
  switch (m) {
    case Metric::kDice: return "dice";
    case Metric::kIou: return "iou";
    case Metric::kPrecision: return "precision";
    case Metric::kRecall: return "recall";
    case Metric::kSpecificity: return "specificity";
    case Metric::kAccuracy: return "accuracy";
    case Metric::kHd: return "hd";
    case Metric::kHd95: return "hd95";
    case Metric::kAssd: return "assd";
    case Metric::kNsd: return "nsd";
    case Metric::kLesionDice: return "lesion_dice";
    case Metric::kLesionHd95: return "lesion_hd95";
    case Metric::kLesionSensitivity: return "lesion_sensitivity";
    case Metric::kLesionPrecision: return "lesion_precision";
    case Metric::kLesionF1: return "lesion_f1";
    case Metric::kLesionTp: return "lesion_tp";
    case Metric::kLesionFp: return "lesion_fp";
    case Metric::kLesionFn: return "lesion_fn";
  }
  return "?";
}

bool IsCountMetric(Metric m) { return static_cast<int>(m) <= static_cast<int>(Metric::kAccuracy); }
bool IsLesionMetric(Metric m) { return static_cast<int>(m) >= static_cast<int>(Metric::kLesionDice); }

std::vector<Metric> DefaultMetrics() {
  return {Metric::kDice, Metric::kIou, Metric::kPrecision, Metric::kRecall, Metric::kHd95};
}

bool IsCalibrationName(const std::string& name) {
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(name)) == kCalibrationMetric;
}

bool WantsCalibration(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), IsCalibrationName);
}

absl::StatusOr<std::vector<Metric>> ParseMetricNames(const std::vector<std::string>& names) {
  if (names.empty() || std::all_of(names.begin(), names.end(), IsCalibrationName)) return DefaultMetrics();
  std::array<bool, kNumMetrics> selected{};
  selected[static_cast<int>(Metric::kDice)] = true;
  selected[static_cast<int>(Metric::kIou)] = true;
  for (const std::string& raw : names) {
    std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(raw));
    if (name.empty() || name == kCalibrationMetric) continue;
    if (name == "all" || name == "lesion") {
      for (Metric m : kAllMetrics) selected[static_cast<int>(m)] |= IsLesionMetric(m) == (name == "lesion");
      continue;
    }
    bool found = false;
    for (Metric m : kAllMetrics) {
      if (MetricName(m) == name) {
        selected[static_cast<int>(m)] = true;
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> known;
      for (Metric m : kAllMetrics) known.emplace_back(MetricName(m));
      return absl::InvalidArgumentError(absl::StrCat("unknown metric '", raw, "'; known: ",
                                                     absl::StrJoin(known, ","), ", all, lesion or ",
                                                     kCalibrationMetric));
    }
  }
  std::vector<Metric> out;
  for (Metric m : kAllMetrics) {
    if (selected[static_cast<int>(m)]) out.push_back(m);
  }
  return out;
}

absl::StatusOr<std::vector<Metric>> ParseMetricList(absl::string_view list) {
  std::vector<std::string> names = absl::StrSplit(list, ',', absl::SkipWhitespace());
  if (names.empty()) return absl::InvalidArgumentError("empty --metrics list");
  return ParseMetricNames(names);
}

bool AnySurfaceMetric(const std::vector<Metric>& metrics) {
  for (Metric m : metrics) {
    if (IsSurfaceMetric(m)) return true;
  }
  return false;
}

bool AnyLesionMetric(const std::vector<Metric>& metrics) {
  for (Metric m : metrics) {
    if (IsLesionMetric(m)) return true;
  }
  return false;
}

}  // namespace tally
