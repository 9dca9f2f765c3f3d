// The only translation unit that includes LibTorch. Builds against Debian's CPU LibTorch 1.13 and
// against LibTorch 2.x with CUDA (TALLY_WITH_CUDA=1).
#include "worker/model_runner.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/version.h>

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
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/security/sha256.h"
#include "common/base/status_macros.h"

#if TALLY_CUDA_KERNELS
#include "metrics/gpu/confusion_kernel.h"
#include "metrics/gpu/surface_kernel.h"
#endif

#if TALLY_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tally {
namespace {

#define TALLY_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

std::string Shape(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

// TorchScript errors carry long source excerpts: keep the last line (the error itself, e.g.
// "RuntimeError: CUDA out of memory. ...") and the first few (where it happened).
std::string ShortText(const std::string& msg) {
  std::string trimmed = msg;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
  size_t cut = 0;
  for (int lines = 0; lines < 4 && cut != std::string::npos; ++lines) cut = trimmed.find('\n', cut + 1);
  if (cut == std::string::npos) return trimmed;
  const size_t last = trimmed.rfind('\n');
  return trimmed.substr(0, cut) + " ... " + trimmed.substr(last + 1);
}

std::string ErrorText(const c10::Error& e) { return ShortText(e.what_without_backtrace()); }

bool LooksLikeOom(const std::string& what) {
  return what.find("out of memory") != std::string::npos || what.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos;
}

// Out-of-memory errors from inside TorchScript arrive as a plain c10::Error whose message quotes the
// interpreter's traceback first: look at the whole message, not the shortened one.
bool IsOom(const c10::Error& e) { return LooksLikeOom(e.what_without_backtrace()); }

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
  const double* surface(int i) const override {
    return surface_ptr_ ? surface_ptr_ + static_cast<size_t>(i) * 4 * k_ : nullptr;
  }

  int k_ = 0;
  at::Tensor counts_host_;  // [n, K, K] int64, host.
  const int64_t* counts_ = nullptr;
  std::vector<at::Tensor> labels_host_;  // int16, host.
  std::vector<const uint16_t*> label_ptrs_;
  std::vector<std::pair<at::Tensor, int64_t>> device_labels_;  // keep_labels: image i's group and row.
  at::Tensor ties_;
  at::Tensor nonfinite_host_;  // [n] int64, host.
  const int64_t* nonfinite_ptr_ = nullptr;
  at::Tensor thresholds_host_;  // [n, T, 4] int64, host.
  const int64_t* thresholds_ptr_ = nullptr;
  size_t num_thresholds_ = 0;
  at::Tensor surface_host_;  // [n, K, 4] double, host.
  const double* surface_ptr_ = nullptr;
#if TALLY_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> done_;
#endif
};

// Logits from whatever the model returns: a Tensor, a tuple/list (first element), or a dict
// (key "out", as torchvision's segmentation models, or its only value).
absl::StatusOr<at::Tensor> ExtractLogits(const c10::IValue& out, const std::string& model) {
  if (out.isTensor()) return out.toTensor();
  if (out.isTuple()) {
    const auto& elements = out.toTupleRef().elements();
    if (!elements.empty() && elements[0].isTensor()) return elements[0].toTensor();
  }
  if (out.isList()) {
    auto list = out.toList();
    if (list.size() > 0 && list.get(0).isTensor()) return list.get(0).toTensor();
  }
  if (out.isGenericDict()) {
    auto dict = out.toGenericDict();
    for (const auto& kv : dict) {
      if (kv.key().isString() && kv.key().toStringRef() == "out" && kv.value().isTensor()) return kv.value().toTensor();
    }
    if (dict.size() == 1 && dict.begin()->value().isTensor()) return dict.begin()->value().toTensor();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", model, "' returned ", out.tagKind(),
      "; expected a Tensor of logits [N, C, H, W], a tuple whose first element is one, or a dict with key 'out'"));
}

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
  bool StartLayoutTrial(std::function<void()> on_ready) override;
  std::string FinishLayoutTrial(std::string* trial) override;
  void CancelLayoutTrial() override;

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

  void EnableAutocast() {
    if (options_.precision == "fp32") return;
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
    std::vector<at::Tensor> surface;  // [n, K, 4] double per group, when asked for and computed.
    bool surface_missing = false;     // Asked for but not computed for some group.
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
  // ABORTED when the model raises (out-of-memory errors propagate as exceptions).
  absl::StatusOr<at::Tensor> Forward(torch::jit::Module& module, const at::Tensor& x, const std::string& input_shape);

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
  bool LayoutTrialsHere() const { return cuda_ || !test_trial_choice_.empty(); }
  // Whether the device can take the trial's copy of the weights and a batch beside the evaluation.
  bool MemoryForTrial(std::string* why) const;
  // `device_labels`: compute the predicted labels (they stay on the device unless ResultsToHost
  // copies them). `surface`: surface metrics on the device, where the kernels can.
  absl::Status PostprocessGroups(const at::Tensor& logits, const Groups& dev, const at::Tensor& x, bool device_labels,
                                 const SurfaceRequest& surface, Outputs* outputs);
  // Counts and the rest to (pinned) host memory; the labels too with `want_labels`, else they stay
  // where they are (CopyLabels).
  std::unique_ptr<PendingBatch> ResultsToHost(const Outputs& outputs, bool want_labels);
  // Turns logits [n, C, h, w] + reference labels [n, H, W] into counts and labels for one group.
  absl::Status Postprocess(const at::Tensor& raw_logits, const at::Tensor& gt, const at::Tensor& x,
                           bool want_labels, const SurfaceRequest& surface, Outputs* o);
  // Threshold sweep of a single-logit output: [n, T, 4] tp, fp, fn, tn of the foreground class.
  at::Tensor ThresholdCounts(const at::Tensor& logits, const at::Tensor& gt) const;

  const ModelRunnerOptions options_;
  const at::Device device_;
  torch::jit::Module module_;
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
  double load_seconds_ = 0;
  // TALLY_PIPELINE_PROFILE: the first launch's steps are timed (the device synchronised after each)
  // and logged, to show where a fresh worker's first batch goes.
  bool profile_first_launch_ = false;
  std::atomic<bool> launched_{false};  // Launches come from the batcher and, for retries, the completion thread.
  at::Tensor mean_, std_;
#if TALLY_WITH_CUDA
  std::unique_ptr<c10::cuda::CUDAStream> copy_stream_, compute_stream_;
#endif
};

