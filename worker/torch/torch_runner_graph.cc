// TorchRunner: CUDA graphs of a launch's device part (torch_runner.h, GraphedLaunch). A batch of the
// shape the graphs hold is uploaded into a graph's static inputs and the graph replayed: the same
// kernels as the eager launch, in the same order on the same stream, so the same values, for one
// graph launch of CPU work instead of hundreds of kernel launches through TorchScript.
#include "worker/torch/torch_runner.h"

#include <cstdlib>

namespace tally {
namespace torch_internal {

#if TALLY_WITH_CUDA

std::string TorchRunner::GraphKey(torch::jit::Module& module, bool channels_last, const Groups& host,
                                  const BatchSpec& batch, bool want_labels) const {
  // On unless TALLY_CUDA_GRAPHS=0 is in the environment (to compare with the eager path, or to rule
  // graphs out when a model misbehaves).
  static const bool env_off = [] {
    const char* v = std::getenv("TALLY_CUDA_GRAPHS");
    return v != nullptr && std::string(v) == "0";
  }();
  // What a graph holds: one group of same-sized images, scored by the fused kernels (surface
  // distances and calibration too, where the device computes them; calibration only when every image
  // counts in the batch's fine histogram; no threshold sweep, no scores), in fp32 (autocast's cast
  // cache cannot be captured), by the evaluation's own module (not a layout trial's copy), with no
  // trial running beside it and no layout being timed; not an AOTInductor package (its container
  // keeps CUDA events of its own between runs).
  if (!cuda_ || env_off || package_ || !graphs_enabled_ || !host.uniform || host.images.size() != 1 ||
      !options_.thresholds.empty() || (options_.calibration && batch.calibration_items >= 0) ||
      (batch.want_scores && single_score_) || options_.precision != "fp32" || options_.jit_optimize ||
      &module != &module_ || beside_ || timing_passes_.load() > 0) {
    return "";
  }
  // The surface kernels' options are arguments of their launches: part of what a graph holds.
  const SurfaceOptions& so = batch.surface.options;
  return absl::StrCat(Shape(host.images[0]), channels_last ? " channels-last" : "", want_labels ? " labels" : "",
                      batch.surface.enabled ? absl::StrFormat(" surfaces (spacing %.17g x %.17g, tolerance %.17g)",
                                                              so.spacing_y, so.spacing_x, so.nsd_tolerance)
                                            : "");
}

std::string TorchRunner::CaptureGraph(GraphedLaunch* g, at::cuda::MempoolId_t pool, torch::jit::Module& module,
                                      bool channels_last, const Groups& host, bool want_labels,
                                      const SurfaceRequest& surface, const std::string& input_shape) {
  const auto bytes = at::TensorOptions().device(device_).dtype(at::kByte);
  g->images = at::zeros(host.images[0].sizes(), bytes);
  g->masks = at::zeros(host.masks[0].sizes(), bytes.dtype(at::kShort));
  g->replayed = std::make_unique<at::cuda::CUDAEvent>();
  g->graph = std::make_unique<at::cuda::CUDAGraph>();
  Groups dev;
  dev.uniform = true;
  dev.n = host.n;
  dev.images = {g->images};
  dev.masks = {g->masks};
  std::string error;
  // Thread-local: the other threads' CUDA calls (uploads, copies of results) go on meanwhile.
#if TALLY_TORCH_AT_LEAST(2, 1)
  g->graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
  g->graph->capture_begin(pool);
#endif
  try {
    at::Tensor x = Preprocess(dev, channels_last);
    absl::StatusOr<c10::IValue> raw = Forward(module, x, input_shape);
    x = at::Tensor();
    if (!raw.ok()) {
      error = std::string(raw.status().message());
    } else if (absl::StatusOr<at::Tensor> logits = ExtractLogits(*raw, options_.model_path); !logits.ok()) {
      error = std::string(logits.status().message());
    } else if (absl::Status s = PostprocessGroups(*logits, dev, input_shape, want_labels, surface, &g->out);
               !s.ok()) {
      error = std::string(s.message());
    } else if (!g->out.on_kernels || g->out.surface_missing) {
      error = "the outputs were not scored by the fused kernels";
    }
  } catch (const std::exception& e) {
    error = ShortText(e.what());
  }
  try {
    g->graph->capture_end();  // Ends the capture even when it failed; throws then.
  } catch (const std::exception& e) {
    if (error.empty()) error = ShortText(e.what());
  }
  return error;
}

TorchRunner::GraphedLaunch* TorchRunner::GraphFor(torch::jit::Module& module, bool channels_last, const Groups& host,
                                                  const std::string& key, bool want_labels,
                                                  const SurfaceRequest& surface, const std::string& input_shape) {
  if (key.empty()) return nullptr;
  if (key == graph_key_) {
    GraphedLaunch* g = &graphs_[next_graph_];
    next_graph_ ^= 1;
    return g;
  }
  // Captured for a shape the eager path has run twice in a row on the fused kernels (surfaces
  // included, where asked for): warm (cuDNN's plans, lazy initialisation) and known to fit in memory.
  {
    absl::MutexLock lock(&eager_mu_);
    if (key != eager_key_ || eager_in_a_row_ < 2) return nullptr;
  }
  c10::cuda::CUDAStreamGuard guard(*compute_stream_);
  compute_stream_->synchronize();  // Nothing of earlier batches in the stream while it captures.
  graph_key_.clear();
  for (GraphedLaunch& g : graphs_) g = GraphedLaunch();
  // The eager batches' cached blocks go back to the device first: the graphs' memory is a pool of
  // its own, and both graphs share it (replayed one after the other on one stream, never at once;
  // each keeps its own inputs and outputs, only the forward pass's scratch is shared), so the
  // graphs cost about one batch's memory more than the eager path, not two.
  c10::cuda::CUDACachingAllocator::emptyCache();
  for (GraphedLaunch& g : graphs_) {
    const at::cuda::MempoolId_t pool = &g == &graphs_[0] ? at::cuda::MempoolId_t{0, 0} : graphs_[0].graph->pool();
    if (std::string error = CaptureGraph(&g, pool, module, channels_last, host, want_labels, surface, input_shape);
        !error.empty()) {
      for (GraphedLaunch& h : graphs_) h = GraphedLaunch();
      graphs_enabled_ = false;
      cudaGetLastError();  // A failed capture's error is not the next kernel's.
      Log("CUDA graphs off for this model: capturing a batch of ", key, " failed: ", error);
      return nullptr;
    }
  }
  // A call the capture refused (and PyTorch let pass) leaves its error behind; it is not the next
  // kernel's.
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    Log("CUDA graphs: cleared an error the capture left: ", cudaGetErrorString(e));
  }
  graph_key_ = key;
  next_graph_ = 1;
  Log("CUDA graphs captured for batches of ", key, " (TALLY_CUDA_GRAPHS=0 turns them off)");
  return &graphs_[0];
}

absl::StatusOr<std::unique_ptr<PendingBatch>> TorchRunner::ReplayGraph(GraphedLaunch* g, const Groups& host,
                                                                       bool labels_to_host) {
  const char* step = "upload";
  try {
    at::cuda::CUDAEvent uploaded;
    {
      c10::cuda::CUDAStreamGuard guard(*copy_stream_);
      g->replayed->block(*copy_stream_);  // Its previous replay has read its inputs.
      g->images.copy_(host.images[0], /*non_blocking=*/true);
      g->masks.copy_(host.masks[0], /*non_blocking=*/true);
      uploaded.record(*copy_stream_);
    }
    c10::cuda::CUDAStreamGuard guard(*compute_stream_);
    step = "wait";
    uploaded.block(*compute_stream_);
    step = "replay";
    g->graph->replay();
    step = "record";
    g->replayed->record(*compute_stream_);
    // The outputs copied on the compute stream, before anything else runs on it: the two graphs
    // share one memory pool, so the other graph's next replay may write its scratch where this
    // one's outputs are (found on an H200: saved predictions wrong, counts right); the copies are
    // the batch's own, for the results stream and for labels kept on the device (thumbnails).
    step = "clone";
    Outputs o = g->out;
    auto own = [](std::vector<at::Tensor>* v) {
      for (at::Tensor& t : *v) t = t.clone();
    };
    own(&o.counts);
    own(&o.labels);
    own(&o.nonfinite);
    own(&o.thresholds);
    own(&o.surface);
    own(&o.calibration);
    if (o.ties.defined()) o.ties = o.ties.clone();
    if (o.calibration_fine.defined()) o.calibration_fine = o.calibration_fine.clone();
    step = "results";
    return ResultsToHost(o, labels_to_host);
  } catch (const std::exception& e) {
    Log("CUDA graph ", g - graphs_, " failed at its ", step);
    throw;
  }
}

void TorchRunner::NoteEagerLaunch(const std::string& key, bool on_kernels) {
  if (key.empty()) return;
  absl::MutexLock lock(&eager_mu_);
  if (!on_kernels) {
    eager_key_.clear();
    eager_in_a_row_ = 0;
  } else if (key == eager_key_) {
    ++eager_in_a_row_;
  } else {
    eager_key_ = key;
    eager_in_a_row_ = 1;
  }
}

#endif  // TALLY_WITH_CUDA

}  // namespace torch_internal
}  // namespace tally
