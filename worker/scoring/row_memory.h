// The host memory a scoring row holds at its peak (worker/scoring/scoring.h), estimated before any
// pixel is read from the sizes its files declare, and the gate that keeps the rows in progress on a
// worker within its budget (--max-worker-memory; worker/pipeline/memory_budget.h).
//
// Measured (tests/integration/test_hostile.py checks each kind within 20 % of the worker's peak
// resident memory), per voxel of the row:
//   - every row: both label maps as uint16 (2 + 2) and, while a map is read, its file's voxels as
//     stored (a NIfTI data type's size; 1 for a PNG) and the file's bytes;
//   - lesion metrics: both binary masks of a class (1 + 1) and both maps' component labels as int32
//     (4 + 4), and with --lesion-dilation > 0 the dilation's box-local masks (6; the box is taken as
//     the whole volume);
//   - panoptic rows: per PNG its RGB pixels (3) and segment ids (uint32, 4) beside the category
//     maps (2);
//   - COCO rows: both maps (2 + 2) and the outcome picture of a thumbnail (1); rasterising a
//     polygon is checked on its own before it is walked (metrics/coco_rle.h PolygonWalkBytes).
// Components beyond the voxels (lesion records, boxes) cost kLesionBytesPerComponent each and are
// checked once they are counted (metrics/lesion.h LesionOptions::max_component_bytes).
#ifndef TALLY_WORKER_SCORING_ROW_MEMORY_H_
#define TALLY_WORKER_SCORING_ROW_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tally {

struct RowMemoryInputs {
  int64_t voxels = 0;                  // Of one map (the row's size).
  int64_t stored_bytes_per_voxel = 1;  // The larger of the two files' (NIfTI data type size, 1 for PNG).
  int64_t file_bytes = 0;              // The larger of the two files'.
  bool lesions = false;
  int lesion_dilation = 0;
  bool panoptic = false;
  bool coco = false;
  bool thumbnail = false;  // A thumbnail may be drawn (COCO rows: its outcome picture).
  bool calibration = false;  // A probability map is read beside (worker/scoring/probabilities.h).
};

int64_t ScoringRowBytes(const RowMemoryInputs& in);

// "needs about 3.8 GiB for 512x512x1024 voxels with lesion metrics; this worker may use 1.0 GiB
// (--max-worker-memory)": why a row cannot run within `budget`, or "" when it can.
std::string RowOverBudget(int64_t bytes, int64_t budget, const std::string& what);

// Rows in progress hold their estimates here: a row waits until its bytes fit beside the others'
// (one row at a time is always let in, so a row that fits alone never waits for ever). Thread-safe.
class MemoryGate {
 public:
  explicit MemoryGate(int64_t budget) : budget_(budget) {}
  int64_t budget() const { return budget_; }
  // Blocks until `bytes` fit; returns what Release must be given.
  int64_t Acquire(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool FitsLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Fits(const void* ask);
  const int64_t budget_;
  absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int rows_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tally

#endif  // TALLY_WORKER_SCORING_ROW_MEMORY_H_
