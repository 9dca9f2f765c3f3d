#include "worker/scoring/row_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/flag_util.h"

namespace tally {

int64_t ScoringRowBytes(const RowMemoryInputs& in) {
  const int64_t n = in.voxels;
  // Reading the second map: the first map's labels, its own labels and its stored voxels.
  const int64_t read = n * (2 + 2 + in.stored_bytes_per_voxel) + in.file_bytes;
  int64_t peak = read;
  if (in.panoptic) peak = std::max(peak, n * 2 * (3 + 4 + 2) + 2 * in.file_bytes);
  if (in.coco) peak = std::max(peak, n * (2 + 2 + (in.thumbnail ? 1 : 0)));
  // Calibration: both maps' labels, the probability map as stored (at most 8 bytes a voxel) and as
  // float32, two classes' probabilities, the labels as int16; a row's fine histogram (3 x 65536 x 2).
  if (in.calibration) peak = std::max(peak, read + n * (8 + 4 + 8 + 4) + (int64_t{3} << 20));
  if (in.lesions) peak = std::max(peak, n * (2 + 2 + 1 + 1 + 4 + 4 + (in.lesion_dilation > 0 ? 6 : 0)));
  return peak;
}

std::string RowOverBudget(int64_t bytes, int64_t budget, const std::string& what) {
  if (budget <= 0 || bytes <= budget) return "";
  return absl::StrCat("needs about ", FormatBytes(bytes), " for ", what, "; this worker may use ", FormatBytes(budget),
                      " (--max-worker-memory)");
}

bool MemoryGate::FitsLocked(int64_t bytes) const { return rows_ == 0 || in_use_ + bytes <= budget_; }

namespace {
struct Ask {
  const MemoryGate* gate;
  int64_t bytes;
};
}  // namespace

// Await's condition runs with mu_ held.
bool MemoryGate::Fits(const void* ask) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const Ask* a = static_cast<const Ask*>(ask);
  return a->gate->FitsLocked(a->bytes);
}

int64_t MemoryGate::Acquire(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Ask ask{this, bytes};
  mu_.Await(absl::Condition(+[](Ask* a) { return Fits(a); }, &ask));
  in_use_ += bytes;
  ++rows_;
  return bytes;
}

void MemoryGate::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_ -= bytes;
  --rows_;
}

}  // namespace tally
