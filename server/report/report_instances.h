// COCO instance jobs' part of the report (docs/instances.md "Instances"): every evaluated row's per-category
// records (workers' CocoImageRecord) gathered in index order and accumulated as COCOeval does
// (metrics/coco_eval.h), so the 12 numbers, AP per category and the precision-recall curves are the
// same for any number of workers; per category the instance counts at IoU 0.5; the images with the
// lowest instance F1.
#ifndef TALLY_SERVER_REPORT_REPORT_INSTANCES_H_
#define TALLY_SERVER_REPORT_REPORT_INSTANCES_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/job/job_config.h"
#include "metrics/coco_eval.h"
#include "metrics/panoptic.h"
#include "proto/tally.pb.h"

namespace tally {

struct InstanceCategory {
  int64_t id = 0;
  std::string name;
  int64_t references = 0, detections = 0;  // As given (crowd included; detections before the cut at 100).
  int64_t tp50 = 0, fp50 = 0, fn50 = 0;     // At IoU 0.5, all areas, 100 detections per image.
  double ap = -1, ap50 = -1, ap75 = -1;     // -1: no reference that counts.
  std::vector<double> precision50, precision75;  // At the 101 recall thresholds (all areas, 100 detections).
};

struct InstanceReport {
  bool present = false;
  std::array<double, 12> stats{};  // kCocoStatNames order.
  std::vector<InstanceCategory> categories;  // By id.
  int64_t images = 0;                        // Evaluated rows.
  // Rows with a reference or a detection, by instance F1 at IoU 0.5 (2TP / (2TP + FP + FN) over
  // their categories), lowest first (ties by index); at most kWorstInstanceImages.
  struct Worst {
    double f1 = 0;
    int64_t index = 0;
    int64_t tp = 0, fp = 0, fn = 0;
  };
  std::vector<Worst> worst;
};

inline constexpr size_t kWorstInstanceImages = 10;

// Panoptic jobs: PQ, SQ and RQ (metrics/panoptic.h), the images' records summed in index order.
struct PanopticReport {
  bool present = false;
  int64_t images = 0;
  PanopticSummary summary;
  std::vector<JobConfig::CocoCategory> categories;  // The reference file's, in its order.
};

class PanopticAccumulator {
 public:
  explicit PanopticAccumulator(const JobConfig& config) : config_(config) {}
  void Add(const v1::ImageResult& r);
  PanopticReport Finish() const;

 private:
  const JobConfig& config_;
  std::vector<PanopticImageStats> images_;
};

class InstanceAccumulator {
 public:
  explicit InstanceAccumulator(const JobConfig& config) : config_(config) {}
  void Add(const v1::ImageResult& r);
  // Takes `other`'s images (any split of a job's rows, in any order: the evaluation orders each
  // category's images by image id, and the worst images by F1 and index).
  void Merge(InstanceAccumulator* other);
  InstanceReport Finish();

 private:
  const JobConfig& config_;
  std::deque<CocoImageEval> evals_;  // A deque: no copies as it grows (a COCO job has an entry per image and category).
  std::vector<InstanceReport::Worst> worst_;
  std::map<int64_t, std::array<int64_t, 5>> counts_;  // references, detections, tp50, fp50, fn50.
  int64_t images_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_REPORT_INSTANCES_H_
