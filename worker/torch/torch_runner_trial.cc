// TorchRunner: the --channels-last auto trial: both layouts timed on the first batch (before it, or
// beside the evaluation on a copy of the weights warmed on a thread of its own), the answer kept
// per network and shape.
#include "worker/torch/torch_runner.h"

namespace tally {
namespace torch_internal {

// The 4-D parameters of `module` (convolution weights) in the given memory layout, in place.
void SetParameterLayout(torch::jit::Module& module, bool channels_last) {
  c10::InferenceMode guard;
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  for (at::Tensor p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(format));
  }
}

void TorchRunner::SetChannelsLast(bool on) {
  if (package_) {  // Its layout was fixed when it was exported.
    if (on) Log("model ", options_.model_path, ": channels-last does not apply to an AOTInductor package; kept as exported");
    return;
  }
  if (beside_) {
    // A trial's copy in the layout asked for: adopted, with the thread whose plans are warm.
    std::unique_ptr<BesideTrial> t = std::move(beside_);
    if (on != channels_last_ && t->channels_last == on && t->thread && t->warm.HasBeenNotified() &&
        t->failed.empty()) {
      module_ = t->module;
      channels_last_ = on;
      launch_thread_ = std::move(t->thread);
      return;
    }
  }
  if (on == channels_last_) return;
  SetParameterLayout(module_, on);
  channels_last_ = on;
}

std::string TorchRunner::TrialShape(const BatchSpec& batch) const {
  return absl::StrCat(batch.items.size(), " x ", batch.items[0].height, "x", batch.items[0].width, " ",
                      options_.precision);
}

bool TorchRunner::KeptTrial(const std::string& shape, std::string* choice, std::string* trial) {
  if (auto it = trials_.find(shape); it != trials_.end()) {
    *choice = it->second.first;
    *trial = it->second.second;
    return true;
  }
  // An earlier process's trial of this model, options, shape, GPU and libraries.
  const std::string cache_file = TrialCacheFile(shape);
  if (cache_file.empty()) return false;
  std::ifstream in(cache_file);
  std::string c, text;
  if (!std::getline(in, c) || !std::getline(in, text) || (c != "on" && c != "off")) return false;
  *choice = c;
  *trial = absl::StrCat(text, " (kept from an earlier trial on this machine: ", cache_file, ")");
  trials_[shape] = {*choice, *trial};
  return true;
}

double TorchRunner::TimePasses(torch::jit::Module& module, bool channels_last, const BatchSpec& batch, int warm,
                               int timed) {
  // No CUDA graph is captured or replayed while a layout is timed: the passes measure the eager
  // launch, and a trial's thread launching on the stream a capture records would end up in it.
  timing_passes_.fetch_add(1);
  absl::Cleanup done = [this] { timing_passes_.fetch_sub(1); };
  for (int k = 0; k < warm; ++k) {
    auto p = LaunchWith(module, channels_last, batch);
    if (!p.ok() || !(*p)->Wait().ok()) return -1;
  }
  double best = 1e30;
  for (int k = 0; k < timed; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto p = LaunchWith(module, channels_last, batch);
    if (!p.ok() || !(*p)->Wait().ok()) return -1;
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::string TorchRunner::DecideLayout(const std::string& shape, double cl, double contiguous, const std::string& how,
                                      std::string* trial) {
  bool on = cl < 0.97 * contiguous;
  *trial = absl::StrFormat("batch %s: %.2f ms channels-last, %.2f ms contiguous%s", shape, cl * 1e3,
                           contiguous * 1e3, how);
  if (!test_trial_choice_.empty()) {
    on = test_trial_choice_ == "on";
    absl::StrAppend(trial, "; ", on ? "on" : "off", " as TALLY_TEST_LAYOUT_TRIAL says");
  }
  trials_[shape] = {on ? "on" : "off", *trial};
  const std::string cache_file = TrialCacheFile(shape);
  if (!cache_file.empty()) {
    absl::Status s = MakeDirs(options_.trial_cache_dir);
    if (s.ok()) s = WriteFileAtomically(cache_file, absl::StrCat(on ? "on" : "off", "\n", *trial, "\n"));
    if (!s.ok()) Log("the layout trial is not kept for later runs: ", s.message());
  }
  return on ? "on" : "off";
}

std::string TorchRunner::TrialLayout(const BatchSpec& batch, std::string* trial) {
  if (!LayoutTrialsHere() || batch.items.empty()) return "";
  const std::string shape = TrialShape(batch);
  std::string choice;
  if (KeptTrial(shape, &choice, trial)) return choice;
  // Per layout: warm-up passes (TorchScript specialises on the new strides, cuDNN plans), then the
  // best of a few timed passes.
  const bool before = channels_last_;
  SetChannelsLast(false);
  const double contiguous = TimePasses(module_, false, batch, 3, 3);
  SetChannelsLast(true);
  const double cl = TimePasses(module_, true, batch, 3, 3);
  SetChannelsLast(before);
  if (contiguous < 0 || cl < 0) return "";  // The batch fails in a layout: leave the choice alone.
  return DecideLayout(shape, cl, contiguous, "", trial);
}

bool TorchRunner::PrepareLayoutTrial(const BatchSpec& batch) {
  if (!LayoutTrialsHere() || batch.items.empty()) return false;
  const std::string shape = TrialShape(batch);
  std::string choice, text;
  if (KeptTrial(shape, &choice, &text)) return false;
  CancelLayoutTrial();
  auto t = std::make_unique<BesideTrial>();
  t->shape = shape;
  t->channels_last = !channels_last_;
  // The batch's bytes: the staging buffer goes back to the pipeline.
  size_t image_end = 0, mask_end = 0;
  for (const BatchImage& it : batch.items) {
    const size_t pixels = static_cast<size_t>(it.height) * it.width;
    image_end = std::max(image_end, it.image_offset + 3 * pixels);
    mask_end = std::max(mask_end, it.mask_offset + pixels);
  }
  t->images = AllocateHost(image_end);
  t->masks = AllocateHost(2 * mask_end);
  std::memcpy(t->images->data(), batch.images->data(), image_end);
  std::memcpy(t->masks->data(), batch.masks->data(), 2 * mask_end);
  t->batch = batch;
  t->batch.images = t->images.get();
  t->batch.masks = t->masks.get();
  for (BatchImage& it : t->batch.items) it.row = nullptr;
  beside_ = std::move(t);
  return true;
}

double TorchRunner::TimeCurrentLayout(const BatchSpec& batch, double* first) {
  double best = 1e30;
  for (int k = 0; k < 2; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto p = Launch(batch);
    if (!p.ok() || !(*p)->Wait().ok()) return -1;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k == 0) *first = t;
    best = std::min(best, t);
  }
  return best;
}

std::string TorchRunner::SkipLayoutTrial(int64_t rows, double first_batch_seconds) {
  if (!beside_ || rows <= 0) return "";
  if (!test_trial_choice_.empty() && test_trial_cost_ < 0) return "";
  const BatchSpec& batch = beside_->batch;
  double first = 0;
  const double pass = TimeCurrentLayout(batch, &first);
  if (pass < 0) return "";  // The trial finds out what fails.
  if (first_batch_seconds < 0) first_batch_seconds = first;
  // What the trial costs: the other layout's first pass (kernels built, cuDNN plans) with the
  // evaluation slowed beside it or rows evaluated again: twice the current layout's first batch,
  // and never less than kMinTrialSeconds; then its seven timed and warm passes. What it can save:
  // the rows' time at kMaxLayoutGain.
  const double cost = test_trial_cost_ >= 0 ? test_trial_cost_
                                            : std::max(kMinTrialSeconds, 2 * first_batch_seconds) + 7 * pass;
  const double per_row = pass / static_cast<double>(batch.items.size());
  const double saving = static_cast<double>(rows) * per_row * kMaxLayoutGain;
  if (saving >= cost) return "";
  std::string why = absl::StrFormat(
      "%d rows at %.2f ms a row (batch %s) could save at most %.1f s at %.0f%%, less than the trial's %.1f s%s", rows,
      per_row * 1e3, TrialShape(batch), saving, kMaxLayoutGain * 100, cost,
      test_trial_cost_ >= 0 ? " (TALLY_TEST_TRIAL_COST_SECONDS)"
                            : absl::StrFormat(" (the other layout's first pass: %.0f s at least, or twice the first "
                                              "batch's %.2f s; 7 passes)",
                                              kMinTrialSeconds, first_batch_seconds));
  CancelLayoutTrial();
  return why;
}

bool TorchRunner::MemoryForTrial(std::string* why) const {
  if (test_trial_inline_) {
    *why = "TALLY_TEST_LAYOUT_TRIAL says there is no room";
    return false;
  }
#if TALLY_WITH_CUDA
  if (!cuda_) return true;
  const int dev = device_.index();
  int64_t weights = 0;
  for (const at::Tensor& p : module_.parameters()) weights += static_cast<int64_t>(p.nbytes());
  for (const at::Tensor& b : module_.buffers()) weights += static_cast<int64_t>(b.nbytes());
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev);
  const int64_t allocated = stats.allocated_bytes[0].current;
  const int64_t reserved = stats.reserved_bytes[0].current;
  const int64_t peak = stats.allocated_bytes[0].peak;  // Weights and the evaluation's batches so far.
  size_t free_bytes = 0, total_bytes = 0;
  {
    c10::cuda::CUDAGuard guard(dev);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      *why = "cannot read the device's free memory";
      return false;
    }
  }
  // What this process may use: the device, or --gpu-memory-limit-gib of it. What it may still
  // take: the free memory and its cache, within that (free + cached <= total - allocated anyway).
  double capacity = static_cast<double>(total_bytes);
  if (options_.memory_limit_gib > 0) capacity = std::min(capacity, options_.memory_limit_gib * 1073741824.0);
  const double available = std::min(static_cast<double>(free_bytes) + static_cast<double>(reserved - allocated),
                                    capacity - static_cast<double>(allocated));
  // The copy of the weights and one batch's passes beside the evaluation's (at most what the
  // evaluation has used beyond its weights), with 5% of what this process may use to spare.
  const double need = static_cast<double>(weights) + static_cast<double>(std::max<int64_t>(0, peak - weights)) +
                      0.05 * capacity;
  if (available < need) {
    *why = absl::StrFormat("%.1f GiB free on the device, %.1f GiB needed beside the evaluation",
                           available / 1073741824.0, need / 1073741824.0);
    return false;
  }
#else
  (void)why;
#endif
  return true;
}

