#include "server/report/report_nnunet.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/json_writer.h"
#include "metrics/overlap.h"

namespace tally {
namespace {

constexpr const char* kMetricNames[] = {"Dice", "FN", "FP", "IoU", "TN", "TP", "n_pred", "n_ref"};

std::string JsonString(const std::string& s) {
  JsonWriter w(false);
  w.String(s);
  return w.str();
}

}  // namespace

std::string PythonFloatRepr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e-05": shortest round-trip digits.
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp < -4 || exp >= 16) {
    // Scientific: d[.ddd]e[+-]XX.
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const std::string ex = std::to_string(std::abs(exp));
    out += (ex.size() < 2 ? "0" : "") + ex;
  } else if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return negative ? "-" + out : out;
}

NnunetSummary::NnunetSummary(const JobConfig& config, int num_classes) {
  if (!config.regions.empty()) {
    for (int r = 0; r < static_cast<int>(config.regions.size()); ++r) {
      const std::vector<int>& labels = config.regions[r];
      keys_.push_back({r, labels.size() == 1 ? absl::StrCat(labels[0])
                                             : absl::StrCat("(", absl::StrJoin(labels, ", "), ")")});
    }
  } else {
    for (int c = config.include_background ? 0 : 1; c < num_classes; ++c) keys_.push_back({c, absl::StrCat(c)});
  }
  std::sort(keys_.begin(), keys_.end(), [](const Key& a, const Key& b) { return a.name < b.name; });
  sum_.assign(keys_.size(), {});
  compensation_.assign(keys_.size(), {});
  count_.assign(keys_.size(), {});
  cases_ = std::tmpfile();
}

NnunetSummary::~NnunetSummary() {
  if (cases_ != nullptr) std::fclose(cases_);
}

void NnunetSummary::Add(const v1::ImageResult& r, const RowNames& names) {
  if (cases_ == nullptr) return;
  std::string s = num_cases_ == 0 ? "\n" : ",\n";
  absl::StrAppend(&s, "        {\n            \"metrics\": {");
  for (size_t k = 0; k < keys_.size(); ++k) {
    const int c = keys_[k].class_id;
    int64_t tp = 0, fp = 0, fn = 0, tn = 0;
    if (c < r.classes_size()) {
      tp = r.classes(c).tp();
      fp = r.classes(c).fp();
      fn = r.classes(c).fn();
      tn = r.classes(c).tn();
    }
    const ConfusionCounts counts{tp, fp, fn, tn};
    const double dice = Dice(counts), iou = Iou(counts);  // nnU-Net's: NaN where tp + fp + fn = 0.
    const std::array<double, kMetrics> values = {dice, double(fn), double(fp), iou, double(tn), double(tp),
                                                 double(fp + tp), double(fn + tp)};
    for (int m = 0; m < kMetrics; ++m) {
      if (std::isnan(values[m])) continue;
      // Neumaier summation: the mean as exact as numpy's pairwise sum, or more.
      const double t = sum_[k][m] + values[m];
      compensation_[k][m] += std::fabs(sum_[k][m]) >= std::fabs(values[m]) ? (sum_[k][m] - t) + values[m]
                                                                             : (values[m] - t) + sum_[k][m];
      sum_[k][m] = t;
      count_[k][m]++;
    }
    absl::StrAppend(&s, k == 0 ? "\n" : ",\n", "                ", JsonString(keys_[k].name), ": {\n");
    const std::array<std::string, kMetrics> shown = {PythonFloatRepr(dice), absl::StrCat(fn), absl::StrCat(fp),
                                                     PythonFloatRepr(iou),  absl::StrCat(tn), absl::StrCat(tp),
                                                     absl::StrCat(fp + tp), absl::StrCat(fn + tp)};
    for (int m = 0; m < kMetrics; ++m) {
      absl::StrAppend(&s, "                    \"", kMetricNames[m], "\": ", shown[m], m + 1 < kMetrics ? ",\n" : "\n");
    }
    absl::StrAppend(&s, "                }");
  }
  absl::StrAppend(&s, keys_.empty() ? "},\n" : "\n            },\n");
  absl::StrAppend(&s, "            \"prediction_file\": ", JsonString(names.prediction_path), ",\n");
  absl::StrAppend(&s, "            \"reference_file\": ", JsonString(names.mask_path), "\n        }");
  std::fwrite(s.data(), 1, s.size(), cases_);
  ++num_cases_;
}

absl::Status NnunetSummary::Write(const std::string& path) {
  if (cases_ == nullptr) return absl::InternalError("summary.json: cannot create a temporary file");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::array<double, kMetrics>> means(keys_.size());
  for (size_t k = 0; k < keys_.size(); ++k) {
    for (int m = 0; m < kMetrics; ++m) {
      means[k][m] = count_[k][m] == 0 ? nan : (sum_[k][m] + compensation_[k][m]) / static_cast<double>(count_[k][m]);
    }
  }
  auto block = [&](const std::array<double, kMetrics>& v, const std::string& indent) {
    std::string s = "{\n";
    for (int m = 0; m < kMetrics; ++m) {
      absl::StrAppend(&s, indent, "    \"", kMetricNames[m], "\": ", PythonFloatRepr(v[m]), m + 1 < kMetrics ? ",\n" : "\n");
    }
    return s + indent + "}";
  };
  std::array<double, kMetrics> foreground{};
  for (int m = 0; m < kMetrics; ++m) {
    double sum = 0;
    int n = 0;
    for (size_t k = 0; k < keys_.size(); ++k) {
      if (keys_[k].name == "0") continue;
      sum += means[k][m];
      ++n;
    }
    foreground[m] = n == 0 ? nan : sum / n;
  }
  std::string head = "{\n    \"foreground_mean\": " + block(foreground, "    ") + ",\n    \"mean\": {";
  for (size_t k = 0; k < keys_.size(); ++k) {
    absl::StrAppend(&head, k == 0 ? "\n" : ",\n", "        ", JsonString(keys_[k].name), ": ", block(means[k], "        "));
  }
  absl::StrAppend(&head, keys_.empty() ? "},\n" : "\n    },\n", "    \"metric_per_case\": [");
  absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Open(path);
  if (!file.ok()) return file.status();
  (*file)->out() << head;
  std::fflush(cases_);
  std::rewind(cases_);
  std::vector<char> buf(1 << 16);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), cases_)) > 0) (*file)->out().write(buf.data(), n);
  (*file)->out() << (num_cases_ == 0 ? "]\n}" : "\n    ]\n}");
  return (*file)->Commit();
}

}  // namespace tally
