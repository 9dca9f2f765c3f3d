// Internal to the worker's model library (worker/torch/torch_runner*.cc, the only translation units that
// include LibTorch): the TorchScript runner behind ModelRunner (worker/interfaces/model_runner.h), its pending
// batches and host buffers. Its work is in three files: torch_runner.cc (loading a model, the
// network's fingerprint, the device's warm-up), torch_runner_launch.cc (a launch: host groups,
// upload, preprocess, forward, postprocess, results to host) and torch_runner_trial.cc (the
// --channels-last auto trial).
#ifndef TALLY_WORKER_TORCH_TORCH_RUNNER_H_
#define TALLY_WORKER_TORCH_TORCH_RUNNER_H_

#include "worker/interfaces/model_runner.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/version.h>
// AOTInductor packages (.pt2, made by `tally export`): GPU builds against LibTorch 2.6 or newer.
#if TALLY_WITH_CUDA && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6))
#define TALLY_AOTI_PACKAGES 1
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#else
#define TALLY_AOTI_PACKAGES 0
#endif
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/file_util.h"
#include "base/log.h"
#include "common/security/sha256.h"
#include "base/status_macros.h"

#if TALLY_CUDA_KERNELS
#include "metrics/gpu/calibration_kernel.h"
#include "metrics/gpu/confusion_kernel.h"
#include "metrics/gpu/surface_kernel.h"
#endif