// Whether `v` holds a tensor (in a list, tuple, dict or object too). Objects of C++ classes count
// as holding one: what they hold cannot be seen from here.
bool HoldsTensor(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined();
  if (v.isTensorList()) return !v.toTensorList().empty();
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (HoldsTensor(e)) return true;
    }
    return false;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (HoldsTensor(e)) return true;
    }
    return false;
  }
  if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      if (HoldsTensor(kv.key()) || HoldsTensor(kv.value())) return true;
    }
    return false;
  }
  if (v.isObject()) {
    const c10::intrusive_ptr<c10::ivalue::Object> o = v.toObject();
    for (size_t i = 0; i < o->slots().size(); ++i) {
      if (HoldsTensor(o->getSlot(i))) return true;
    }
    return false;
  }
  return v.isCapsule() || v.isCustomClass();
}

// Whether Module::to(device) moves every tensor of `module` (loaded to the CPU), so that the result
// equals loading it onto the device: its parameters and buffers move; tensor attributes that are
// neither, and tensor constants in its code (a traced model keeps tensors made in forward as
// constants), stay. `stays` names the first that would.
bool MovesWithTo(const torch::jit::Module& module, std::string* stays) {
  for (const torch::jit::Module& m : module.modules()) {
    const c10::ClassTypePtr& type = m.type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      if (type->is_parameter(i) || type->is_buffer(i)) continue;
      const c10::IValue v = m._ivalue()->getSlot(i);
      if (v.isModule()) continue;  // Visited by modules().
      if (HoldsTensor(v)) {
        *stays = absl::StrCat("attribute '", type->getAttributeName(i), "' of ", type->name()->qualifiedName(),
                              " holds a tensor that is neither a parameter nor a buffer");
        return false;
      }
    }
  }
  std::vector<torch::jit::Block*> blocks;
  for (torch::jit::Function* f : module._ivalue()->compilation_unit()->get_functions()) {
    torch::jit::GraphFunction* g = torch::jit::tryToGraphFunction(*f);
    if (g == nullptr) continue;
    blocks.assign(1, g->graph()->block());
    while (!blocks.empty()) {
      torch::jit::Block* b = blocks.back();
      blocks.pop_back();
      for (torch::jit::Node* n : b->nodes()) {
        for (torch::jit::Block* inner : n->blocks()) blocks.push_back(inner);
        if (n->kind() != c10::prim::Constant || n->outputs().size() != 1) continue;
        const auto v = torch::jit::toIValue(n->output());
        if (v && HoldsTensor(*v)) {
          *stays = absl::StrCat("a tensor constant in ", f->qualname().qualifiedName());
          return false;
        }
      }
    }
  }
  return true;
}

// The 4-D parameters of `module` (convolution weights) in the given memory layout, in place.
void SetParameterLayout(torch::jit::Module& module, bool channels_last) {
  c10::InferenceMode guard;
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  for (at::Tensor p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(format));
  }
}

// `text` without TorchScript's type-name mangling (".___torch_mangle_12."): the numbers count the
// classes scripted before in the saving process, so two checkpoints of one network saved by
// different scripts differ in them alone. Layers that differ still differ in their code's constants
// and their parameters' shapes.
std::string WithoutNameMangling(const std::string& text) {
  static constexpr char kMangle[] = "___torch_mangle_";
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  for (size_t at = text.find(kMangle); at != std::string::npos; at = text.find(kMangle, i)) {
    size_t end = at + sizeof(kMangle) - 1;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end < text.size() && text[end] == '.') ++end;
    out.append(text, i, at - i);
    i = end;
  }
  out.append(text, i, std::string::npos);
  return out;
}

