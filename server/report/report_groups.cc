#include "server/report/report_groups.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "metrics/calibration.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/aggregator.h"
#include "metrics/exact_sum.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kNoValue = "(none)";

bool Foreground(const JobConfig& config, int c) {
  if (config.instance_job() || config.panoptic_job()) {
    for (const JobConfig::CocoCategory& cat : config.coco_categories) {
      if (cat.id == c) return true;
    }
    return false;
  }
  return c != 0 || config.include_background || !config.regions.empty();
}

int DerivedSlot(const std::string& name) {
  for (int i = 0; i < kNumDerived; ++i) {
    if (name == kDerivedProperties[i]) return i;
  }
  return -1;
}

// Sum, sum of squares and count of a set's finite values, exactly.
struct Moments {
  ExactSum s1, s2;
  int64_t n = 0;
  void Add(double v) {
    s1.Add(v);
    s2.Add(v * v);
    ++n;
  }
  void Merge(const Moments& o) {
    s1.Merge(o.s1);
    s2.Merge(o.s2);
    n += o.n;
  }
  double Mean() const { return n > 0 ? s1.Value() / static_cast<double>(n) : kNaN; }
  // The sample variance (n - 1), from the sums rounded once each.
  double Variance() const {
    if (n < 2) return kNaN;
    const double a = s1.Value();
    return std::max(0.0, (s2.Value() - a * a / static_cast<double>(n)) / static_cast<double>(n - 1));
  }
};

GroupStats Stats(const Moments& in, const Moments& rest) {
  GroupStats g;
  g.n = in.n;
  g.mean = in.Mean();
  const double v1 = in.Variance();
  g.lo = g.hi = kNaN;
  if (in.n >= 2) {
    const double half = StudentTQuantile(0.975, static_cast<double>(in.n - 1)) * std::sqrt(v1 / static_cast<double>(in.n));
    g.lo = g.mean - half;
    g.hi = g.mean + half;
  }
  g.diff = in.n > 0 && rest.n > 0 ? g.mean - rest.Mean() : kNaN;
  g.diff_lo = g.diff_hi = kNaN;
  if (in.n >= 2 && rest.n >= 2) {
    const double a = v1 / static_cast<double>(in.n), b = rest.Variance() / static_cast<double>(rest.n);
    const double se = std::sqrt(a + b);
    double half = 0;
    if (se > 0) {
      const double df = (a + b) * (a + b) /
                        (a * a / static_cast<double>(in.n - 1) + b * b / static_cast<double>(rest.n - 1));
      half = StudentTQuantile(0.975, df) * se;
    }
    g.diff_lo = g.diff - half;
    g.diff_hi = g.diff + half;
  }
  return g;
}

}  // namespace

// Groups in a reader's order: quantile bins by number, numbers by value, then text; "(none)" last.
bool GroupBefore(const std::string& a, const std::string& b) {
  auto key = [](const std::string& s) {
    int bin = 0;
    double number = 0;
    if (s == kNoValue) return std::make_tuple(3, 0.0, s);
    if (s.size() > 1 && s[0] == 'q' && absl::SimpleAtoi(s.substr(1, s.find(' ') - 1), &bin)) {
      return std::make_tuple(0, static_cast<double>(bin), s);
    }
    if (absl::SimpleAtod(s, &number) && std::isfinite(number)) return std::make_tuple(1, number, s);
    return std::make_tuple(2, 0.0, s);
  };
  return key(a) < key(b);
}

std::vector<Metric> GroupMetrics(const JobConfig& config) { return config.metrics; }

