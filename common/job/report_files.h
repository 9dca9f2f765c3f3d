// The files of a job's report folder: what tallyd writes (server/report/report_writer.h), streams
// (FetchReport) and `tally run` copies from its own tallyd's state folder.
#ifndef TALLY_COMMON_JOB_REPORT_FILES_H_
#define TALLY_COMMON_JOB_REPORT_FILES_H_

namespace tally {

inline constexpr const char* kReportFiles[] = {"report.json", "per_image.csv", "summary.md", "report.html"};
// Written when the job asks for them: summary.json in nnU-Net v2's layout (--nnunet-summary), lesions.csv
// (lesion_ metrics), groups.csv (--group-by).
inline constexpr const char* kOptionalReportFiles[] = {"summary.json", "lesions.csv", "groups.csv"};

}  // namespace tally

#endif  // TALLY_COMMON_JOB_REPORT_FILES_H_
