#include "server/report/report_writer.h"

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "server/report/report_formats.h"
#include "server/report/report_nnunet.h"
#include "server/report/report_table.h"

namespace tally {

absl::Status WriteReports(JobStore* store, const JobRecord& record, const std::string& dir, ReportOutcome* outcome) {
  return WriteMergedReports(store, {&record}, record, dir, outcome);
}

absl::Status WriteMergedReports(JobStore* store, const std::vector<const JobRecord*>& parts, const JobRecord& record,
                                const std::string& dir, ReportOutcome* outcome) {
  RETURN_IF_ERROR(MakeDirs(dir));
  ASSIGN_OR_RETURN(const JobConfig config, JobConfigFromSpec(record.job.spec()));
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> csv, AtomicFile::Open(dir + "/per_image.csv"));
  const PerImageCsv rows(config);
  csv->out() << rows.Header();
  std::unique_ptr<AtomicFile> lesions;
  if (AnyLesionMetric(config.metrics)) {
    ASSIGN_OR_RETURN(lesions, AtomicFile::Open(dir + "/lesions.csv"));
    lesions->out() << LesionCsvHeader();
  }
  std::unique_ptr<NnunetSummary> nnunet;
  if (config.nnunet_summary) nnunet = std::make_unique<NnunetSummary>(config, record.job.num_classes());
  ASSIGN_OR_RETURN(ReportData d,
                   GatherMergedReportData(store, parts, record, [&](const v1::ImageResult& r, const RowNames& names) {
                     csv->out() << rows.Rows(r, names);
                     if (lesions) lesions->out() << LesionCsvRows(config, r, names);
                     if (nnunet) nnunet->Add(r, names);
                   }));
  RETURN_IF_ERROR(csv->Commit());
  if (lesions) RETURN_IF_ERROR(lesions->Commit());
  if (nnunet) RETURN_IF_ERROR(nnunet->Write(dir + "/summary.json"));
  return WriteReportFiles(d, dir, outcome);
}

absl::Status WriteReportFiles(const ReportData& d, const std::string& dir, ReportOutcome* outcome) {
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.json", ReportJson(d)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.md", ReportMarkdown(d)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.html", ReportHtml(d)));
  if (!d.groups.tables.empty()) RETURN_IF_ERROR(WriteFileAtomically(dir + "/groups.csv", GroupsCsv(d)));
  if (outcome != nullptr) {
    // The table `tally run` and `tally status` print, then what makes the numbers suspect and the
    // failed rows grouped by reason.
    outcome->summary = TerminalSummary(d);
    for (const std::string& w : d.warnings) absl::StrAppend(&outcome->summary, "\nWarning: ", w);
    if (!d.failure_groups.empty()) absl::StrAppend(&outcome->summary, "\nFailed rows by reason:");
    for (size_t i = 0; i < d.failure_groups.size() && i < 10; ++i) {
      absl::StrAppend(&outcome->summary, "\n  ", d.failure_groups[i].count, " x ", d.failure_groups[i].kind,
                      "\n      e.g. ", d.failure_groups[i].example);
    }
    if (d.failure_groups.size() > 10) {
      absl::StrAppend(&outcome->summary, "\n  ... ", d.failure_groups.size() - 10, " more reasons in report.json");
    }
    if (!d.warnings.empty() || !d.failure_groups.empty()) outcome->summary += "\n";
    outcome->warnings = d.warnings;
    outcome->until_ci_note = d.until_ci_note;
  }
  return absl::OkStatus();
}

}  // namespace tally