DerivedValues RowDerivedValues(const JobConfig& config, const v1::ImageResult& r) {
  DerivedValues d;
  d.fill(kNaN);
  if (r.classes_size() == 0) return d;
  const v1::ClassResult& any = r.classes(0);
  const double pixels = static_cast<double>(any.tp() + any.fp() + any.fn() + any.tn());
  double ref = 0, pred = 0;
  for (int c = 0; c < r.classes_size(); ++c) {
    if (!Foreground(config, c)) continue;
    ref += static_cast<double>(r.classes(c).tp() + r.classes(c).fn());
    pred += static_cast<double>(r.classes(c).tp() + r.classes(c).fp());
  }
  d[0] = pixels > 0 ? ref / pixels : kNaN;
  d[1] = ref > 0 ? pred / ref : kNaN;
  if (r.properties().components_size() > 0) {
    int64_t components = 0;
    for (int l = 1; l < r.properties().components_size(); ++l) components += r.properties().components(l);
    d[2] = static_cast<double>(components);
  } else if (r.has_properties()) {
    d[2] = 0;  // A reference without labels.
  }
  d[3] = pixels;
  if (r.properties().has_mean_intensity()) d[4] = r.properties().mean_intensity();
  if (r.calibration_size() == CalibrationRowSize(r.classes_size())) {
    d[5] = RowEce(r.calibration().data(), r.classes_size());
    d[6] = RowConfidence(r.calibration().data(), r.classes_size());
  }
  return d;
}

std::array<double, 3> ClassDerivedValues(const JobConfig& config, const v1::ImageResult& r, int c) {
  const v1::ClassResult& k = r.classes(c);
  const double pixels = static_cast<double>(k.tp() + k.fp() + k.fn() + k.tn());
  const double ref = static_cast<double>(k.tp() + k.fn()), pred = static_cast<double>(k.tp() + k.fp());
  double components = kNaN;
  // Classes are labels unless the job scores regions (unions of labels).
  if (config.regions.empty() && r.has_properties()) {
    components = c < r.properties().components_size() ? static_cast<double>(r.properties().components(c)) : 0.0;
  }
  return {pixels > 0 ? ref / pixels : kNaN, ref > 0 ? pred / ref : kNaN, components};
}

GroupAccumulator::GroupAccumulator(const JobConfig& config) : config_(config), metrics_(GroupMetrics(config)) {
  const size_t columns = config.manifest_columns.size() + config.dicom_tags().size();
  values_.resize(columns);
  ids_.resize(columns);
}

int32_t GroupAccumulator::Intern(size_t col, const std::string& value) {
  auto [it, added] = ids_[col].emplace(value, static_cast<int32_t>(values_[col].size()));
  if (added) values_[col].push_back(value);
  return it->second;
}

void GroupAccumulator::Add(int64_t index, const v1::ImageResult* r, const RowNames& names) {
  Row row;
  row.index = index;
  row.failed = r == nullptr;
  const size_t manifest = config_.manifest_columns.size();
  row.columns.resize(values_.size());
  for (size_t c = 0; c < values_.size(); ++c) {
    const bool tag = c >= manifest;
    const int t = static_cast<int>(c - manifest);
    const std::string none;
    const std::string& v = !tag ? (c < names.columns.size() ? names.columns[c] : none)
                                : (r != nullptr && t < r->properties().tags_size() ? r->properties().tags(t) : none);
    row.columns[c] = Intern(c, v);
  }
  row.derived.fill(kNaN);
  if (r != nullptr) {
    row.derived = RowDerivedValues(config_, *r);
    num_classes_ = std::max(num_classes_, r->classes_size());
    row.values.reserve(static_cast<size_t>(r->classes_size()) * metrics_.size());
    for (int c = 0; c < r->classes_size(); ++c) {
      for (Metric m : metrics_) row.values.push_back(Aggregator::ImageMetric(*r, c, m, config_.empty_score));
    }
  }
  rows_.push_back(std::move(row));
}

void GroupAccumulator::Merge(GroupAccumulator* other) {
  num_classes_ = std::max(num_classes_, other->num_classes_);
  // The other's ids, as this one's.
  std::vector<std::vector<int32_t>> remap(values_.size());
  for (size_t c = 0; c < values_.size(); ++c) {
    for (const std::string& v : other->values_[c]) remap[c].push_back(Intern(c, v));
  }
  for (Row& r : other->rows_) {
    for (size_t c = 0; c < r.columns.size(); ++c) r.columns[c] = remap[c][r.columns[c]];
    rows_.push_back(std::move(r));
  }
  other->rows_.clear();
}

