// TorchRunner with an AOTInductor package (.pt2) in place of TorchScript: the model file `tally
// export` makes (python/tally/export.py), loaded by LibTorch's package loader on the worker's GPU.
// The launches are TorchScript's (upload, preprocess, the fused scoring kernels); only the forward
// pass is the package's compiled kernels. The package was exported for one input shape (its batch
// dimension from 1 to a maximum, or that maximum only: a smaller batch is padded) and one precision, which its metadata records: the precision must
// be the job's, and every batch is checked against the shape before the package reads it (the
// generated code trusts its inputs' sizes). No layout trial and no CUDA graphs: the package's layout
// and launches were fixed when it was built.
#include "worker/torch/package_metadata.h"
#include "worker/torch/torch_runner.h"

namespace tally {
namespace torch_internal {

#if TALLY_AOTI_PACKAGES

absl::StatusOr<std::unique_ptr<ModelRunner>> TorchRunner::CreateFromPackage(const ModelRunnerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& path = options.model_path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat("model file '", path, "' does not exist"));
  ASSIGN_OR_RETURN(const std::string dev, ResolveDevice(options));
  if (dev.rfind("cuda", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model '", path, "' is an AOTInductor package, which runs on a GPU; "
                                                   "this worker's device is ", dev));
  }
  RETURN_IF_ERROR(ModelRunner::CheckDevice(dev));
  const at::Device device(dev);
  auto package = std::make_unique<Package>();
  std::unordered_map<std::string, std::string> meta;
  try {
    c10::cuda::CUDAGuard guard(device.index());
    package->loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path, "model", /*run_single_threaded=*/false, /*num_runners=*/1, device.index());
    meta = package->loader->get_metadata();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", path, "' could not be loaded as an AOTInductor package: ", ShortText(e.what())));
  }
  ASSIGN_OR_RETURN(const PackageMetadata m, ParsePackageMetadata(path, meta));
  package->height = m.height;
  package->width = m.width;
  package->batch_max = m.batch_max;
  package->batch_dynamic = m.batch_dynamic;
  const std::string& precision = m.precision;
  if (precision != options.precision) {
    return absl::InvalidArgumentError(absl::StrCat("model '", path, "' was exported with --precision ", precision,
                                                   " (its kernels are fixed to it); run the job with --precision ",
                                                   precision));
  }
  package->describe = absl::StrCat("[", m.batch_dynamic ? "1.." : "", m.batch_max,
                                   m.batch_dynamic ? "" : " (smaller batches padded)", ", 3, ", m.height, ", ", m.width,
                                   "], ", precision, ", exported by torch ", m.torch_version.empty() ? "?" : m.torch_version);
  std::unique_ptr<TorchRunner> runner(
      new TorchRunner(options, device, torch::jit::Module(c10::QualifiedName("__torch__.tally.AotiPackage"))));
  runner->package_ = std::move(package);
  runner->channels_last_ = false;
  runner->SetUpDevice();
  RETURN_IF_ERROR(runner->ReadTestHooks());
  runner->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log("model ", path, ": an AOTInductor package for inputs ", runner->package_->describe,
      absl::StrFormat("; loaded in %.2f s", runner->load_seconds_));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

absl::StatusOr<c10::IValue> TorchRunner::RunPackage(const at::Tensor& x, const std::string& input_shape) {
  const Package& p = *package_;
  if (x.dim() == 4 && x.size(0) > p.batch_max) {  // Every batch would be: the job's setting, not a row's.
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", options_.model_path, "' was exported for inputs ", p.describe, "; this batch is ", input_shape,
        ": use a --batch-size of at most the export's, or export again with a larger one"));
  }
  if (x.dim() != 4 || x.size(0) < 1 || x.size(1) != 3 || x.size(2) != p.height || x.size(3) != p.width ||
      x.scalar_type() != at::kFloat) {
    // The rows' own size: they fail with this reason (one at a time, as when a model raises), and
    // the rows of the export's size are evaluated.
    return absl::AbortedError(absl::StrCat(
        "model '", options_.model_path, "' was exported for inputs ", p.describe, "; this batch is ", input_shape,
        ": export it again with this --input-size, or give the job --input-size ", p.height, "x", p.width));
  }
  // A package of a fixed batch size takes a smaller batch padded with zeros; the rows' outputs are
  // the first ones (the network treats images independently: eval mode).
  const int64_t n = x.size(0);
  at::Tensor input = x.contiguous();
  if (!p.batch_dynamic && n < p.batch_max) input = at::cat({input, at::zeros({p.batch_max - n, 3, p.height, p.width}, input.options())}, 0);
  auto run = [&] { return p.loader->run({input}, at::cuda::getCurrentCUDAStream(device_.index()).stream()); };
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> outs, RunGuarded(run, input_shape));
  if (outs.empty()) {
    return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' returned no outputs"));
  }
  if (outs[0].dim() < 1 || outs[0].size(0) != input.size(0)) {
    return absl::AbortedError(absl::StrCat("model '", options_.model_path, "' returned ", outs[0].dim() < 1 ? 0 : outs[0].size(0),
                                           " outputs for a batch of ", input.size(0)));
  }
  return c10::IValue(input.size(0) == n ? outs[0] : outs[0].narrow(0, 0, n));
}

#else  // No packages in this build: ModelRunner::Create refuses .pt2 before these are reached.

absl::StatusOr<std::unique_ptr<ModelRunner>> TorchRunner::CreateFromPackage(const ModelRunnerOptions& options) {
  return absl::InvalidArgumentError(
      absl::StrCat("model '", options.model_path, "': this tally-worker does not load AOTInductor packages"));
}

absl::StatusOr<c10::IValue> TorchRunner::RunPackage(const at::Tensor&, const std::string&) {
  return absl::InternalError("no AOTInductor packages in this build");
}

#endif

}  // namespace torch_internal
}  // namespace tally