std::string ArchitectureFingerprint(const torch::jit::Module& module) {
  // Every submodule's type, scalar attributes and methods' code (graphs without source locations),
  // and the name, shape and dtype of every parameter and buffer; no tensor values. Retrained
  // weights of one network give the same text.
  std::string text;
  for (const torch::jit::NameModule& m : module.named_modules()) {
    const auto& name = m.value.type()->name();
    absl::StrAppend(&text, "module '", m.name, "' ", name ? name->qualifiedName() : "?", "\n");
    for (const torch::jit::NameValue& a : m.value.named_attributes(/*recurse=*/false)) {
      const c10::IValue& v = a.value;
      if (!v.isInt() && !v.isDouble() && !v.isBool() && !v.isString() && !v.isNone()) continue;
      std::ostringstream value;
      value << v;
      absl::StrAppend(&text, "attribute ", a.name, " = ", value.str(), "\n");
    }
    for (const torch::jit::Method& method : m.value.get_methods()) {
      torch::jit::GraphFunction* g = torch::jit::tryToGraphFunction(method.function());
      absl::StrAppend(&text, "method ", method.name(), "\n", g ? g->graph()->toString(/*print_source_locations=*/false) : "?",
                      "\n");
    }
  }
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    absl::StrAppend(&text, "parameter ", p.name, " ", Shape(p.value), " ", c10::toString(p.value.scalar_type()), "\n");
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    absl::StrAppend(&text, "buffer ", b.name, " ", Shape(b.value), " ", c10::toString(b.value.scalar_type()), "\n");
  }
  return Sha256Hex(WithoutNameMangling(text));
}

#if TALLY_WITH_CUDA
// A fresh process's first forward pass on a GPU spends 0.3-0.9 s (H100, LRASPP) on start-up that
// does not depend on the model or the input's shape: cuDNN's sub-libraries and NVRTC are loaded,
// cuDNN's handle made, each kernel loaded at its first launch. The layers common to segmentation
// networks, on a tiny input, take that cost (bench/gpu/first_pass_probe.py: the model's first pass
// 0.40-0.94 s alone, 0.10 s after this), on threads of their own while the model is read: one for
// cuDNN (convolutions, batch norm), one for the other kernels. Results are untouched: cuDNN plans
// and caches per shape, and none of these shapes is the model's.
void WarmUpDevice(const at::Device& device, bool convolutions) {
  try {
    c10::InferenceMode guard;
    c10::cuda::CUDAGuard device_guard(device);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor x = at::rand({2, 16, 32, 32}, f32);
    if (convolutions) {
      const at::Tensor w3 = at::rand({16, 3, 3, 3}, f32), dw = at::rand({16, 1, 3, 3}, f32);
      const at::Tensor w1 = at::rand({8, 16, 1, 1}, f32), bias = at::zeros({8}, f32);
      const at::Tensor ones = at::ones({16}, f32), zeros = at::zeros({16}, f32);
      at::Tensor y = at::conv2d(at::rand({2, 3, 64, 64}, f32), w3, {}, {2, 2}, {1, 1});
      y = at::batch_norm(y, ones, zeros, zeros, ones, false, 0.1, 1e-5, true);
      y = at::conv2d(y, dw, {}, {1, 1}, {1, 1}, {1, 1}, 16);
      y = at::conv2d(y, w1, bias);
      y.sum().item<float>();
      return;
    }
    at::Tensor y = at::hardswish(at::relu(x));
    y = y * at::hardsigmoid(y.mean({2, 3}, true)) + at::sigmoid(y) * at::gelu(y);
    y = at::adaptive_avg_pool2d(y, {1, 1}) + at::max_pool2d(y, {2, 2}).repeat({1, 1, 2, 2});
    y = at::upsample_bilinear2d(y, {64, 64}, false);
    at::Tensor labels = at::cat({y, y}, 1).softmax(1).argmax(1);
    // The input side of every batch: uint8 RGB to normalised float; labels to int64.
    x = at::randint(0, 255, {2, 64, 64, 3}, f32.dtype(at::kByte)).permute({0, 3, 1, 2}).to(at::kFloat).div(255);
    (x.sub(0.5).div(0.25).sum() + labels.to(at::kLong).sum()).item<float>();
  } catch (const c10::Error& e) {
    Log("warm-up of ", device.str(), " failed (the model's first pass will take its start-up): ", ErrorText(e));
  }
}
#endif

