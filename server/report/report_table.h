// The tables of the human-readable reports as one row model, rendered to Markdown (summary.md,
// and the table `tally run` prints) and HTML (report.html), so the two cannot drift apart.
#ifndef TALLY_SERVER_REPORT_REPORT_TABLE_H_
#define TALLY_SERVER_REPORT_REPORT_TABLE_H_

#include <string>
#include <vector>

#include "server/report/report_data.h"

namespace tally {

// Failures listed in summary.md and report.html; report.json has them all.
inline constexpr size_t kMaxFailuresShown = 100;

struct TableCell {
  std::string text;
  bool code = false;  // A path: `text` in Markdown, <code> in HTML.
};

struct Table {
  std::vector<std::string> header;
  std::vector<bool> left;  // Per column: left-aligned text (else numbers, right-aligned).
  std::vector<std::vector<TableCell>> rows;
};

// 4 decimals, nan/inf spelled out.
std::string FormatCell(double v);

// Per class: images, every metric's mean but the lesion metrics' (Dice with its 95% interval,
// infinities counted), global Dice and IoU, Pr@t of referring sets; then the foreground means.
Table ClassTable(const ReportData& d);
// Lesion metrics (lesion_*), per foreground class: means and pooled globals (docs/metrics.md "Lesion-wise
// metrics"); the background is left out unless included. HasLesionTable: the job selected any.
bool HasLesionTable(const ReportData& d);
Table LesionTable(const ReportData& d);
// The --thresholds sweep: per threshold the foreground class's Dice and IoU, the best marked.
Table ThresholdTable(const ReportData& d);
// What `tally run` prints at the end (Job.summary): the instance or panoptic numbers (with the AP
// of each category), the per-class table, the lesion table and the threshold sweep where they apply.
std::string TerminalSummary(const ReportData& d);
// What the per-class table's Dice interval is, in a sentence (docs/metrics.md "Intervals"): the betting
// interval over the rows or of a sample, none below kMinIntervalRows, or none at all (a manifest-
// order job's first rows).
std::string IntervalSentence(const ReportData& d);
// The (up to 10) images with the lowest Dice of one class.
Table WorstTable(const ReportData& d, const ClassAggregate& ca);
// The first kMaxFailuresShown failures.
Table FailureTable(const ReportData& d);
Table WorkerTable(const ReportData& d);
// The job's parameters, one per row: what it was run with (the settings that change numbers first).
Table ParameterTable(const ReportData& d);

// COCO instance jobs: the 12 numbers; per category AP and counts; the rows of lowest instance F1.
Table InstanceStatsTable(const ReportData& d);
Table InstanceCategoryTable(const ReportData& d);
Table InstanceWorstTable(const ReportData& d);
// Panoptic jobs: PQ, SQ, RQ overall, things and stuff; per category.
Table PanopticTable(const ReportData& d);
Table PanopticCategoryTable(const ReportData& d);

std::string MarkdownTable(const Table& t);
std::string HtmlTable(const Table& t);
// Escapes & < > " for HTML text and attributes.
std::string HtmlEscape(const std::string& s);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_TABLE_H_