// The accumulator's rows as GroupKeys reads them.
class GroupAccumulator::Rows : public GroupedRows {
 public:
  explicit Rows(const GroupAccumulator& a) : a_(a) {}
  size_t size() const override { return a_.rows_.size(); }
  bool failed(size_t row) const override { return a_.rows_[row].failed; }
  const std::string& column(size_t row, size_t col) const override {
    return a_.values_[col][a_.rows_[row].columns[col]];
  }
  double derived(size_t row, int slot) const override { return a_.rows_[row].derived[slot]; }
  const std::string& tag(size_t row, int t) const override {
    return column(row, a_.config_.manifest_columns.size() + static_cast<size_t>(t));
  }

 private:
  const GroupAccumulator& a_;
};

std::vector<std::string> GroupKeys(const GroupBy& g, const JobConfig& config, const GroupedRows& rows) {
  std::vector<std::string> out(rows.size());
  if (!g.column.empty() || !g.dicom.empty()) {
    const std::vector<std::string>& names = g.dicom.empty() ? config.manifest_columns : config.dicom_tags();
    const std::string& name = g.dicom.empty() ? g.column : g.dicom;
    const size_t col = static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
    for (size_t i = 0; i < rows.size(); ++i) {
      out[i] = g.dicom.empty() ? rows.column(i, col) : rows.tag(i, static_cast<int>(col));
    }
    if (g.bins > 0) {
      // Bins of the evaluated rows' numbers; failed rows, which have none, are "(none)".
      std::vector<double> numbers(rows.size(), kNaN);
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!rows.failed(i) && !absl::SimpleAtod(out[i], &numbers[i])) numbers[i] = kNaN;
      }
      std::vector<std::string> bins = QuantileBins(numbers, g.bins);
      for (size_t i = 0; i < rows.size(); ++i) out[i] = rows.failed(i) ? "" : bins[i];
    }
  } else {
    const int slot = DerivedSlot(g.derived);
    std::vector<double> numbers(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) numbers[i] = rows.derived(i, slot);
    if (g.bins > 0) {
      out = QuantileBins(numbers, g.bins);
    } else {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (std::isfinite(numbers[i])) out[i] = absl::StrFormat("%.17g", numbers[i]);
      }
    }
  }
  for (std::string& v : out) {
    if (v.empty()) v = kNoValue;
  }
  return out;
}

std::vector<std::string> GroupAccumulator::GroupOf(const GroupBy& g) const { return GroupKeys(g, config_, Rows(*this)); }

GroupTable GroupAccumulator::Table(const GroupBy& g) const {
  const std::vector<std::string> key = GroupOf(g);
  const size_t metrics = metrics_.size();
  std::map<std::string, size_t> slot;  // Group value -> position.
  std::vector<std::string> values;
  for (const std::string& k : key) {
    if (slot.emplace(k, values.size()).second) values.push_back(k);
  }
  const size_t cells = static_cast<size_t>(num_classes_) * metrics;
  std::vector<std::vector<Moments>> moments(values.size(), std::vector<Moments>(cells));
  std::vector<Moments> total(cells);
  GroupTable table;
  table.by = g.text;
  table.groups.resize(values.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    const size_t s = slot[key[i]];
    Group& group = table.groups[s];
    if (rows_[i].failed) {
      ++group.failed;
      continue;
    }
    ++group.rows;
    for (size_t k = 0; k < rows_[i].values.size(); ++k) {
      const double v = rows_[i].values[k];
      if (!std::isfinite(v)) continue;
      moments[s][k].Add(v);
      total[k].Add(v);
    }
  }
  for (size_t s = 0; s < values.size(); ++s) {
    Group& group = table.groups[s];
    group.value = values[s];
    group.small = group.rows < config_.min_group_rows;
    for (int c = 0; c < num_classes_; ++c) {
      if (!Foreground(config_, c)) continue;
      GroupClass gc;
      gc.class_id = c;
      for (size_t m = 0; m < metrics; ++m) {
        const size_t k = static_cast<size_t>(c) * metrics + m;
        Moments rest;
        for (size_t o = 0; o < values.size(); ++o) {
          if (o != s) rest.Merge(moments[o][k]);
        }
        gc.metrics.push_back(Stats(moments[s][k], rest));
      }
      group.classes.push_back(std::move(gc));
    }
  }
  std::stable_sort(table.groups.begin(), table.groups.end(),
                   [](const Group& a, const Group& b) { return GroupBefore(a.value, b.value); });
  return table;
}