#if TALLY_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tally {
namespace torch_internal {

#define TALLY_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The most the other memory layout has been seen to save of a forward pass, with room to spare:
// DeepLabV3 bf16 42.6 ms channels-last against 49.1 contiguous (13%), LRASPP fp32 15.0 contiguous
// against 20.5 (27%, the other way: contiguous, the default, already wins). SkipLayoutTrial counts
// on no more.
constexpr double kMaxLayoutGain = 0.3;
// The least a layout trial is taken to cost, seconds: cuDNN 9 builds channels-last kernels at run
// time, 2.0-3.2 s on LRASPP's first channels-last pass on an H100, while the first contiguous batch
// takes 0.25 s; a forced trial on 3200 LRASPP rows cost their job 0.7-1.1 s of wall and held its
// first results 2.5 s longer (BENCHMARKS.md).
constexpr double kMinTrialSeconds = 2.0;

inline std::string Shape(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

// TorchScript errors carry long source excerpts: keep the last line (the error itself, e.g.
// "RuntimeError: CUDA out of memory. ...") and the first few (where it happened).
inline std::string ShortText(const std::string& msg) {
  std::string trimmed = msg;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
  size_t cut = 0;
  for (int lines = 0; lines < 4 && cut != std::string::npos; ++lines) cut = trimmed.find('\n', cut + 1);
  if (cut == std::string::npos) return trimmed;
  const size_t last = trimmed.rfind('\n');
  return trimmed.substr(0, cut) + " ... " + trimmed.substr(last + 1);
}

inline std::string ErrorText(const c10::Error& e) { return ShortText(e.what_without_backtrace()); }

inline bool LooksLikeOom(const std::string& what) {
  return what.find("out of memory") != std::string::npos || what.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos;
}

// Out-of-memory errors from inside TorchScript arrive as a plain c10::Error whose message quotes the
// interpreter's traceback first: look at the whole message, not the shortened one.
inline bool IsOom(const c10::Error& e) { return LooksLikeOom(e.what_without_backtrace()); }

class TorchHostBuffer final : public HostBuffer {
 public:
  explicit TorchHostBuffer(at::Tensor t) : t_(std::move(t)) {}
  uint8_t* data() override { return t_.data_ptr<uint8_t>(); }
  size_t size() const override { return static_cast<size_t>(t_.numel()); }
  const at::Tensor& tensor() const { return t_; }

 private:
  at::Tensor t_;
};

class TorchPendingBatch final : public PendingBatch {
 public:
  absl::Status Wait() override {
#if TALLY_WITH_CUDA
    if (done_) {
      try {
        done_->synchronize();
      } catch (const c10::Error& e) {
        if (IsOom(e)) return absl::ResourceExhaustedError(ErrorText(e));
        return absl::InternalError(absl::StrCat("CUDA error while evaluating a batch: ", ErrorText(e)));
      }
    }
#endif
    return absl::OkStatus();
  }
  int num_classes() const override { return k_; }
  const int64_t* confusion(int i) const override { return counts_ + static_cast<size_t>(i) * k_ * k_; }
  const uint16_t* labels(int i) const override {
    return static_cast<size_t>(i) < label_ptrs_.size() ? label_ptrs_[i] : nullptr;  // None without want_labels.
  }
  bool CopyLabels(int i, size_t pixels, std::vector<uint16_t>* out) const override {
    if (static_cast<size_t>(i) < label_ptrs_.size()) return PendingBatch::CopyLabels(i, pixels, out);
    if (static_cast<size_t>(i) >= device_labels_.size()) return false;
    const auto& [group, j] = device_labels_[i];
    const at::Tensor h = group.select(0, j).to(at::kCPU).contiguous();  // The batch is done: no wait.
    if (static_cast<size_t>(h.numel()) != pixels) return false;
    const auto* p = reinterpret_cast<const uint16_t*>(h.data_ptr<int16_t>());
    out->assign(p, p + pixels);
    return true;
  }
  int64_t nonfinite(int i) const override { return nonfinite_ptr_ ? nonfinite_ptr_[i] : 0; }
  int64_t logit_ties() const override { return ties_.defined() ? ties_.item<int64_t>() : 0; }
  const int64_t* threshold_counts(int i) const override {
    return thresholds_ptr_ ? thresholds_ptr_ + static_cast<size_t>(i) * 4 * num_thresholds_ : nullptr;
  }
  const int64_t* calibration(int i) const override {
    return calibration_host_.defined() ? calibration_host_.data_ptr<int64_t>() + i * calibration_host_.size(1) : nullptr;
  }
  const int64_t* calibration_fine() const override {
    return calibration_fine_host_.defined() ? calibration_fine_host_.data_ptr<int64_t>() : nullptr;
  }
  const uint16_t* scores(int i) const override {
    return static_cast<size_t>(i) < score_ptrs_.size() ? score_ptrs_[i] : nullptr;
  }
  const double* surface(int i) const override {
    return surface_ptr_ ? surface_ptr_ + static_cast<size_t>(i) * 4 * k_ : nullptr;
  }
  std::string error(int i) const override {
    return static_cast<size_t>(i) < errors_.size() ? errors_[i] : std::string();
  }
  const std::vector<CocoInstance>* instances(int i) const override {
    return static_cast<size_t>(i) < instances_.size() ? &instances_[i] : nullptr;
  }

  int k_ = 0;
  at::Tensor counts_host_;  // [n, K, K] int64, host.
  const int64_t* counts_ = nullptr;
  std::vector<at::Tensor> labels_host_;  // int16, host.
  std::vector<const uint16_t*> label_ptrs_;
  std::vector<at::Tensor> scores_host_;  // int16, host: BatchSpec::want_scores.
  std::vector<const uint16_t*> score_ptrs_;
  std::vector<std::pair<at::Tensor, int64_t>> device_labels_;  // keep_labels: image i's group and row.
  std::vector<at::Tensor> device_inputs_;  // The device tensors copied to the ones above, until done.
  at::Tensor ties_;
  at::Tensor nonfinite_host_;  // [n] int64, host.
  const int64_t* nonfinite_ptr_ = nullptr;
  at::Tensor thresholds_host_;  // [n, T, 4] int64, host.
  const int64_t* thresholds_ptr_ = nullptr;
  size_t num_thresholds_ = 0;
  at::Tensor calibration_host_, calibration_fine_host_;  // int64, host: RunnerOptions::calibration.
  at::Tensor surface_host_;  // [n, K, 4] double, host.
  const double* surface_ptr_ = nullptr;
  // Instance outputs (docs/instances.md "Instances"): evaluated on the host, per image.
  std::vector<std::vector<CocoInstance>> instances_;
  std::vector<std::vector<uint16_t>> owned_labels_;
  std::vector<int64_t> owned_counts_;
  std::vector<std::string> errors_;
#if TALLY_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> done_;
#endif
};

// Logits from whatever the model returns: a Tensor, a tuple/list (first element), or a dict
// (key "out", as torchvision's segmentation models, or its only value).
absl::StatusOr<at::Tensor> ExtractLogits(const c10::IValue& out, const std::string& model);

// Keeps the compute stream current for the rest of a launch (CUDA only).
#if TALLY_WITH_CUDA
struct ComputeStreamScope {
  explicit ComputeStreamScope(c10::cuda::CUDAStream stream) : guard(stream) {}
  c10::cuda::CUDAStreamGuard guard;
};
#else
struct ComputeStreamScope {};
#endif

// Runs functions on a thread of its own, in order: launches made there share that thread's cuDNN
// plans, which PyTorch keeps per thread.
class LaunchThread {
 public:
  LaunchThread() : thread_([this] { Loop(); }) {}
  ~LaunchThread() {  // Runs what is queued first.
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  // Runs `fn` there and waits for it to return.
  void Run(const std::function<void()>& fn) {
    absl::Notification done;
    Post([&] {
      fn();
      done.Notify();
    });
    done.WaitForNotification();
  }

 private:
  bool WorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(this, &LaunchThread::WorkLocked));
      if (queue_.empty()) return;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: it starts once the rest is built.
};

class TorchRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelRunnerOptions& options);
  // An AOTInductor package (.pt2) in place of TorchScript (torch_package.cc): the same launches,
  // with the package's compiled kernels for the forward pass.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> CreateFromPackage(const ModelRunnerOptions& options);
  ~TorchRunner() override { CancelLayoutTrial(); }  // Before the streams and the model go.