bool TorchRunner::StartLayoutTrial(std::function<void()> on_ready) {
  if (!beside_) return false;
  std::string why;
  if (!MemoryForTrial(&why)) {
    Log("layout trial: not beside the evaluation (", why, ")");
    return false;
  }
  BesideTrial* t = beside_.get();
  t->thread = std::make_unique<LaunchThread>();
  t->thread->Post([this, t, on_ready = std::move(on_ready)] {
    try {
      c10::InferenceMode guard;
      t->module = module_.deepcopy();
      SetParameterLayout(t->module, t->channels_last);
    } catch (const std::exception& e) {
      t->failed = absl::StrCat("cannot copy the model: ", ShortText(e.what()));
    }
    // Three warm-up passes, as TrialLayout's: the first builds the layout's kernels and plans.
    for (int k = 0; k < 3 && t->failed.empty() && !t->cancel; ++k) {
      auto p = LaunchWith(t->module, t->channels_last, t->batch);
      absl::Status s = p.ok() ? (*p)->Wait() : p.status();
      if (!s.ok()) t->failed = std::string(s.message());
    }
    if (test_trial_delay_ > 0 && !t->cancel) {
      std::this_thread::sleep_for(std::chrono::duration<double>(test_trial_delay_));
    }
    t->warm.Notify();
    on_ready();
  });
  return true;
}