absl::StatusOr<std::unique_ptr<ModelRunner>> TorchRunner::Create(const ModelRunnerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  struct stat st;
  if (stat(options.model_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", options.model_path, "' does not exist"));
  }
  std::string dev = options.device.empty() ? "cpu" : options.device;
  if (dev == "cuda") dev = "cuda:0";
  const bool want_cuda = dev.rfind("cuda", 0) == 0;
  if (!want_cuda && dev != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("unknown device '", options.device, "'; use cpu or cuda:N"));
  }
#if !TALLY_WITH_CUDA
  if (want_cuda) {
    return absl::UnimplementedError(absl::StrCat("device '", options.device,
                                                 "': this tally-worker was built against a CPU-only LibTorch; "
                                                 "see README 'GPU box' to build against a CUDA LibTorch"));
  }
#else
#endif
  if (!want_cuda) {
    if (absl::Status s = ModelRunner::CheckDevice(dev); !s.ok()) return s;
  }
  if (options.precision == "fp16" && !want_cuda) {
    return absl::InvalidArgumentError("precision fp16 needs a CUDA device; use bf16 or fp32 on CPU");
  }
  if (!want_cuda && options.cpu_threads > 0) at::set_num_threads(options.cpu_threads);
  torch::jit::Module module;
  // For a GPU the model is read into host memory first, which needs no CUDA: the worker initialises
  // CUDA on another thread meanwhile (worker/early_cuda.h, Worker::Run), and a third thread takes
  // the device's shape-independent start-up (WarmUpDevice) once CUDA is up. Then the model moves to
  // the device, or, if Module::to() would leave some of its tensors behind, is read again onto it.
  // Either way the weights are the file's, bit for bit.
  std::vector<std::thread> warm_up;
  double warm_up_done[2] = {0, 0};  // Seconds after `start`, per warm-up thread.
#if TALLY_WITH_CUDA
  for (int i = 0; i < 2 && want_cuda && options.warm_up_device; ++i) {
    warm_up.emplace_back([dev, convolutions = i == 0, start, done = &warm_up_done[i]] {
      if (ModelRunner::CheckDevice(dev).ok()) WarmUpDevice(at::Device(dev), convolutions);
      *done = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
#endif
  double read_seconds = 0;
  absl::Cleanup join_warm_up = [&warm_up] {
    for (std::thread& t : warm_up) t.join();
  };
  auto load = [&](const at::Device& to) -> absl::Status {
    try {
      module = torch::jit::load(options.model_path, to);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("model '", options.model_path,
                                                     "' is not a loadable TorchScript file (torch.jit.load failed: ",
                                                     ErrorText(e), ")"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load(want_cuda ? at::Device(at::kCPU) : at::Device(dev)));
  read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (want_cuda) {
    if (absl::Status s = ModelRunner::CheckDevice(dev); !s.ok()) return s;
    std::string stays;
    if (MovesWithTo(module, &stays)) {
      try {
        module.to(at::Device(dev));
      } catch (const c10::Error& e) {
        return absl::UnavailableError(absl::StrCat("cannot move model '", options.model_path, "' to ", dev, ": ",
                                                   ErrorText(e)));
      }
    } else {
      Log("model ", options.model_path, ": read again straight onto ", dev, " (", stays, ")");
      RETURN_IF_ERROR(load(at::Device(dev)));
    }
  }
  at::Device device(dev);
  module.eval();
  std::unique_ptr<TorchRunner> runner(new TorchRunner(options, device, std::move(module)));
  if (options.channels_last) {
    runner->channels_last_ = false;
    runner->SetChannelsLast(true);
  }
  if (!options.mean.empty()) {
    runner->mean_ = at::tensor(options.mean, at::TensorOptions().dtype(at::kFloat)).to(device).view({1, 3, 1, 1});
  }
  if (!options.std.empty()) {
    runner->std_ = at::tensor(options.std, at::TensorOptions().dtype(at::kFloat)).to(device).view({1, 3, 1, 1});
  }
#if TALLY_WITH_CUDA
  if (want_cuda) {
    at::globalContext().setBenchmarkCuDNN(options.cudnn_benchmark);
    if (options.memory_limit_gib > 0) {
      const double total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
      const double fraction = std::min(1.0, options.memory_limit_gib * 1073741824.0 / total);
      c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
    }
    runner->copy_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device.index()));
    runner->compute_stream_ =
        std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device.index()));
  }
#endif
  std::move(join_warm_up).Invoke();
  if (!warm_up.empty()) {
    Log("model ", options.model_path, absl::StrFormat(": read in %.2f s; the device's warm-up beside it done at %.2f s",
                                                       read_seconds, std::max(warm_up_done[0], warm_up_done[1])));
  }
  runner->profile_first_launch_ = std::getenv("TALLY_PIPELINE_PROFILE") != nullptr;
  if (const char* hook = std::getenv("TALLY_TEST_LAYOUT_TRIAL"); hook != nullptr && *hook != '\0') {
    const std::vector<std::string> parts = absl::StrSplit(hook, ':');
    if ((parts[0] != "on" && parts[0] != "off") || parts.size() > 2 ||
        (parts.size() == 2 && parts[1] != "inline" && !absl::SimpleAtod(parts[1], &runner->test_trial_delay_))) {
      return absl::InvalidArgumentError(absl::StrCat("TALLY_TEST_LAYOUT_TRIAL='", hook,
                                                     "': expected on or off, then :seconds or :inline optionally"));
    }
    runner->test_trial_inline_ = parts.size() == 2 && parts[1] == "inline";
    runner->test_trial_choice_ = parts[0];
  }
  runner->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

at::Tensor TorchRunner::ThresholdCounts(const at::Tensor& logits, const at::Tensor& gt) const {
  // Foreground where sigmoid(x) > t, i.e. x > log(t / (1 - t)), compared in double precision.
  std::vector<double> cuts;
  for (double t : options_.thresholds) cuts.push_back(std::log(t / (1.0 - t)));
  const int64_t n = gt.size(0), T = static_cast<int64_t>(cuts.size());
  at::Tensor x = logits.select(1, 0).to(at::kDouble).unsqueeze(1);                       // [n, 1, H, W]
  at::Tensor cut = at::tensor(cuts, x.options()).view({1, T, 1, 1});
  at::Tensor fg = x.gt(cut);                                                             // [n, T, H, W]
  at::Tensor ref = gt.to(at::kLong).unsqueeze(1);
  at::Tensor is1 = ref.eq(1), is0 = ref.eq(0);  // Ignored pixels (-1) and labels >= 2 are neither.
  auto count = [](const at::Tensor& b) { return b.sum({2, 3}).to(at::kLong); };
  at::Tensor tp = count(fg.logical_and(is1)), fp = count(fg.logical_and(is0));
  at::Tensor fn = count(fg.logical_not().logical_and(is1)), tn = count(fg.logical_not().logical_and(is0));
  return at::stack({tp, fp, fn, tn}, 2).view({n, T, 4});
}

absl::Status TorchRunner::Postprocess(const at::Tensor& raw_logits, const at::Tensor& gt, const at::Tensor& x,
                                      bool want_labels, const SurfaceRequest& surface, Outputs* o) {
  std::vector<at::Tensor>* counts = &o->counts;
  std::vector<at::Tensor>* labels = &o->labels;
  std::vector<at::Tensor>* nonfinite = &o->nonfinite;
  at::Tensor* ties = &o->ties;
  int* k = &o->k;
  const int64_t n = gt.size(0), H = gt.size(1), W = gt.size(2);
  if (raw_logits.dim() != 4 || raw_logits.size(0) != n || raw_logits.size(1) < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", options_.model_path, "' returned logits of shape ", Shape(raw_logits), " for an input of shape ",
        Shape(x), "; expected [N, C, H, W] with N = ", n, " and C >= 1"));
  }
  at::Tensor logits = raw_logits.to(at::kFloat);
  if (logits.size(2) != H || logits.size(3) != W) {
    logits = at::upsample_bilinear2d(logits, {H, W}, /*align_corners=*/false);
  }
  const int64_t C = logits.size(1);
  const int64_t K = C == 1 ? 2 : C;
  if (!options_.thresholds.empty()) {
    if (C != 1) {
      return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned ", C,
                                                        " channels; --thresholds needs a single-logit output (C = 1)"));
    }
    o->thresholds.push_back(ThresholdCounts(logits, gt));
  }
  if (*k != 0 && *k != K) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned ", C,
                                                      " channels for one input and a different number for another"));
  }
  *k = static_cast<int>(K);