  std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) override {
    auto opts = at::TensorOptions().dtype(at::kByte);
    if (cuda_) opts = opts.pinned_memory(true);
    return std::make_unique<TorchHostBuffer>(at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, opts));
  }

  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) override {
    if (!launch_thread_) return LaunchWith(module_, channels_last_, batch);
    absl::StatusOr<std::unique_ptr<PendingBatch>> out = absl::UnknownError("not launched");
    launch_thread_->Run([&] { out = LaunchWith(module_, channels_last_, batch); });
    return out;
  }

  // One pass of `module` (its parameters in the layout `channels_last` says) on the calling thread.
  absl::StatusOr<std::unique_ptr<PendingBatch>> LaunchWith(torch::jit::Module& module, bool channels_last,
                                                           const BatchSpec& batch) {
    std::string input_shape = "?";
    try {
      c10::InferenceMode inference;
#if TALLY_WITH_CUDA
      c10::cuda::OptionalCUDAGuard device_guard;  // Threads of the runner's own start on device 0.
      if (cuda_) device_guard.set_index(device_.index());
#endif
      EnableAutocast();
      return LaunchImpl(module, channels_last, batch, &input_shape);
    } catch (const c10::OutOfMemoryError& e) {
      return absl::ResourceExhaustedError(ErrorText(e));
    } catch (const c10::Error& e) {
      if (IsOom(e)) return absl::ResourceExhaustedError(ErrorText(e));
      return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path,
                                                        "' failed on an input of shape ", input_shape, ": ",
                                                        ErrorText(e)));
    } catch (const std::exception& e) {
      // TorchScript's interpreter rethrows errors of the ops it runs (CUDA out-of-memory included)
      // as std::runtime_error with its traceback in front.
      const std::string what = e.what();
      if (LooksLikeOom(what)) return absl::ResourceExhaustedError(ShortText(what));
      return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path,
                                                        "' failed on an input of shape ", input_shape, ": ",
                                                        ShortText(what)));
    }
  }

  // Volume jobs: the whole volume, or MONAI-style sliding windows (worker/torch/torch_volume.cc).
  absl::StatusOr<VolumePrediction> PredictVolume(const VolumeRequest& request) override {
    absl::StatusOr<VolumePrediction> out = absl::UnknownError("not run");
    auto run = [&] {
      try {
        c10::InferenceMode inference;
#if TALLY_WITH_CUDA
        c10::cuda::OptionalCUDAGuard device_guard;
        if (cuda_) device_guard.set_index(device_.index());
#endif
        EnableAutocast();
        out = SlidingWindow(request);
      } catch (const c10::Error& e) {
        out = IsOom(e) ? absl::ResourceExhaustedError(ErrorText(e))
                       : absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "': ", ErrorText(e)));
      } catch (const std::exception& e) {
        const std::string what = e.what();
        out = LooksLikeOom(what) ? absl::ResourceExhaustedError(ShortText(what))
                                 : absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "': ",
                                                                              ShortText(what)));
      }
    };
    if (launch_thread_) {
      launch_thread_->Run(run);
    } else {
      run();
    }
    return out;
  }

  void ReleaseCachedMemory() override {
#if TALLY_WITH_CUDA
    if (cuda_) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }

  void ResetPeakMemory() override {
#if TALLY_WITH_CUDA
    if (cuda_) {
      c10::cuda::CUDACachingAllocator::emptyCache();
      c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    }
#endif
  }

  absl::StatusOr<int> FindMaxBatch(int height, int width, double max_memory, int limit, int fallback) override;

  RunnerStats Stats() override {
    RunnerStats s;
    s.device = options_.device;
    s.load_seconds = load_seconds_;
#if TALLY_WITH_CUDA
    if (cuda_) {
      s.gpu_name = at::cuda::getDeviceProperties(device_.index())->name;
      auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
      s.peak_memory_bytes = stats.reserved_bytes[0].peak;  // [0] = aggregate over pool types.
      GpuUsage g{options_.device, s.gpu_name, s.peak_memory_bytes};
      // Any thread may ask (the heartbeat does): the guard makes the query about this device.
      c10::cuda::CUDAGuard guard(device_.index());
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        g.memory_used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
        g.memory_total_bytes = static_cast<int64_t>(total_bytes);
      } else {
        cudaGetLastError();  // Clear it: the next kernel launch must not see it.
      }
      s.gpus.push_back(std::move(g));
    }
