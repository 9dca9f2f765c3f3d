// Pipeline: the worker's memory budget (worker/pipeline/memory_budget.h): the model's host bytes measured
// before the first batch, rows that cannot fit failed before their pixels are decoded, and batch
// groups cut into launches that fit.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flag_util.h"
#include "base/log.h"
#include "worker/pipeline/pipeline_internal.h"

namespace tally {
namespace {

// The probes' sizes (no --input-size): two, so that the model's fixed memory (weights in another
// layout, caches) and its per-pixel memory can be told apart.
constexpr int kProbeSmall = 256;
constexpr int kProbeLarge = 512;

}  // namespace

void Pipeline::MeasureMemory() {
  MemoryModel model;
  model.model_input_pixels = options_.input_pixels;
  // Blank rows (black images, background masks) through the model, as one-image batches: the first
  // pass warms the runner (its caches are not the rows'), the next two are measured.
  std::vector<int> sizes = options_.input_pixels > 0 ? std::vector<int>{64, 64}
                                                     : std::vector<int>{kProbeSmall, kProbeSmall, kProbeLarge};
  std::vector<std::pair<int64_t, int64_t>> measured;  // (pixels, bytes)
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int side = sizes[k];
    const size_t pixels = static_cast<size_t>(side) * side;
    std::unique_ptr<HostBuffer> images = runner_->AllocateHost(pixels * 3);
    std::unique_ptr<HostBuffer> masks = runner_->AllocateHost(pixels * 2);
    std::memset(images->data(), 0, images->size());
    std::memset(masks->data(), 0, masks->size());
    v1::ManifestRow row;
    row.set_id("memory probe");
    BatchSpec spec;
    spec.images = images.get();
    spec.masks = masks.get();
    spec.items.push_back(BatchImage{0, 0, side, side, &row});
    const int64_t bytes = runner_->MeasureHostBytes(spec);
    if (bytes < 0) break;  // The model's tensors are not this process's host memory (GPU, Python).
    if (k > 0) measured.emplace_back(static_cast<int64_t>(pixels), bytes);
  }
  if (measured.size() == 2) {
    const int64_t p2 = options_.input_pixels > 0 ? 0 : measured[1].first;
    FitModelBytes(measured[0].first, measured[0].second, p2, measured[1].second, &model);
  }
  Log("memory budget ", FormatBytes(options_.memory_budget), ": a row costs about ",
      absl::StrFormat("%.0f", model.host_bytes_per_pixel), " bytes a pixel on the host",
      measured.size() == 2 ? absl::StrFormat(", and the model %s + %.0f bytes an %s pixel", FormatBytes(
                                                 static_cast<int64_t>(model.model_fixed_bytes)),
                                             model.model_bytes_per_pixel, options_.input_pixels > 0 ? "model input" : "input")
                           : std::string(" (the model's tensors are not in this process's host memory)"));
  absl::MutexLock lock(&mu_);
  memory_model_ = model;
  memory_model_ready_ = true;
}

absl::Status Pipeline::CheckMemory(const std::string& bytes, const std::string& path, int page) {
  if (options_.memory_budget <= 0) return absl::OkStatus();
  int height = 0, width = 0;
  if (!ImageDimensions(bytes, path, &height, &width, page).ok()) return absl::OkStatus();  // Decoding says why.
  // Past --max-image-pixels the decoder refuses it before any allocation, naming that limit.
  if (static_cast<int64_t>(height) * width > options_.max_image_pixels) return absl::OkStatus();
  MemoryModel model;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&memory_model_ready_));
    model = memory_model_;
  }
  const std::string why = RowTooLarge(model, height, width, options_.memory_budget);
  if (why.empty()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("image '", path, "' ", why));
}

std::vector<std::vector<Pipeline::Item*>> Pipeline::SplitByBudget(const std::vector<Item*>& group) {
  if (options_.memory_budget <= 0 || group.size() < 2) return {group};
  MemoryModel model;
  {
    absl::MutexLock lock(&mu_);
    model = memory_model_;
  }
  std::vector<int64_t> pixels;
  for (const Item* it : group) pixels.push_back(static_cast<int64_t>(it->image->height) * it->image->width);
  std::vector<std::vector<Item*>> launches;
  size_t begin = 0;
  for (size_t end : SplitByMemory(model, pixels, options_.memory_budget)) {
    launches.emplace_back(group.begin() + begin, group.begin() + end);
    begin = end;
  }
  if (launches.size() > 1 && !split_logged_.exchange(true)) {
    Log("a batch of ", group.size(), " rows of ", group[0]->image->height, "x", group[0]->image->width,
        " runs as ", launches.size(), " launches to fit the memory budget of ", FormatBytes(options_.memory_budget),
        " (logged once per job)");
  }
  return launches;
}

}  // namespace tally