#if TALLY_CUDA_KERNELS
  if (cuda_ && K <= kMaxKernelClasses) {
    // One fused pass: argmax, labels, confusion counts and ties, without a host synchronisation.
    at::Tensor lg = logits.contiguous();
    at::Tensor ref16 = gt.to(at::kShort).contiguous();
    const auto long_opts = ref16.options().dtype(at::kLong);
    at::Tensor c = at::zeros({n, K, K}, long_opts);
    at::Tensor pred16 = want_labels ? at::empty({n, H, W}, ref16.options()) : at::Tensor();
    at::Tensor t = options_.count_logit_ties ? at::zeros({}, long_opts) : at::Tensor();
    at::Tensor bad = at::zeros({n}, long_opts);
    if (LaunchConfusion(lg.data_ptr<float>(), ref16.data_ptr<int16_t>(), n, static_cast<int>(C), H * W,
                        want_labels ? pred16.data_ptr<int16_t>() : nullptr, c.data_ptr<int64_t>(),
                        t.defined() ? t.data_ptr<int64_t>() : nullptr, bad.data_ptr<int64_t>(),
                        at::cuda::getCurrentCUDAStream().stream())) {
      counts->push_back(c);
      nonfinite->push_back(bad);
      if (want_labels) labels->push_back(pred16);
      if (t.defined()) *ties = ties->defined() ? *ties + t : t;
      if (surface.enabled) {
        bool done = false;
        if (SurfaceKernelSupports(static_cast<int>(K), H, W)) {
          // Scratch from the caching allocator on this stream: released when the tensor goes, reused
          // only by work queued after this batch's.
          const int64_t scratch_bytes = static_cast<int64_t>(SurfaceScratchBytes(n, H, W, static_cast<int>(K)));
          at::Tensor scratch = at::empty({scratch_bytes}, ref16.options().dtype(at::kByte));
          at::Tensor values = at::empty({n, K, 4}, ref16.options().dtype(at::kDouble));
          done = LaunchSurface(pred16.data_ptr<int16_t>(), ref16.data_ptr<int16_t>(), n, H, W, static_cast<int>(K),
                               surface.options, scratch.data_ptr(), values.data_ptr<double>(),
                               at::cuda::getCurrentCUDAStream().stream());
          if (done) o->surface.push_back(values);
        }
        if (!done) o->surface_missing = true;
      }
      return absl::OkStatus();
    }
  }