#endif
    return s;
  }

  bool is_cuda() const override { return cuda_; }

  std::string TrialLayout(const BatchSpec& batch, std::string* trial) override;
  // Where TrialLayout keeps its result for `shape` across processes; "" when it keeps none (no cache
  // folder, or TALLY_TEST_LAYOUT_TRIAL).
  std::string TrialCacheFile(const std::string& shape) const;
  void SetChannelsLast(bool on) override;
  bool ChannelsLast() const override { return channels_last_; }
  bool PrepareLayoutTrial(const BatchSpec& batch) override;
  std::string SkipLayoutTrial(int64_t rows, double first_batch_seconds) override;
  bool StartLayoutTrial(std::function<void()> on_ready) override;
  std::string FinishLayoutTrial(std::string* trial) override;
  void CancelLayoutTrial() override;

  int64_t MeasureHostBytes(const BatchSpec& batch) override;

  bool ScoresSurfaceOnDevice() const override {
#if TALLY_CUDA_KERNELS
    return cuda_;
#else
    return false;
#endif
  }

 private:
  TorchRunner(ModelRunnerOptions options, at::Device device, torch::jit::Module module)
      : options_(std::move(options)),
        device_(device),
        module_(std::move(module)),
        cuda_(device.is_cuda()),
        channels_last_(options_.channels_last) {}

  // The normalisation tensors on the device; on CUDA, cuDNN's benchmark mode, the memory limit and
  // the copy and compute streams.
  void SetUpDevice();
  // TALLY_PIPELINE_PROFILE and TALLY_TEST_LAYOUT_TRIAL (tests and benchmarks).
  absl::Status ReadTestHooks();

  void EnableAutocast() {
    if (options_.precision == "fp32" || package_) return;  // A package's precision is its export's.
    const at::ScalarType dtype = options_.precision == "bf16" ? at::kBFloat16 : at::kHalf;
#if TALLY_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(device_.type(), true);
    at::autocast::set_autocast_dtype(device_.type(), dtype);
#else
    if (cuda_) {
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
#endif
  }

  // The images and masks of a batch as tensors: one group when all images have one size.
  struct Groups {
    std::vector<at::Tensor> images;  // uint8 [n, H, W, 3] per group.
    std::vector<at::Tensor> masks;   // int16 [n, H, W] per group.
    bool uniform = true;
    int64_t n = 0;
  };
  // What the device produced for a batch, before it goes back to host memory.
  struct Outputs {
    std::vector<at::Tensor> counts, labels, nonfinite, thresholds;
    std::vector<at::Tensor> calibration;  // int64 [n, CalibrationRowSize(K)] per group.
    at::Tensor calibration_fine;          // int64 [CalibrationFineSize(K)]: the whole batch.
    int64_t calibration_items = -1;       // BatchSpec::calibration_items.
    int64_t fine_images = -1;             // Of the group Postprocess scores: its images counted there (-1: all).
    bool want_scores = false;         // BatchSpec::want_scores.
    std::vector<at::Tensor> scores;   // int16 [n, H, W] per group: single-score outputs, quantised.
    std::vector<at::Tensor> surface;  // [n, K, 4] double per group, when asked for and computed.
    bool surface_missing = false;     // Asked for but not computed for some group.
    bool on_kernels = true;           // Every group scored by the fused kernels (metrics/gpu/).
    at::Tensor ties;
    int k = 0;
  };

  // The steps of one launch.
  absl::StatusOr<std::unique_ptr<PendingBatch>> LaunchImpl(torch::jit::Module& module, bool channels_last,
                                                           const BatchSpec& batch, std::string* input_shape);
  absl::StatusOr<Groups> HostGroups(const BatchSpec& batch) const;
  // On CUDA: copies on the copy stream, then makes the compute stream current for as long as
  // `compute` lives, waiting for the copies. On CPU: the host tensors themselves.
  Groups Upload(const Groups& host, std::unique_ptr<ComputeStreamScope>* compute);
  at::Tensor Preprocess(const Groups& dev, bool channels_last) const;
  // The shape of the model's input for n images of h x w: [n, 3, H', W'] after Preprocess's resize
  // (--input-height/width). The graph path names a batch's input without running Preprocess.
  std::string ModelInputShape(int64_t n, int64_t h, int64_t w) const;
  // ABORTED when the model raises (out-of-memory errors propagate as exceptions).
  absl::StatusOr<c10::IValue> Forward(torch::jit::Module& module, const at::Tensor& x, const std::string& input_shape);
  // PredictVolume's work on the launching thread (worker/torch/torch_volume.cc).
  absl::StatusOr<VolumePrediction> SlidingWindow(const VolumeRequest& request);
  // A model returning torchvision's detections (a list of dicts with masks, scores, labels, one per
  // image; or a tuple ending with one): the batch's instances on the host, their label maps and
  // counts against the references (worker/torch/torch_runner_launch.cc). Null for other outputs.
  absl::StatusOr<std::unique_ptr<PendingBatch>> InstancesToHost(const c10::IValue& out, const BatchSpec& batch);

  // Layout trials. "batch 32 x 512x512 fp32": what a trial is kept under.
  std::string TrialShape(const BatchSpec& batch) const;
  // An answer for `shape` from this process or, on disk, an earlier one; false when none.
  bool KeptTrial(const std::string& shape, std::string* choice, std::string* trial);
  // The best of `timed` passes of `batch` after `warm` untimed ones (seconds; -1 when a pass fails).
  double TimePasses(torch::jit::Module& module, bool channels_last, const BatchSpec& batch, int warm, int timed);
  // Channels-last must win by 3%: the default layout is kept when the two are within noise of each
  // other, so repeated trials agree. Keeps the answer (this process, and on disk); "on" or "off".
  std::string DecideLayout(const std::string& shape, double cl, double contiguous, const std::string& how,
                           std::string* trial);
  // Where layout trials run: CUDA, and CPU runners under the tests' TALLY_TEST_LAYOUT_TRIAL.
  // Not for a package: its layout was fixed when it was exported.
  bool LayoutTrialsHere() const { return !package_ && (cuda_ || !test_trial_choice_.empty()); }
  // The best of two passes of `batch` as the evaluation runs it (the first may wait behind the
  // batches in flight); the first pass's time in `first`. Negative when a pass fails.
  double TimeCurrentLayout(const BatchSpec& batch, double* first);
  // Whether the device can take the trial's copy of the weights and a batch beside the evaluation.
  bool MemoryForTrial(std::string* why) const;
  // `device_labels`: compute the predicted labels (they stay on the device unless ResultsToHost
  // copies them). `surface`: surface metrics on the device, where the kernels can.
  absl::Status PostprocessGroups(const at::Tensor& logits, const Groups& dev, const std::string& input_shape, bool device_labels,
                                 const SurfaceRequest& surface, Outputs* outputs);
  // Counts and the rest to (pinned) host memory; the labels too with `want_labels`, else they stay
  // where they are (CopyLabels).
  std::unique_ptr<PendingBatch> ResultsToHost(const Outputs& outputs, bool want_labels);
  // Turns logits [n, C, h, w] + reference labels [n, H, W] into counts and labels for one group.
  absl::Status Postprocess(const at::Tensor& raw_logits, const at::Tensor& gt, const std::string& input_shape,
                           bool want_labels, const SurfaceRequest& surface, Outputs* o);
  // Postprocess's steps: the logits checked (shape, the class count, thresholds' single logit) and
  // brought to the mask's size in float32 (o->k set, the threshold counts taken); then counts and
  // labels by the fused CUDA kernels where they apply (false where they do not), else by torch ops.
  absl::StatusOr<at::Tensor> CheckLogits(const at::Tensor& raw_logits, const at::Tensor& gt, const std::string& input_shape,
                                         Outputs* o);
  bool PostprocessOnKernels(const at::Tensor& logits, const at::Tensor& gt, bool want_labels,
                            const SurfaceRequest& surface, Outputs* o);
  void PostprocessWithTorch(const at::Tensor& logits, const at::Tensor& gt, bool want_labels, Outputs* o);
  // RunnerOptions::calibration: the probabilities' counts of one group (metrics/calibration.h).
  void CountCalibrationOf(const at::Tensor& logits, const at::Tensor& gt, Outputs* o) const;
  // Threshold sweep of a single-logit output: [n, T, 4] tp, fp, fn, tn of the foreground class.
  at::Tensor ThresholdCounts(const at::Tensor& logits, const at::Tensor& gt) const;

  // The model gave a single score a pixel (its last eager launch): want_scores batches run eager,
  // where the scores are taken (a CUDA graph holds no scores).
  std::atomic<bool> single_score_{false};
  const ModelRunnerOptions options_;
  const at::Device device_;
  torch::jit::Module module_;  // Empty for a package.
  // An AOTInductor package runs instead of module_ (torch_package.cc), for inputs
  // [1..batch_max, 3, height, width] as its metadata (tally export) says.
  struct Package {
#if TALLY_AOTI_PACKAGES
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
#endif
    int64_t batch_max = 0, height = 0, width = 0;
    bool batch_dynamic = true;  // Else exactly batch_max: a smaller batch is padded with zeros.
    std::string describe;  // For messages: "[1..32, 3, 512, 512], bf16, exported by torch 2.11".
  };
  std::unique_ptr<Package> package_;
  // The package's forward pass on the current stream, after checking `x` against what it was
  // exported for (an input of another shape would be read out of bounds: the package does not check).
  absl::StatusOr<c10::IValue> RunPackage(const at::Tensor& x, const std::string& input_shape);
  // `call()`, a forward pass (TorchScript's or a package's), with what it raises as a status:
  // out-of-memory rethrown (Launch turns it into RESOURCE_EXHAUSTED), anything else ABORTED naming
  // the model and the input's shape.
  template <typename Call>
  auto RunGuarded(const Call& call, const std::string& input_shape) -> absl::StatusOr<decltype(call())> {
    try {
      return call();
    } catch (const c10::Error& e) {
      if (IsOom(e)) throw;
      return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' raised on an input of shape ",
                                             input_shape, ": ", ErrorText(e)));
    } catch (const std::exception& e) {
      if (LooksLikeOom(e.what())) throw;
      return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' raised on an input of shape ",
                                             input_shape, ": ", ShortText(e.what())));
    }
  }
  const bool cuda_;
  bool channels_last_;  // The layout now (options_.channels_last at first; SetChannelsLast).
  std::map<std::string, std::pair<std::string, std::string>> trials_;  // Batch shape -> (choice, trial).
  // The trial beside the evaluation (PrepareLayoutTrial ... FinishLayoutTrial).
  struct BesideTrial {
    std::string shape;
    std::unique_ptr<HostBuffer> images, masks;  // The batch's copy...
    BatchSpec batch;                             // ...pointing at them.
    bool channels_last = false;                  // The other layout.
    torch::jit::Module module;                   // Made on `thread`.
    std::atomic<bool> cancel{false};
    absl::Notification warm;  // Its warm-up passes are done, or `failed` says why not.
    std::string failed;
    std::unique_ptr<LaunchThread> thread;  // Last: joined before the rest goes.
  };
  std::unique_ptr<BesideTrial> beside_;
  // Set when SetChannelsLast adopted a trial's copy: every launch runs on its thread.
  std::unique_ptr<LaunchThread> launch_thread_;
  // TALLY_TEST_LAYOUT_TRIAL=on|off[:seconds|:inline] (tests only): trials also on CPU, with this
  // answer, ready only after `seconds` (or, `inline`, as where the device has no room for a trial
  // beside the evaluation), never kept on disk.
  std::string test_trial_choice_;
  double test_trial_delay_ = 0;
  bool test_trial_inline_ = false;
  // TALLY_TEST_TRIAL_COST_SECONDS (tests and benchmarks): the layout trial's cost SkipLayoutTrial
  // assumes instead of its estimate (0: the trial always runs). Negative: none given, and under
  // TALLY_TEST_LAYOUT_TRIAL the trial always runs.
  double test_trial_cost_ = -1;
  double load_seconds_ = 0;
  // TALLY_PIPELINE_PROFILE: the first launch's steps are timed (the device synchronised after each)
  // and logged, to show where a fresh worker's first batch goes.
  bool profile_first_launch_ = false;
  std::atomic<bool> launched_{false};  // Launches come from the batcher and, for retries, the completion thread.
  at::Tensor mean_, std_;
  std::atomic<int> timing_passes_{0};  // TimePasses calls under way, on any thread (no CUDA graphs then).
