// The report files, one renderer per format, all from the same ReportData (report_data.h). Formats
// are specified in docs/reports.md "Reports".
#ifndef TALLY_SERVER_REPORT_REPORT_FORMATS_H_
#define TALLY_SERVER_REPORT_REPORT_FORMATS_H_

#include <cstdint>
#include <map>
#include <string>

#include "base/json_writer.h"
#include "server/report/report_data.h"

namespace tally {

std::string ReportJson(const ReportData& d);      // report.json
std::string ReportMarkdown(const ReportData& d);  // summary.md
std::string ReportHtml(const ReportData& d);      // report.html: self-contained, inline CSS and SVG

// --group-by and --find-slices (report_groups_render.cc): report.json's "groups" and "slices",
// groups.csv (one line per table, group, class and metric), and the Markdown and HTML sections.
void GroupsJson(const ReportData& d, JsonWriter& w);
std::string GroupsCsv(const ReportData& d);
std::string GroupsMarkdown(const ReportData& d);
std::string GroupsHtml(const ReportData& d);

// --metrics calibration (report_calibration.cc): report.json's "calibration", the Markdown and HTML
// sections ("" for other jobs).
void CalibrationJson(const ReportData& d, JsonWriter& w);
std::string CalibrationMarkdown(const ReportData& d);
std::string CalibrationHtml(const ReportData& d);

// per_image.csv, streamed: one row per evaluated image and class, in index order.
class PerImageCsv {
 public:
  explicit PerImageCsv(const JobConfig& config) : config_(config) {
    for (const JobConfig::CocoCategory& c : config.coco_categories) categories_[c.id] = c.name;
  }
  std::string Header() const;
  // The rows of one evaluated image.
  std::string Rows(const v1::ImageResult& r, const RowNames& names) const;

 private:
  const JobConfig& config_;
  std::map<int64_t, std::string> categories_;  // Instance jobs: the classes that are categories, by id.
};

// lesions.csv (jobs with lesion_ metrics), streamed: every lesion of every evaluated image, in index
// order, then by class as the worker listed them (metrics/lesion.h).
std::string LesionCsvHeader();
std::string LesionCsvRows(const JobConfig& config, const v1::ImageResult& r, const RowNames& names);

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_FORMATS_H_
