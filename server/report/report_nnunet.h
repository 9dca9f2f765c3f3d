// summary.json in nnU-Net v2's layout (nnunetv2/evaluation/evaluate_predictions.py,
// compute_metrics_on_folder), for tooling that reads nnU-Net's evaluation:
//   {"foreground_mean": {metric: value}, "mean": {key: {metric: value}},
//    "metric_per_case": [{"metrics": {key: {metric: value}}, "prediction_file": ..., "reference_file": ...}]}
// Metrics per case and key: Dice, IoU (NaN when tp + fp + fn = 0), FP, TP, FN, TN, n_pred = tp + fp,
// n_ref = tp + fn. `mean`: NaN-skipping mean over cases (np.nanmean); `foreground_mean`: the mean
// of `mean` over every key but 0 (np.mean: a NaN class mean makes it NaN). Keys: the classes
// evaluated (1..N-1, and 0 with include_background) as "1", or with --regions each region as
// nnU-Net's str() of it: "(1, 2)" for several labels, "2" for one. Written as Python's json.dump
// with indent=4 and sort_keys=True writes it (NaN as NaN, floats in repr form), per case in
// manifest order; file paths are the resolved paths of the mask and prediction.
#ifndef TALLY_SERVER_REPORT_REPORT_NNUNET_H_
#define TALLY_SERVER_REPORT_REPORT_NNUNET_H_

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job/job_config.h"
#include "server/store/job_store.h"

namespace tally {

// Python's repr() of a float (json.dump's form): shortest round-trip digits, "1.0", "1e-05", "NaN".
std::string PythonFloatRepr(double v);

class NnunetSummary {
 public:
  NnunetSummary(const JobConfig& config, int num_classes);
  ~NnunetSummary();
  NnunetSummary(const NnunetSummary&) = delete;
  NnunetSummary& operator=(const NnunetSummary&) = delete;

  // One evaluated case (results in manifest order; failed rows are not cases).
  void Add(const v1::ImageResult& result, const RowNames& names);
  absl::Status Write(const std::string& path);

 private:
  static constexpr int kMetrics = 8;  // Dice, FN, FP, IoU, TN, TP, n_pred, n_ref (sorted names).
  struct Key {
    int class_id;
    std::string name;
  };
  std::vector<Key> keys_;  // In sorted order of their names (sort_keys).
  std::vector<std::array<double, kMetrics>> sum_, compensation_;
  std::vector<std::array<int64_t, kMetrics>> count_;
  std::FILE* cases_ = nullptr;  // metric_per_case entries, streamed to a temporary file.
  int64_t num_cases_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_NNUNET_H_
