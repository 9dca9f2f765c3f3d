#include "server/report_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tally {

std::string ReportData::WorstImage(int64_t index) const {
  for (const auto& [i, image] : worst_images) {
    if (i == index) return image;
  }
  return "";
}

absl::StatusOr<ReportData> GatherReportData(JobStore* store, const JobRecord& record, const ReportRowFn& on_row) {
  ReportData d;
  d.record = &record;
  ASSIGN_OR_RETURN(d.config, JobConfigFromSpec(record.job.spec()));
  d.num_classes = record.job.num_classes();
  AggregateOptions agg_options;
  agg_options.num_classes = d.num_classes;
  agg_options.metrics = d.config.metrics;
  agg_options.include_background = d.config.include_background;
  Aggregator aggregator(agg_options);
  std::vector<std::pair<int64_t, std::string>> images_by_index;  // For the worst-case tables.
  RETURN_IF_ERROR(store->ForEachResult(
      record.job.job_id(), [&](const v1::ImageResult& r, const std::string& id, const std::string& image) {
        if (!r.error().empty()) {
          d.failures.push_back({r.index(), id, image, r.error()});
          ++d.failed;
          return absl::OkStatus();
        }
        ++d.evaluated;
        if (r.nonfinite() > 0) {
          ++d.nonfinite_images;
          d.nonfinite_values += r.nonfinite();
        }
        d.mask_max_label = std::max(d.mask_max_label, r.mask_max_label());
        d.mask_ignored += r.mask_ignored_pixels();
        aggregator.Add(r);
        images_by_index.emplace_back(r.index(), image);
        on_row(r, id, image);
        return absl::OkStatus();
      }));
  d.aggregate = aggregator.Finish();
  for (const ClassAggregate& ca : d.aggregate.classes) {
    for (const auto& [dice, index] : ca.worst) {
      auto it = std::lower_bound(images_by_index.begin(), images_by_index.end(), std::make_pair(index, std::string()));
      if (it != images_by_index.end() && it->first == index) d.worst_images.emplace_back(index, it->second);
    }
  }
  ASSIGN_OR_RETURN(d.workers, store->ReadWorkers(record.job.job_id()));
  const double end = record.last_result_unix > 0 ? record.last_result_unix : record.job.finished_unix();
  d.wall_seconds = std::max(0.0, end - record.job.created_unix());
  if (d.evaluated > 0 && d.mask_max_label <= 0 && d.mask_ignored > 0) {
    // A binary mask stored as 0/255 with 255 the ignore value: its whole foreground is ignored.
    d.warnings.push_back(absl::StrCat(
        "every reference mask holds only 0 and the ignore value ", d.config.ignore_index, " (", d.mask_ignored,
        " pixels ignored): if ", d.config.ignore_index, " marks the foreground, pass --label-map 0:0,",
        d.config.ignore_index, ":1 (or --ignore-index none)"));
  }
  return d;
}

}  // namespace tally
