// The coordinator's jobs as a follow sees them (FollowJobs of server/follow/follow_manager.h), and
// the per-row value of a follow's metric:
//   dice | iou          the row's mean over its foreground classes (every class with
//                       --include-background) of the class's Dice (IoU), each as the job's
//                       --empty-score makes it; classes without a value are left out
//   dice:K | iou:K      class K's alone
// A row that failed, or has no value, has none (NaN). A job's value is the mean of its rows' values,
// and its 95 % interval the betting interval of metrics/bounded_mean.h over them in the job's order.
#ifndef TALLY_SERVER_FOLLOW_FOLLOW_JOBS_H_
#define TALLY_SERVER_FOLLOW_FOLLOW_JOBS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "proto/tally.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/follow/follow_manager.h"

namespace tally {

// INVALID_ARGUMENT naming the metric when it is none of the above.
absl::Status CheckFollowMetric(const std::string& metric);
// The row's value of `metric` (CheckFollowMetric'd) under the job's settings; NaN where it has none.
double FollowRowValue(const v1::ImageResult& row, const std::string& metric, const JobConfig& config);

class CoordinatorFollowJobs final : public FollowJobs {
 public:
  explicit CoordinatorFollowJobs(Coordinator* core) : core_(core) {}
  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec, const std::string& owner) override;
  absl::StatusOr<FollowJobView> View(const std::string& job_id, const std::string& metric) override;
  absl::StatusOr<std::vector<double>> RowValues(const std::string& job_id, const std::string& metric) override;
  absl::StatusOr<std::vector<std::pair<int64_t, double>>> OrderedValues(const std::string& job_id,
                                                                     const std::string& metric,
                                                                     int64_t first) override;
  absl::Status Cancel(const std::string& job_id, const std::string& reason) override;

 private:
  Coordinator* const core_;
};

}  // namespace tally

#endif  // TALLY_SERVER_FOLLOW_FOLLOW_JOBS_H_