#endif
  if (surface.enabled) o->surface_missing = true;
  // NaN/Inf per image in the logits as evaluated (float32, at the mask's size).
  nonfinite->push_back(at::isfinite(logits).logical_not().sum({1, 2, 3}).to(at::kLong));
  at::Tensor pred = C == 1 ? logits.select(1, 0).gt(0).to(at::kLong) : logits.argmax(1);
  if (options_.count_logit_ties && C >= 2) {
    at::Tensor top2 = std::get<0>(logits.topk(2, 1));
    at::Tensor t = top2.select(1, 0).eq(top2.select(1, 1)).sum();
    *ties = ties->defined() ? *ties + t : t;
  }
  at::Tensor ref = gt.to(at::kLong);
  // Prepared masks hold ignored pixels as -1 (common/io/image_io.h kIgnoredPixel): out of [0, K).
  at::Tensor valid = ref.ge(0).logical_and(ref.lt(K));
  at::Tensor base = at::arange(n, ref.options()).view({n, 1, 1}).mul(K * K);
  at::Tensor idx = at::where(valid, base + ref * K + pred, at::full({}, n * K * K, ref.options()));
  at::Tensor c = at::bincount(idx.reshape({-1}), {}, n * K * K + 1).narrow(0, 0, n * K * K).view({n, K, K});
  counts->push_back(c);
  if (want_labels) labels->push_back(pred.to(at::kShort));
  return absl::OkStatus();
}

absl::StatusOr<TorchRunner::Groups> TorchRunner::HostGroups(const BatchSpec& batch) const {
  auto* images = dynamic_cast<TorchHostBuffer*>(batch.images);
  auto* masks = dynamic_cast<TorchHostBuffer*>(batch.masks);
  if (images == nullptr || masks == nullptr || batch.items.empty()) {
    return absl::InternalError("Launch: buffers not allocated by this runner, or an empty batch");
  }
  Groups g;
  g.n = static_cast<int64_t>(batch.items.size());
  for (const BatchImage& it : batch.items) {
    g.uniform &= it.height == batch.items[0].height && it.width == batch.items[0].width;
  }
  const at::Tensor mask_words = masks->tensor().view(at::kShort);
  auto host_image = [&](const BatchImage& it, int64_t count) {
    return images->tensor().narrow(0, static_cast<int64_t>(it.image_offset), count * it.height * it.width * 3)
        .view({count, it.height, it.width, 3});
  };
  auto host_mask = [&](const BatchImage& it, int64_t count) {
    return mask_words.narrow(0, static_cast<int64_t>(it.mask_offset), count * it.height * it.width)
        .view({count, it.height, it.width});
  };
  // The whole batch when uniform (the pipeline places its images back to back), else one group
  // per image.
  if (g.uniform) {
    g.images.push_back(host_image(batch.items[0], g.n));
    g.masks.push_back(host_mask(batch.items[0], g.n));
  } else {
    for (const BatchImage& it : batch.items) {
      g.images.push_back(host_image(it, 1));
      g.masks.push_back(host_mask(it, 1));
    }
  }
  return g;
}

TorchRunner::Groups TorchRunner::Upload(const Groups& host, std::unique_ptr<ComputeStreamScope>* compute) {
  if (!cuda_) return host;
  Groups dev;
  dev.uniform = host.uniform;
  dev.n = host.n;
#if TALLY_WITH_CUDA
  at::cuda::CUDAEvent uploaded;
  {
    c10::cuda::CUDAStreamGuard guard(*copy_stream_);
    for (size_t g = 0; g < host.images.size(); ++g) {
      dev.images.push_back(host.images[g].to(device_, /*non_blocking=*/true));
      dev.masks.push_back(host.masks[g].to(device_, /*non_blocking=*/true));
    }
    uploaded.record(*copy_stream_);
  }
  *compute = std::make_unique<ComputeStreamScope>(*compute_stream_);
  uploaded.block(*compute_stream_);
  for (size_t g = 0; g < dev.images.size(); ++g) {
    // Allocated on the copy stream, used on the compute stream: keep the allocator from handing
    // the memory out again before the compute stream is done with it.
    dev.images[g].record_stream(*compute_stream_);
    dev.masks[g].record_stream(*compute_stream_);
  }
#endif
  return dev;
}

at::Tensor TorchRunner::Preprocess(const Groups& dev, bool channels_last) const {
  auto preprocess = [&](const at::Tensor& u8) {
    at::Tensor x = u8.permute({0, 3, 1, 2}).to(at::kFloat).div_(255.0);
    if (mean_.defined()) x = x.sub_(mean_);
    if (std_.defined()) x = x.div_(std_);
    if (options_.input_height > 0) {
      x = at::upsample_bilinear2d(x, {options_.input_height, options_.input_width}, /*align_corners=*/false);
    }
    return x.contiguous(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  };
  if (dev.uniform) return preprocess(dev.images[0]);
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : dev.images) parts.push_back(preprocess(t));
  return at::cat(parts, 0);
}