std::string TorchRunner::FinishLayoutTrial(std::string* trial) {
  if (!beside_) return "";
  BesideTrial* t = beside_.get();
  if (!t->thread) {  // Never started beside the evaluation: the whole trial here.
    const BatchSpec batch = t->batch;
    std::unique_ptr<BesideTrial> keep = std::move(beside_);  // Its buffers, for the passes.
    return TrialLayout(batch, trial);
  }
  t->warm.WaitForNotification();
  if (!t->failed.empty()) {
    Log("layout trial: the ", t->channels_last ? "channels-last" : "contiguous", " layout failed (", t->failed,
        "); the layout stays");
    beside_.reset();
    return "";
  }
  // Each layout on the thread whose plans it built, one after the other.
  const double here = TimePasses(module_, channels_last_, t->batch, 1, 3);
  double there = -1;
  t->thread->Run([&] { there = TimePasses(t->module, t->channels_last, t->batch, 1, 3); });
  if (here < 0 || there < 0) {
    beside_.reset();
    return "";
  }
  return DecideLayout(t->shape, channels_last_ ? here : there, channels_last_ ? there : here,
                      " (the trial beside the evaluation)", trial);
}

void TorchRunner::CancelLayoutTrial() {
  if (!beside_) return;
  beside_->cancel = true;
  beside_.reset();  // Joins its thread after the pass in progress.
}

std::string TorchRunner::TrialCacheFile(const std::string& shape) const {
  // TALLY_TEST_LAYOUT_TRIAL's answers are the tests', not this machine's: never kept.
  if (options_.trial_cache_dir.empty() || options_.trial_cache_key.empty() || !test_trial_choice_.empty()) return "";
  std::string gpu;
#if TALLY_WITH_CUDA
  gpu = absl::StrCat(at::cuda::getDeviceProperties(device_.index())->name, " cuDNN ",
                     at::detail::getCUDAHooks().versionCuDNN(), " CUDA ", at::detail::getCUDAHooks().versionCUDART());
#endif
  const std::string key = absl::StrCat(options_.trial_cache_key, "\x1e", ArchitectureFingerprint(module_), "\x1e", shape,
                                       "\x1e", gpu, "\x1e LibTorch ", TORCH_VERSION, "\x1e", options_.jit_optimize);
  return absl::StrCat(options_.trial_cache_dir, "/", Sha256Hex(key).substr(0, 32), ".txt");
}

}  // namespace torch_internal
}  // namespace tally
