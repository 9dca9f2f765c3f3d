// Where the model fails: per-group tables (--group-by) and failing slices (--find-slices) of a
// job's rows, for every report format (docs/reports.md "Groups" and "Failing slices").
//
// Groups   each --group-by term is a table; a row's group is its manifest column's value (or the
//          derived property's), in quantile bins where the term asks ("NAME:K", QuantileBins over
//          the evaluated rows' values). Per group: evaluated and failed rows, and per foreground
//          class and per-image metric of the job, over the rows whose value is finite:
//            mean, the 95 % Student t interval mean +/- t(0.975, n-1) s / sqrt(n),
//            diff = mean - the rest of the set's mean, with Welch's 95 % interval
//            (Welch-Satterthwaite degrees of freedom); NaN where a side has fewer than 2 values.
//          Sums are exact (ExactSum) and rows are read in index order, so every number is the same
//          for any worker count, order or merge. Groups under min_group_rows evaluated rows are
//          kept and marked `small`.
// Derived  row properties from the counts (fg_fraction: reference foreground pixels over pixels
//          counted; volume_ratio: predicted over reference foreground, none without reference
//          foreground; pixels) and from the worker (components: the reference's connected
//          components over labels >= 1; mean_intensity: the decoded image's mean 8-bit value), and
//          the DICOM attributes the terms name (dicom:KEYWORD; "(none)" for other images).
//          Foreground as the reports' foreground means count it (class 0 aside unless
//          include_background; regions all).
#ifndef TALLY_SERVER_REPORT_REPORT_GROUPS_H_
#define TALLY_SERVER_REPORT_REPORT_GROUPS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/job/job_config.h"
#include "metrics/slice_search.h"
#include "proto/tally.pb.h"
#include "server/store/job_store.h"

namespace tally {

// Row properties, in kDerivedProperties' order.
inline constexpr int kNumDerived = 7;
using DerivedValues = std::array<double, kNumDerived>;
// Of one evaluated result (padded to the job's classes); NaN where the row has none.
DerivedValues RowDerivedValues(const JobConfig& config, const v1::ImageResult& r);
// A class's own properties for per_image.csv (fg_fraction, volume_ratio, components; NaN: none).
std::array<double, 3> ClassDerivedValues(const JobConfig& config, const v1::ImageResult& r, int c);

struct GroupStats {
  int64_t n = 0;  // Rows with a finite value.
  double mean = 0, lo = 0, hi = 0;
  double diff = 0, diff_lo = 0, diff_hi = 0;  // Against the rest of the set.
};

struct GroupClass {
  int class_id = 0;
  std::vector<GroupStats> metrics;  // GroupsReport::metrics' order.
};

struct Group {
  std::string value;  // "(none)": rows without a value.
  int64_t rows = 0;   // Evaluated.
  int64_t failed = 0;
  bool small = false;  // rows < min_group_rows.
  std::vector<GroupClass> classes;
};

struct GroupTable {
  std::string by;  // The --group-by term.
  std::vector<Group> groups;
};

struct GroupsReport {
  std::vector<Metric> metrics;  // The job's per-image metrics.
  int min_group_rows = 20;
  std::vector<GroupTable> tables;
  // --find-slices: the search over mean foreground Dice per row (worst rows by index; their ids are
  // ReportData::WorstId's).
  std::optional<SliceSearch> slices;
  SliceOptions slice_options;
  bool empty() const { return tables.empty() && !slices.has_value(); }
};

// Collects what the tables and the search need of every row (in any order, split over
// accumulators joined by Merge) and computes them at the end.
class GroupAccumulator {
 public:
  explicit GroupAccumulator(const JobConfig& config);
  // An evaluated row (its result padded to the job's classes) or a failed one (null).
  void Add(int64_t index, const v1::ImageResult* r, const RowNames& names);
  void Merge(GroupAccumulator* other);
  GroupsReport Finish();

 private:
  // A row as kept until Finish: its columns and tags as ids into values_ (interned: a column has
  // few values, a job has millions of rows).
  struct Row {
    int64_t index = 0;
    bool failed = false;
    std::vector<int32_t> columns;  // JobConfig::manifest_columns, then dicom_tags.
    DerivedValues derived{};
    std::vector<double> values;  // class-major: class * metrics + m.
  };
  class Rows;
  int32_t Intern(size_t col, const std::string& value);
  // Each row's group in table `g` ("(none)" where it has no value).
  std::vector<std::string> GroupOf(const GroupBy& g) const;
  GroupTable Table(const GroupBy& g) const;
  void FindSlices(GroupsReport* out) const;

  const JobConfig& config_;
  std::vector<Metric> metrics_;
  std::vector<int> classes_;  // Foreground classes (of categories) the tables show.
  int num_classes_ = 0;
  std::vector<Row> rows_;
  std::vector<std::vector<std::string>> values_;  // Per column (manifest, then dicom): each id's text.
  std::vector<absl::flat_hash_map<std::string, int32_t>> ids_;
};

// The rows as GroupKeys reads them: whether each failed, its columns' values (the job's
// manifest_columns), its derived properties and its dicom: attributes (JobConfig::dicom_tags).
class GroupedRows {
 public:
  virtual ~GroupedRows() = default;
  virtual size_t size() const = 0;
  virtual bool failed(size_t row) const = 0;
  virtual const std::string& column(size_t row, size_t col) const = 0;  // "" where none.
  virtual double derived(size_t row, int slot) const = 0;             // NaN where none.
  virtual const std::string& tag(size_t row, int t) const = 0;          // "" where none.
};
// Each row's group under term `g` ("(none)" where it has no value); quantile bins over the rows that
// did not fail. `config`: the job's (its manifest_columns and dicom_tags).
std::vector<std::string> GroupKeys(const GroupBy& g, const JobConfig& config, const GroupedRows& rows);
// Groups in a reader's order: quantile bins by number, numbers by value, then text; "(none)" last.
bool GroupBefore(const std::string& a, const std::string& b);

// The metrics of `config` a group table shows: those with a value per image (not lesion-wise).
std::vector<Metric> GroupMetrics(const JobConfig& config);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_GROUPS_H_