void GroupAccumulator::FindSlices(GroupsReport* out) const {
  // Each row's value: its mean Dice over the foreground classes it defines (tally slices' default).
  const auto dice = std::find(metrics_.begin(), metrics_.end(), Metric::kDice);
  std::vector<double> values(rows_.size(), kNaN);
  if (dice != metrics_.end()) {
    const size_t m = static_cast<size_t>(dice - metrics_.begin());
    for (size_t i = 0; i < rows_.size(); ++i) {
      ExactSum sum;
      int n = 0;
      for (int c = 0; c < num_classes_; ++c) {
        const size_t k = static_cast<size_t>(c) * metrics_.size() + m;
        if (!Foreground(config_, c) || k >= rows_[i].values.size() || !std::isfinite(rows_[i].values[k])) continue;
        sum.Add(rows_[i].values[k]);
        ++n;
      }
      if (n > 0) values[i] = sum.Value() / n;
    }
  }
  const int bins = 4, max_values = out->slice_options.max_values;
  std::vector<SliceAttribute> attributes;
  std::vector<std::string> names = config_.manifest_columns;
  for (const std::string& t : config_.dicom_tags()) names.push_back("dicom:" + t);
  for (size_t col = 0; col < names.size(); ++col) {
    SliceAttribute a{names[col], std::vector<std::string>(rows_.size())};
    // Numeric with more than max_values values (of the evaluated rows; failed rows have none):
    // binned. A column's values are its interned ones.
    std::vector<bool> used(values_[col].size(), false);
    for (const Row& r : rows_) {
      if (!r.failed) used[r.columns[col]] = true;
    }
    std::vector<double> number_of(values_[col].size(), kNaN);
    size_t distinct = 0;
    bool numeric = true;
    for (size_t id = 0; id < values_[col].size(); ++id) {
      if (!used[id] || values_[col][id].empty()) continue;
      ++distinct;
      numeric = numeric && absl::SimpleAtod(values_[col][id], &number_of[id]);
    }
    if (numeric && static_cast<int>(distinct) > max_values) {
      std::vector<double> numbers(rows_.size(), kNaN);
      for (size_t i = 0; i < rows_.size(); ++i) {
        if (!rows_[i].failed) numbers[i] = number_of[rows_[i].columns[col]];
      }
      a = NumericSliceAttribute(a.name, numbers, bins, max_values);
    } else {
      for (size_t i = 0; i < rows_.size(); ++i) a.values[i] = rows_[i].failed ? "" : values_[col][rows_[i].columns[col]];
    }
    attributes.push_back(std::move(a));
  }
  for (int p = 0; p < kNumDerived; ++p) {
    if (p >= kFirstCalibrationProperty && !config_.calibration) break;  // None without calibration.
    std::vector<double> numbers(rows_.size());
    for (size_t i = 0; i < rows_.size(); ++i) numbers[i] = rows_[i].derived[p];
    attributes.push_back(NumericSliceAttribute(absl::StrCat("derived:", kDerivedProperties[p]), numbers, bins, max_values));
  }
  out->slices = tally::FindSlices(values, attributes, out->slice_options);
  // The search numbers rows by position; the report names them by index.
  for (Slice& s : out->slices->slices) {
    for (int64_t& r : s.worst_rows) r = rows_[static_cast<size_t>(r)].index;
  }
}

GroupsReport GroupAccumulator::Finish() {
  std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) { return a.index < b.index; });
  GroupsReport out;
  out.metrics = metrics_;
  out.min_group_rows = config_.min_group_rows;
  for (const GroupBy& g : config_.group_by) out.tables.push_back(Table(g));
  if (config_.find_slices) FindSlices(&out);
  rows_.clear();
  return out;
}

}  // namespace tally