absl::StatusOr<at::Tensor> TorchRunner::Forward(torch::jit::Module& module, const at::Tensor& x,
                                                const std::string& input_shape) {
  c10::IValue out;
  try {
    // Per calling thread: the batcher's, the completion thread's retries and estimate's trials alike.
    torch::jit::GraphOptimizerEnabledGuard optimize(options_.jit_optimize);
    out = module.forward({x});
  } catch (const c10::Error& e) {
    if (IsOom(e)) throw;  // Launch turns it into RESOURCE_EXHAUSTED.
    return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' raised on an input of shape ",
                                           input_shape, ": ", ErrorText(e)));
  } catch (const std::exception& e) {
    if (LooksLikeOom(e.what())) throw;
    return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' raised on an input of shape ",
                                           input_shape, ": ", ShortText(e.what())));
  }
  return ExtractLogits(out, options_.model_path);
}

absl::Status TorchRunner::PostprocessGroups(const at::Tensor& logits, const Groups& dev, const at::Tensor& x,
                                            bool device_labels, const SurfaceRequest& surface, Outputs* o) {
  if (dev.uniform) {
    return Postprocess(logits, dev.masks[0], x, device_labels, surface, o);
  }
  if (logits.dim() != 4 || logits.size(0) != dev.n) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned logits of shape ",
                                                      Shape(logits), " for an input of shape ", Shape(x),
                                                      "; expected [N, C, H, W] with N = ", dev.n));
  }
  for (int64_t i = 0; i < dev.n; ++i) {
    RETURN_IF_ERROR(Postprocess(logits.narrow(0, i, 1), dev.masks[i], x, device_labels, surface, o));
  }
  return absl::OkStatus();
}

std::unique_ptr<PendingBatch> TorchRunner::ResultsToHost(const Outputs& o, bool want_labels) {
  auto pending = std::make_unique<TorchPendingBatch>();
  pending->k_ = o.k;
  auto host_opts = at::TensorOptions().device(at::kCPU);
  if (cuda_) host_opts = host_opts.pinned_memory(true);
  // Small results back to (pinned) host memory, asynchronously on CUDA.
  auto to_host = [&](const std::vector<at::Tensor>& parts, at::ScalarType type) {
    const at::Tensor all = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    at::Tensor h = at::empty(all.sizes(), host_opts.dtype(type));
    h.copy_(all, /*non_blocking=*/cuda_);
    return h;
  };
  pending->counts_host_ = to_host(o.counts, at::kLong);
  pending->counts_ = pending->counts_host_.data_ptr<int64_t>();
  if (!want_labels) {
    for (const at::Tensor& l : o.labels) {
      for (int64_t i = 0; i < l.size(0); ++i) pending->device_labels_.emplace_back(l, i);
    }
  }
  for (const at::Tensor& l : want_labels ? o.labels : std::vector<at::Tensor>()) {
    at::Tensor h = to_host({l}, at::kShort);
    const int64_t per_image = l.size(1) * l.size(2);
    for (int64_t i = 0; i < l.size(0); ++i) {
      pending->label_ptrs_.push_back(reinterpret_cast<const uint16_t*>(h.data_ptr<int16_t>() + i * per_image));
    }
    pending->labels_host_.push_back(h);
  }
  pending->nonfinite_host_ = to_host(o.nonfinite, at::kLong);
  pending->nonfinite_ptr_ = pending->nonfinite_host_.data_ptr<int64_t>();
  if (o.ties.defined()) pending->ties_ = to_host({o.ties}, at::kLong);
  if (!o.thresholds.empty()) {
    pending->thresholds_host_ = to_host(o.thresholds, at::kLong);
    pending->thresholds_ptr_ = pending->thresholds_host_.data_ptr<int64_t>();
    pending->num_thresholds_ = options_.thresholds.size();
  }
  if (!o.surface.empty() && !o.surface_missing) {
    pending->surface_host_ = to_host(o.surface, at::kDouble);
    pending->surface_ptr_ = pending->surface_host_.data_ptr<double>();
  }
#if TALLY_WITH_CUDA
  if (cuda_) {
    pending->done_ = std::make_unique<at::cuda::CUDAEvent>();
    pending->done_->record(*compute_stream_);
  }
#endif
  return pending;
}