#if TALLY_WITH_CUDA
  // Uploads, the launch's work, and the copies of its results to the host (ResultsToHost says why
  // those have a stream of their own).
  std::unique_ptr<c10::cuda::CUDAStream> copy_stream_, compute_stream_, results_stream_;
  // CUDA graphs (worker/torch/torch_runner_graph.cc): the device part of a launch (preprocess,
  // forward pass, argmax and confusion counts, surface distances) captured once for the batches of
  // one shape and replayed, so that a batch costs the CPU one graph launch instead of the model's
  // kernels one by one (5-6 ms a batch for LRASPP, twice that on a busy host). Two graphs
  // alternate, each with its own inputs, so that one batch's upload overlaps the previous batch's
  // replay.
  struct GraphedLaunch {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor images, masks;  // Static inputs: [n, H, W, 3] uint8 and [n, H, W] int16 on the device.
    Outputs out;               // Static outputs, rewritten by every replay of either graph.
    std::unique_ptr<at::cuda::CUDAEvent> replayed;  // After its latest replay: its inputs are free.
  };
  // The shape and options a graph of this launch would hold; "" where none can (the batch, the
  // options or a layout trial running). Only LaunchImpl calls these.
  std::string GraphKey(torch::jit::Module& module, bool channels_last, const Groups& host, const BatchSpec& batch,
                       bool want_labels) const;
  // The graph to replay for `key`, captured first once the eager path has run it twice in a row; null
  // to launch eagerly.
  GraphedLaunch* GraphFor(torch::jit::Module& module, bool channels_last, const Groups& host, const std::string& key,
                          bool want_labels, const SurfaceRequest& surface, const std::string& input_shape)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(graph_mu_);
  // Captures `g` in `pool` ({0, 0}: a pool of its own); "" or what went wrong.
  std::string CaptureGraph(GraphedLaunch* g, at::cuda::MempoolId_t pool, torch::jit::Module& module,
                           bool channels_last, const Groups& host, bool want_labels, const SurfaceRequest& surface,
                           const std::string& input_shape);
  absl::StatusOr<std::unique_ptr<PendingBatch>> ReplayGraph(GraphedLaunch* g, const Groups& host, bool labels_to_host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(graph_mu_);
  void NoteEagerLaunch(const std::string& key, bool on_kernels) ABSL_LOCKS_EXCLUDED(eager_mu_);
  // Launches come from more than one thread (the batcher; a retry's from the completion thread; a
  // layout trial's), and a capture records whatever is queued on the compute stream, from any
  // thread: captures and replays hold graph_mu_ exclusively, eager launches shared.
  absl::Mutex graph_mu_;
  std::atomic<bool> graphs_enabled_{true};  // Off for good after a failed capture (TALLY_CUDA_GRAPHS=0: off).
  std::string graph_key_ ABSL_GUARDED_BY(graph_mu_);  // What the graphs were captured for.
  GraphedLaunch graphs_[2] ABSL_GUARDED_BY(graph_mu_);
  int next_graph_ ABSL_GUARDED_BY(graph_mu_) = 0;
  absl::Mutex eager_mu_;
  std::string eager_key_ ABSL_GUARDED_BY(eager_mu_);  // The latest eager launches' key, and how many in
  int eager_in_a_row_ ABSL_GUARDED_BY(eager_mu_) = 0;  // a row on the fused kernels (instance models: none).
#endif
};

