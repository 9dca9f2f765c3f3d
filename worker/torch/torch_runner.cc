// TorchRunner (worker/torch/torch_runner.h): loading a TorchScript model onto its device (with the
// device's warm-up beside the read), the network's fingerprint, and the device checks.
#include "worker/torch/torch_runner.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tally {
namespace torch_internal {

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
// networks, on a tiny input, take that cost (measured by bench/gpu/first_pass_probe.py, in git at
// 015064c: the model's first pass 0.40-0.94 s alone, 0.10 s after this), on threads of their own while the model is read: one for
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

// The device `options` name ("cuda" is cuda:0); errors for unknown devices, CUDA on a CPU build,
// and fp16 on the CPU.
absl::StatusOr<std::string> ResolveDevice(const ModelRunnerOptions& options) {
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
                                                 "see docs/deployment.md 'GPU box' to build against a CUDA LibTorch"));
  }
#endif
  if (!want_cuda) RETURN_IF_ERROR(ModelRunner::CheckDevice(dev));
  if (options.precision == "fp16" && !want_cuda) {
    return absl::InvalidArgumentError("precision fp16 needs a CUDA device; use bf16 or fp32 on CPU");
  }
  return dev;
}

// torch.jit.load of the model onto `to`.
absl::Status ReadModel(const std::string& path, const at::Device& to, torch::jit::Module* module) {
  try {
    *module = torch::jit::load(path, to);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("model '", path,
                                                   "' is not a loadable TorchScript file (torch.jit.load failed: ",
                                                   ErrorText(e), ")"));
  }
  return absl::OkStatus();
}

// A model read into host memory moved to the GPU `dev`, or, if Module::to() would leave some of
// its tensors behind, read again onto it. Either way the weights are the file's, bit for bit.
absl::Status MoveToDevice(const std::string& path, const std::string& dev, torch::jit::Module* module) {
  RETURN_IF_ERROR(ModelRunner::CheckDevice(dev));
  std::string stays;
  if (!MovesWithTo(*module, &stays)) {
    Log("model ", path, ": read again straight onto ", dev, " (", stays, ")");
    return ReadModel(path, at::Device(dev), module);
  }
  try {
    module->to(at::Device(dev));
  } catch (const c10::Error& e) {
    return absl::UnavailableError(absl::StrCat("cannot move model '", path, "' to ", dev, ": ", ErrorText(e)));
  }
  return absl::OkStatus();
}

void TorchRunner::SetUpDevice() {
  if (!options_.mean.empty()) {
    mean_ = at::tensor(options_.mean, at::TensorOptions().dtype(at::kFloat)).to(device_).view({1, 3, 1, 1});
  }
  if (!options_.std.empty()) {
    std_ = at::tensor(options_.std, at::TensorOptions().dtype(at::kFloat)).to(device_).view({1, 3, 1, 1});
  }
#if TALLY_WITH_CUDA
  if (cuda_) {
    at::globalContext().setBenchmarkCuDNN(options_.cudnn_benchmark);
    if (options_.memory_limit_gib > 0) {
      const double total = static_cast<double>(at::cuda::getDeviceProperties(device_.index())->totalGlobalMem);
      const double fraction = std::min(1.0, options_.memory_limit_gib * 1073741824.0 / total);
      c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device_.index());
    }
    copy_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_.index()));
    compute_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_.index()));
    results_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_.index()));
  }
#endif
}

absl::Status TorchRunner::ReadTestHooks() {
  profile_first_launch_ = std::getenv("TALLY_PIPELINE_PROFILE") != nullptr;
  if (const char* hook = std::getenv("TALLY_TEST_LAYOUT_TRIAL"); hook != nullptr && *hook != '\0') {
    const std::vector<std::string> parts = absl::StrSplit(hook, ':');
    if ((parts[0] != "on" && parts[0] != "off") || parts.size() > 2 ||
        (parts.size() == 2 && parts[1] != "inline" && !absl::SimpleAtod(parts[1], &test_trial_delay_))) {
      return absl::InvalidArgumentError(absl::StrCat("TALLY_TEST_LAYOUT_TRIAL='", hook,
                                                     "': expected on or off, then :seconds or :inline optionally"));
    }
    test_trial_inline_ = parts.size() == 2 && parts[1] == "inline";
    test_trial_choice_ = parts[0];
  }
  if (const char* cost = std::getenv("TALLY_TEST_TRIAL_COST_SECONDS"); cost != nullptr && *cost != '\0') {
    if (!absl::SimpleAtod(cost, &test_trial_cost_) || !(test_trial_cost_ >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TALLY_TEST_TRIAL_COST_SECONDS='", cost, "': expected a number of seconds >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> TorchRunner::Create(const ModelRunnerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  struct stat st;
  if (stat(options.model_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", options.model_path, "' does not exist"));
  }
  ASSIGN_OR_RETURN(const std::string dev, ResolveDevice(options));
  const bool want_cuda = dev.rfind("cuda", 0) == 0;
  if (!want_cuda && options.cpu_threads > 0) at::set_num_threads(options.cpu_threads);
  // For a GPU the model is read into host memory first, which needs no CUDA: the worker initialises
  // CUDA on another thread meanwhile (worker/early_cuda.h, Worker::Run), and a third thread takes
  // the device's shape-independent start-up (WarmUpDevice) once CUDA is up. Then the model moves to
  // the device (MoveToDevice).
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
  absl::Cleanup join_warm_up = [&warm_up] {
    for (std::thread& t : warm_up) t.join();
  };
  torch::jit::Module module;
  RETURN_IF_ERROR(ReadModel(options.model_path, want_cuda ? at::Device(at::kCPU) : at::Device(dev), &module));
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (want_cuda) RETURN_IF_ERROR(MoveToDevice(options.model_path, dev, &module));
  module.eval();
  std::unique_ptr<TorchRunner> runner(new TorchRunner(options, at::Device(dev), std::move(module)));
  if (options.channels_last) {
    runner->channels_last_ = false;
    runner->SetChannelsLast(true);
  }
  runner->SetUpDevice();
  std::move(join_warm_up).Invoke();
  if (!warm_up.empty()) {
    Log("model ", options.model_path, absl::StrFormat(": read in %.2f s; the device's warm-up beside it done at %.2f s",
                                                       read_seconds, std::max(warm_up_done[0], warm_up_done[1])));
  }
  RETURN_IF_ERROR(runner->ReadTestHooks());
  runner->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace torch_internal

using torch_internal::ArchitectureFingerprint;
using torch_internal::ErrorText;
using torch_internal::MovesWithTo;
using torch_internal::TorchRunner;

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
  // An AOTInductor package (torch._inductor.aoti_compile_and_package): a zip archive, not TorchScript.
  if (absl::EndsWith(options.model_path, ".pt2")) {
#if TALLY_AOTI_PACKAGES
    return TorchRunner::CreateFromPackage(options);
#elif TALLY_TORCH_AT_LEAST(2, 6)
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options.model_path, "' is an AOTInductor package (.pt2), which GPU builds load; this tally-worker "
        "was built against LibTorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, " without CUDA"));
#else
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options.model_path, "' is an AOTInductor package (.pt2), which needs LibTorch 2.6 or newer; this "
        "tally-worker was built against LibTorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
        " (a CPU build): give the TorchScript file, or run it on a GPU build against the torch wheel's LibTorch"));
#endif
  }
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
                                               "see docs/deployment.md 'GPU box' to build against a CUDA LibTorch"));
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
