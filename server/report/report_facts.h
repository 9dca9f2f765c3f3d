// What a report states about its job before any number (docs/reports.md "Reports"), written once and rendered
// by summary.md and report.html alike, so that the two say the same and agree with report.json: what
// was evaluated and with what (the model, or the prediction, annotation and results files, with their
// SHA-256), which rows were and were not evaluated and why (a sample, --until-ci, a job still
// running, cancelled or failed), the spacing volumes were scored with, and the three throughputs,
// each named for what it measures.
#ifndef TALLY_SERVER_REPORT_REPORT_FACTS_H_
#define TALLY_SERVER_REPORT_REPORT_FACTS_H_

#include <string>
#include <vector>

#include "server/report/report_data.h"

namespace tally {

struct ReportFact {
  std::string label;  // "Model", "Rows", ...
  std::string text;
  std::string path;   // A file the fact names (shown as code), or empty.
  bool strong = false;
};

// The facts in the order the reports show them.
std::vector<ReportFact> JobFacts(const ReportData& d);

// Rows of the manifest neither evaluated nor failed, and why ("" when there are none): "14 not
// evaluated (sampled: 34 of 48 rows (--sample 30%))", "... (the job is still running: a partial
// report)", "... (the job was cancelled before them)".
int64_t RowsNotEvaluated(const ReportData& d);
std::string NotEvaluatedReason(const ReportData& d);

// The failures section's sentence when no row failed: "None: every manifest row was evaluated." only
// when that is so; else what was and was not.
std::string NoFailuresStatement(const ReportData& d);

// The spacings volumes were scored with: "each volume's header: 0.8,0.8,2 (z,y,x) in 10 volumes",
// "--spacing 1,1,3 (flag)", "" for 2D jobs.
std::string SpacingText(const ReportData& d);

// Throughputs: rows over the time from submission to the last result (start-up and queueing
// included; report.json images_per_second), from the first row leased (what `tally status` and
// `tally run` show), and summed over the workers' own rates while they evaluated.
struct Throughputs {
  double since_submission = 0, since_first_lease = 0, workers = 0;
  double seconds_since_submission = 0, seconds_since_first_lease = 0;
};
Throughputs JobThroughputs(const ReportData& d);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_FACTS_H_