absl::StatusOr<std::unique_ptr<PendingBatch>> TorchRunner::LaunchImpl(torch::jit::Module& module, bool channels_last,
                                                                      const BatchSpec& batch,
                                                                      std::string* input_shape) {
  const bool timed = !launched_.exchange(true) && profile_first_launch_;
  std::string steps;
  auto t = std::chrono::steady_clock::now();
  auto step = [&](const char* what) {
    if (!timed) return;
#if TALLY_WITH_CUDA
    c10::cuda::device_synchronize();
#endif
    const auto now = std::chrono::steady_clock::now();
    absl::StrAppend(&steps, steps.empty() ? "" : ", ", what, absl::StrFormat(" %.1f ms", 1e3 * std::chrono::duration<double>(now - t).count()));
    t = now;
  };
  ASSIGN_OR_RETURN(const Groups host, HostGroups(batch));
  std::unique_ptr<ComputeStreamScope> compute;  // On CUDA, the rest runs on the compute stream.
  const Groups dev = Upload(host, &compute);
  step("upload");
  const at::Tensor x = Preprocess(dev, channels_last);
  step("preprocess");
  *input_shape = Shape(x);
  ASSIGN_OR_RETURN(const at::Tensor logits, Forward(module, x, *input_shape));
  step("forward");
  Outputs outputs;
  RETURN_IF_ERROR(PostprocessGroups(logits, dev, x, batch.want_labels || batch.keep_labels || batch.surface.enabled,
                                    batch.surface, &outputs));
  step("postprocess");
  // Where the device could not score the surfaces, the labels go to the host for the CPU to.
  auto pending = ResultsToHost(outputs, batch.want_labels || (batch.surface.enabled && outputs.surface_missing));
  step("results to host");
  if (timed) Log("first launch (", *input_shape, "): ", steps);
  return pending;
}

void TorchRunner::SetChannelsLast(bool on) {
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

absl::StatusOr<int> TorchRunner::FindMaxBatch(int height, int width, double max_memory, int limit, int fallback) {
  if (!cuda_) return fallback;
#if TALLY_WITH_CUDA
  const int dev = device_.index();
  const double total = static_cast<double>(at::cuda::getDeviceProperties(dev)->totalGlobalMem);
  const double budget = max_memory <= 0 ? 0.9 * total : max_memory <= 1 ? max_memory * total : max_memory * 1073741824.0;
  int best = 0;
  for (int b = 1; b <= limit; b *= 2) {
    std::unique_ptr<HostBuffer> imgs = AllocateHost(static_cast<size_t>(b) * height * width * 3);
    std::unique_ptr<HostBuffer> masks = AllocateHost(static_cast<size_t>(b) * height * width * 2);
    for (size_t i = 0; i < imgs->size(); ++i) imgs->data()[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    std::memset(masks->data(), 0, masks->size());
    BatchSpec spec;
    spec.images = imgs.get();
    spec.masks = masks.get();
    for (int i = 0; i < b; ++i) {
      spec.items.push_back(BatchImage{static_cast<size_t>(i) * height * width * 3,
                                      static_cast<size_t>(i) * height * width, height, width});
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev);
    auto pending = Launch(spec);
    absl::Status s = pending.ok() ? (*pending)->Wait() : pending.status();
    if (absl::IsResourceExhausted(s)) break;
    if (!s.ok()) return s;
    const double peak =
        static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(dev).reserved_bytes[0].peak);
    if (peak > budget) break;
    best = b;
  }
  c10::cuda::CUDACachingAllocator::emptyCache();
  return std::max(best, 1);
#else
  return fallback;
#endif
}

}  // namespace

absl::StatusOr<std::string> TorchScriptArchitecture(const std::string& path) {
  try {
    return ArchitectureFingerprint(torch::jit::load(path, at::Device(at::kCPU)));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a loadable TorchScript file: ", ErrorText(e)));
  }
}

absl::StatusOr<bool> TorchScriptMovesWithTo(const std::string& path, std::string* stays) {
  try {
    return MovesWithTo(torch::jit::load(path, at::Device(at::kCPU)), stays);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a loadable TorchScript file: ", ErrorText(e)));
  }
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelRunnerOptions& options) {
  return TorchRunner::Create(options);
}

absl::Status ModelRunner::CheckDevice(const std::string& device) {
  if (device.empty() || device == "cpu") return absl::OkStatus();
  if (device.rfind("cuda", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device '", device, "'; use cpu or cuda:N"));
  }
#if !TALLY_WITH_CUDA
  return absl::UnimplementedError(absl::StrCat("device '", device,
                                               "': this tally-worker was built against a CPU-only LibTorch; "
                                               "see README 'GPU box' to build against a CUDA LibTorch"));
#else
  int index = 0;
  if (device.size() > 5 && (device[4] != ':' || !absl::SimpleAtoi(device.substr(5), &index) || index < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device '", device, "'; use cpu or cuda:N"));
  }
  try {
    if (!torch::cuda::is_available()) {
      return absl::UnavailableError(absl::StrCat("device '", device, "': no CUDA device is visible"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (index >= count) {
      return absl::UnavailableError(absl::StrCat("device '", device, "' does not exist: this host sees ", count,
                                                 " CUDA device(s) (CUDA_VISIBLE_DEVICES renumbers them from 0)"));
    }
    at::empty({1}, at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index))));
  } catch (const c10::Error& e) {
    return absl::UnavailableError(absl::StrCat("device '", device, "' cannot be initialised: ", ErrorText(e)));
  }
  return absl::OkStatus();
#endif
}

}  // namespace tally
