// Everything the report formats show about one job, gathered once from the database (results in
// index order, so every aggregate is the same whatever the number of workers). Each format
// (report_json.cc, report_markdown.cc, report_html.cc, report_csv.cc) only renders it.
#ifndef TALLY_SERVER_REPORT_REPORT_DATA_H_
#define TALLY_SERVER_REPORT_REPORT_DATA_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job/job_config.h"
#include "common/job/row_order.h"
#include "metrics/aggregator.h"
#include "metrics/calibration.h"
#include "server/store/job_store.h"
#include "server/report/report_groups.h"
#include "server/report/report_instances.h"

namespace tally {

// "3" for class 3; for a job with regions, region `class_id`'s labels joined by '+' ("1+2").
std::string ClassLabel(const JobConfig& config, int class_id);

struct Failure {
  int64_t index = 0;
  std::string id;
  std::string image;
  std::string reason;
};

// Failed rows that share a reason once file names and numbers are left out (FailureKind).
struct FailureGroup {
  std::string kind;     // The reason with every '...' quoted part as '…' and every number as #.
  int64_t count = 0;
  std::string example;  // The first such row's full reason.
};
std::string FailureKind(const std::string& reason);

struct ReportData {
  const JobRecord* record = nullptr;  // Not owned; outlives the data.
  JobConfig config;
  Aggregate aggregate;
  std::vector<Failure> failures;
  std::vector<FailureGroup> failure_groups;  // Most common first.
  std::vector<WorkerRecord> workers;
  int64_t evaluated = 0;
  int64_t failed = 0;
  int64_t from_store = 0;  // Evaluated rows scored from the prediction store (ImageResult.from_store).
  int64_t nonfinite_images = 0;  // Evaluated images whose model output had NaN/Inf (--nonfinite warn).
  int64_t nonfinite_values = 0;
  // Evaluated rows read from a file modified after the job was submitted (InputDigests.modified_ns
  // more than a second past created_unix), and the first of them by index.
  int64_t inputs_modified = 0;
  int64_t inputs_modified_first = -1;
  std::string inputs_modified_first_id;
  int64_t inputs_modified_first_ns = 0;
  // --until-ci jobs that ended: where the rule stands, from this report's own intervals (the note
  // and the table cannot disagree); otherwise the job's live note, as `tally status` shows it.
  std::string until_ci_note;
  // Evaluated rows whose image --window did not apply to, by the image's format (InputDigests).
  std::map<std::string, int64_t> window_unused;
  int num_classes = 0;
  double wall_seconds = 0;
  IntervalKind interval = IntervalKind::kRows;  // What dice_mean_ci95 stands for.
  // Volumes: each spacing (z, y, x) the rows were scored with, and how many rows (ImageResult.spacing).
  std::map<std::array<double, 3>, int64_t> spacings;
  double end_unix = 0;  // The last result's time (or the job's end).
  int mask_max_label = -1;     // Over every evaluated image's reference mask, ignored pixels aside.
  int64_t mask_ignored = 0;    // Reference pixels equal to the ignore index, summed.
  // Conditions that make the numbers suspect (docs/reports.md "Warnings"), worded for the user.
  std::vector<std::string> warnings;
  struct WorstRow {
    std::string id;
    std::string image;
  };
  std::map<int64_t, WorstRow> worst_rows;  // Each index in a worst list.
  // Thumbnails of worst rows by (class, index) (common/formats/thumbnail.h); rows without one are absent.
  std::map<std::pair<int, int64_t>, StoredThumbnail> thumbnails;
  // COCO instance jobs (present): COCO AP and the rest (server/report/report_instances.h).
  InstanceReport instances;
  PanopticReport panoptic;  // Panoptic jobs (present).
  GroupsReport groups;      // --group-by tables and --find-slices' search (report_groups.h).
  // --metrics calibration (metrics/calibration.h): the exact sums over the rows counted, and their
  // summary (set by Finish). calibration_rows: evaluated rows with calibration values;
  // calibration_fine_rows: those whose batch's fine histogram counted (equal in a complete job).
  CalibrationTotals calibration;
  CalibrationSummary calibration_summary;
  int64_t calibration_rows = 0;
  int64_t calibration_fine_rows = 0;
  int64_t calibration_mismatched = 0;  // Rows whose values did not fit the job's class count (none expected).
  bool IsPanopticJob() const { return config.panoptic_job(); }
  // Instance jobs: class ids that are categories (the others only pad the label range).
  bool IsCategoryClass(int class_id) const {
    for (const JobConfig::CocoCategory& c : config.coco_categories) {
      if (c.id == class_id) return true;
    }
    return !config.instance_job() && !config.panoptic_job();
  }

