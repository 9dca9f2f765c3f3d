// tally compare: two runs over the same manifest (a base and an edited model, fp32 vs bf16, two
// checkpoints), paired image by image. Per class and metric: the mean of each run over the images
// both evaluated with a finite value, the mean paired difference (B - A) with its 95% interval
// (metrics in [0, 1]: the betting interval, metrics/bounded_mean.h), and a two-sided Wilcoxon signed-rank p-value; per class, the images whose Dice
// changed most. The images a metric is defined for in one run only are counted per run, beside each
// run's own mean (its report's), so that what the pairs leave out is seen. Rendered as compare.json,
// compare.csv, compare.md and compare.html. Jobs with --group-by: the same per group of A's rows.
#ifndef TALLY_SERVER_REPORT_COMPARE_H_
#define TALLY_SERVER_REPORT_COMPARE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/overlap.h"
#include "metrics/statistics.h"
#include "server/store/job_store.h"

namespace tally {

// One metric of one class, paired (metrics/statistics.h): pairs, means, mean(B - A) with its 95%
// interval (SummarisePairs: NaN for unbounded metrics), the Wilcoxon p-value (NaN when
// every difference is 0), and how many pairs went up and down.
struct MetricComparison : PairedSummary {
  Metric metric = Metric::kDice;
  // Images evaluated in both runs whose value is finite in one run only (an empty prediction's Dice
  // is undefined where the other run's is 0): left out of the pairs, counted by the run that has it.
  int64_t defined_only_a = 0, defined_only_b = 0;
  // Each run's own mean over every image it evaluated with a finite value: its report's mean.
  double own_mean_a = 0, own_mean_b = 0;
  int64_t own_images_a = 0, own_images_b = 0;
};

struct ChangedImage {
  int64_t index = 0;
  std::string id;
  double dice_a = 0, dice_b = 0;
};

struct ClassComparison {
  int class_id = 0;
  std::vector<MetricComparison> metrics;
  std::vector<ChangedImage> most_changed;  // Up to 10, largest |Dice B - Dice A| first.
};

struct Comparison {
  JobRecord a, b;
  int64_t paired = 0;        // Rows evaluated in both runs.
  int64_t only_a = 0, only_b = 0;  // Rows evaluated in one run only (failed in the other).
  std::vector<Metric> metrics;     // Selected in both runs.
  std::vector<ClassComparison> classes;
  struct Row {                      // For compare.csv: per paired image and class.
    int64_t index;
    std::string id;
    int class_id;
    std::vector<double> a, b;       // Per `metrics`.
  };
  std::vector<Row> rows;
  // A's --group-by terms (report_groups.h; groups from A's columns and row properties): per group,
  // per foreground class, each metric's paired summary over the group's pairs.
  struct GroupEntry {
    std::string value;
    int64_t pairs = 0;  // Images evaluated in both runs.
    std::vector<ClassComparison> classes;  // metrics only (no most_changed).
  };
  struct GroupTable {
    std::string by;
    std::vector<GroupEntry> groups;
  };
  std::vector<GroupTable> groups;
};

// Reads both finished jobs' results. INVALID_ARGUMENT when their manifests do not pair (row counts
// or ids differ) or their classes differ.
absl::StatusOr<Comparison> CompareJobs(JobStore* store, const JobRecord& a, const JobRecord& b);
// Writes compare.json, compare.csv, compare.md and compare.html into `dir`.
absl::Status WriteComparison(const Comparison& c, const std::string& dir);
inline constexpr const char* kCompareFiles[] = {"compare.json", "compare.csv", "compare.md", "compare.html"};

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_COMPARE_H_
