// A worker's host-memory budget and what a row costs against it. Found by probing: one
// 4000x4000 PNG made a CPU worker peak at 2.7 GB, and a default --max-image-pixels admits images
// that would need some 40 GB, so the kernel killed the worker instead of Tally failing the row.
//
// The budget is --max-worker-memory, or by default the cgroup's limit (else physical memory) less
// what the process holds once its model is loaded. A row's cost is estimated from its size as its
// header declares it: the host's own buffers (decoded image and mask, staging, metrics) at
// kHostBytesPerPixel, plus, on a CPU runner, the model's tensors as measured by probe passes at two
// sizes when the job starts (ModelRunner::MeasureHostBytes): fixed + per_pixel x pixels. GPU
// runners' tensors live on the device (out-of-memory there splits batches), and a Python model's
// in its stub process: neither counts here.
#ifndef TALLY_WORKER_PIPELINE_MEMORY_BUDGET_H_
#define TALLY_WORKER_PIPELINE_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

// Decoded RGB (3) and mask (2) with the file's bytes, their copy in a staging slot (5), the mask's
// preparation and the CPU's metrics on it (labels, edges): bytes per pixel of a row on the host,
// besides the model's tensors.
inline constexpr double kHostBytesPerPixel = 16;

struct MemoryModel {
  double host_bytes_per_pixel = kHostBytesPerPixel;
  // The model's host tensors for a launch: fixed + per_pixel x (input pixels of its rows). Zero
  // where they are not the worker's (GPU, Python) or not measured.
  double model_fixed_bytes = 0;
  double model_bytes_per_pixel = 0;
  int64_t model_input_pixels = 0;  // > 0: every input is resized to this many pixels (--input-size).
  // What a launch of rows of these sizes needs (pixels each), the rows' own buffers included.
  int64_t LaunchBytes(const std::vector<int64_t>& pixels) const;
};

// From the model's host bytes at two input sizes (pixels, bytes), measured on probe passes: the
// line through them, never negative. With one size (p2 <= 0), a fixed cost.
void FitModelBytes(int64_t p1, int64_t bytes1, int64_t p2, int64_t bytes2, MemoryModel* model);

// Why a row of height x width cannot run within `budget` bytes, or "" when it can.
std::string RowTooLarge(const MemoryModel& model, int height, int width, int64_t budget);

// Rows [0, n) of a batch group, in order, cut into consecutive launches that each fit `budget` (a
// launch holds at least one row): the end of each launch. Deterministic for a given budget.
std::vector<size_t> SplitByMemory(const MemoryModel& model, const std::vector<int64_t>& pixels, int64_t budget);

// The memory this process may use: its cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes,
// where set) or else the machine's physical memory.
int64_t MemoryLimitBytes();
// "max" or a number of bytes (a cgroup's memory.max): the limit, or -1 for none.
int64_t ParseCgroupLimit(const std::string& text);
// The process's resident memory now.
int64_t ResidentBytes();

}  // namespace tally

#endif  // TALLY_WORKER_PIPELINE_MEMORY_BUDGET_H_