  const std::vector<Metric>& metrics() const { return config.metrics; }
  // Regions (--regions) are all foreground; of classes, 0 is background unless include_background.
  bool IsForeground(int class_id) const {
    return class_id != 0 || config.include_background || !config.regions.empty();
  }
  // How reports name class (or region) `class_id`: "3", or a region's labels as "1+2".
  // A class as the human-readable reports name it: its id, and for instance and panoptic jobs the
  // category's name ("3 person"); per_image.csv keeps the bare id (ClassLabel).
  std::string ClassName(int class_id) const {
    for (const JobConfig::CocoCategory& c : config.coco_categories) {
      if (c.id == class_id && !c.name.empty()) return absl::StrCat(class_id, " ", c.name);
    }
    return ClassLabel(config, class_id);
  }
  // Images of a class whose Dice is exactly 0, and the note the worst-images tables carry when more
  // of them tie than a table shows ("" otherwise).
  static int64_t DiceZeroImages(const ClassAggregate& ca);
  static std::string DiceTieNote(const ClassAggregate& ca);
  // Image path and id of `index` if it is in a worst list, else "".
  std::string WorstImage(int64_t index) const;
  std::string WorstId(int64_t index) const;
  // The thumbnail of row `index` for class `class_id`, or null.
  const StoredThumbnail* Thumbnail(int class_id, int64_t index) const {
    auto it = thumbnails.find({class_id, index});
    return it == thumbnails.end() ? nullptr : &it->second;
  }
  double images_per_second() const { return wall_seconds > 0 ? (evaluated + failed) / wall_seconds : 0.0; }
};

// What the coordinator learns from building a report.
struct ReportOutcome {
  std::string summary;                // The per-class table as Markdown, for `tally run`.
  std::vector<std::string> warnings;  // Logged once per job.
  std::string until_ci_note;          // --until-ci jobs: ReportData::until_ci_note, for `tally status`.
};

// What the reports show as a row's image: the image as written, or the prediction for prediction
// manifests without an image column.
inline const std::string& ShownImage(const RowNames& names) {
  return names.image.empty() ? names.prediction : names.image;
}

using ReportRowFn = std::function<void(const v1::ImageResult&, const RowNames& names)>;

// What a report gathers row by row: the failures, the counters and the aggregate (order-free:
// rows may come in any order and be split over accumulators joined by Merge, except in instance
// and panoptic jobs, whose accumulators take rows in index order). The batch path
// (GatherMergedReportData) feeds it from the database; tallyd feeds one as results arrive
// (server/report/live_report.h). Either way Finish gives the same ReportData.
class ReportAccumulator {
 public:
  // `interval`: what the Dice interval stands for; by default what the record says now
  // (IntervalKindFor). The report kept as rows arrive (live_report.h), only for jobs that end with
  // every row, passes kRows.
  static absl::StatusOr<std::unique_ptr<ReportAccumulator>> Create(const JobRecord& record,
                                                                   std::optional<IntervalKind> interval = {});
  ReportAccumulator(const JobRecord& record, JobConfig config, std::optional<IntervalKind> interval = {});
  ~ReportAccumulator();
  // One stored result, `offset` rows after the merged order's start (its part's first row). `on_row`
  // (may be empty) sees every evaluated result, padded to the job's classes, with its names.
  void AddRow(const v1::ImageResult& stored, const RowNames& names, int64_t offset, const ReportRowFn& on_row);
  void Merge(ReportAccumulator* other);
  void AddCalibration(const v1::ImageResult& r);
  int64_t rows() const { return d_.evaluated + d_.failed; }
  const JobConfig& config() const { return config_; }
  // The report's data; reads the worst rows' names and thumbnails and the workers from `store`.
  // The accumulator is empty afterwards.
  absl::StatusOr<ReportData> Finish(JobStore* store, const std::vector<const JobRecord*>& parts,
                                    const JobRecord& record);

 private:
  const JobConfig config_;  // The accumulators' (they refer to it).
  ReportData d_;
  std::unique_ptr<Aggregator> aggregator_;
  std::unique_ptr<InstanceAccumulator> instances_;
  std::unique_ptr<PanopticAccumulator> panoptic_;
  std::unique_ptr<GroupAccumulator> groups_;  // Jobs with groups or slices.
  std::optional<RowOrder> order_;  // A sample's draw order (IntervalKind::kSample).
  int64_t submitted_ns_ = 0;       // The job's submission (0: unknown, no check).
};

// What a job's report interval stands for (metrics/aggregator.h IntervalKind), from its record, and
// that in words (report.json dice_mean_ci95_method).
IntervalKind IntervalKindFor(const JobRecord& record);
std::string IntervalMethod(IntervalKind kind);

// Reads the job's results once, in index order. `on_row` sees every evaluated result with its
// names as written (per_image.csv is streamed from it, so results are not held in memory). Results
// of prediction jobs without a fixed class count arrive padded to the job's class count.
absl::StatusOr<ReportData> GatherReportData(JobStore* store, const JobRecord& record, const ReportRowFn& on_row);
// The same over several jobs' rows as one set (tally merge): `parts` in order, each part's indices
// shifted by the rows of the parts before it, so that the aggregates (the Dice interval included) are those
// of one job over the concatenated manifests. `record` describes the merged job.
absl::StatusOr<ReportData> GatherMergedReportData(JobStore* store, const std::vector<const JobRecord*>& parts,
                                                  const JobRecord& record, const ReportRowFn& on_row);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_DATA_H_
