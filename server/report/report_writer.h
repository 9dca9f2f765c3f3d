// Builds a job's report files from the database: report.json, per_image.csv, summary.md and
// report.html. The data is gathered once (report_data.h); each format renders it
// (report_formats.h). Blocking; safe to call from any thread.
#ifndef TALLY_SERVER_REPORT_REPORT_WRITER_H_
#define TALLY_SERVER_REPORT_REPORT_WRITER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job/report_files.h"
#include "server/store/job_store.h"
#include "server/report/report_data.h"

namespace tally {

// Writes the four files into `dir` (created if needed), each atomically (temp file + rename).
// `outcome` (optional) receives the per-class table and the warnings.
absl::Status WriteReports(JobStore* store, const JobRecord& record, const std::string& dir,
                          ReportOutcome* outcome = nullptr);
// The report over several jobs' rows as one set (GatherMergedReportData); `record` describes it.
absl::Status WriteMergedReports(JobStore* store, const std::vector<const JobRecord*>& parts, const JobRecord& record,
                                const std::string& dir, ReportOutcome* outcome = nullptr);

// The files rendered from gathered data: report.json, summary.md and report.html (per_image.csv
// and the optional files are the caller's); `outcome` as above.
absl::Status WriteReportFiles(const ReportData& d, const std::string& dir, ReportOutcome* outcome);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_WRITER_H_