// Counts the CPU allocator's bytes while it is installed on a thread (c10's memory reporting, what
// the profiler uses): the current total and its peak. Thread-safe.
class HostMemoryPeak final : public c10::MemoryReportingInfoBase {
 public:
  // The totals' parameter type changed (int64_t in LibTorch 1.13, size_t later): the override takes
  // whichever this LibTorch declares.
  template <typename F>
  struct TotalOf;
  template <typename C, typename A, typename B, typename T, typename... Rest>
  struct TotalOf<void (C::*)(A, B, T, Rest...)> {
    using type = T;
  };
  using Total = typename TotalOf<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage)>::type;

  void reportMemoryUsage(void* ptr, int64_t alloc_size, Total total_allocated, Total total_reserved,
                         c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    const int64_t now = current_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// The device `options` name ("cuda" is cuda:0); errors for unknown devices, CUDA on a CPU build,
// and fp16 on the CPU (torch_runner.cc).
absl::StatusOr<std::string> ResolveDevice(const ModelRunnerOptions& options);

// The network's fingerprint (torch_runner.cc): what kept layout trials are keyed by.
std::string ArchitectureFingerprint(const torch::jit::Module& module);
// The 4-D parameters of `module` (convolution weights) in the given memory layout, in place.
void SetParameterLayout(torch::jit::Module& module, bool channels_last);

}  // namespace torch_internal
}  // namespace tally

#endif  // TALLY_WORKER_TORCH_TORCH_RUNNER_H_
