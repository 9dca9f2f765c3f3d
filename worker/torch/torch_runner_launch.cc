// TorchRunner: one launch: a batch's host groups uploaded on the copy stream, preprocessed,
// through the model, postprocessed on the device (argmax, confusion counts, thresholds, surface
// distances) and its results copied back to pinned host memory.
#include "worker/torch/torch_runner.h"

#include <cmath>
#include <cstdlib>
#include <optional>

#include "metrics/calibration.h"
#include "metrics/coco_rle.h"
#include "metrics/label_counts.h"

namespace tally {
namespace torch_internal {

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

absl::StatusOr<at::Tensor> TorchRunner::CheckLogits(const at::Tensor& raw_logits, const at::Tensor& gt,
                                                    const std::string& input_shape, Outputs* o) {
  const int64_t n = gt.size(0), H = gt.size(1), W = gt.size(2);
  if (raw_logits.dim() != 4 || raw_logits.size(0) != n || raw_logits.size(1) < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", options_.model_path, "' returned logits of shape ", Shape(raw_logits), " for an input of shape ",
        input_shape, "; expected [N, C, H, W] with N = ", n, " and C >= 1"));
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
  single_score_ = C == 1;
  if (C == 1 && o->want_scores) {
    // The probability quantised as the prediction store keeps it (QuantizeScore: NaN as 0); the int32
    // value's low 16 bits are the uint16 score.
    const at::Tensor p = at::nan_to_num(at::sigmoid(logits.select(1, 0)), 0.0, 1.0, 0.0);
    o->scores.push_back(p.mul(65535.0).round().to(at::kInt).to(at::kShort));
  }
  if (o->k != 0 && o->k != K) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned ", C,
                                                      " channels for one input and a different number for another"));
  }
  o->k = static_cast<int>(K);
  return logits;
}

bool TorchRunner::PostprocessOnKernels(const at::Tensor& logits, const at::Tensor& gt, bool want_labels,
                                       const SurfaceRequest& surface, Outputs* o) {
#if TALLY_CUDA_KERNELS
  std::vector<at::Tensor>* counts = &o->counts;
  std::vector<at::Tensor>* labels = &o->labels;
  std::vector<at::Tensor>* nonfinite = &o->nonfinite;
  at::Tensor* ties = &o->ties;
  const int64_t n = gt.size(0), H = gt.size(1), W = gt.size(2);
  const int64_t C = logits.size(1);
  const int64_t K = o->k;
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
      return true;
    }
  }
#endif
  return false;
}

void TorchRunner::PostprocessWithTorch(const at::Tensor& logits, const at::Tensor& gt, bool want_labels, Outputs* o) {
  std::vector<at::Tensor>* counts = &o->counts;
  std::vector<at::Tensor>* labels = &o->labels;
  std::vector<at::Tensor>* nonfinite = &o->nonfinite;
  at::Tensor* ties = &o->ties;
  const int64_t n = gt.size(0);
  const int64_t C = logits.size(1);
  const int64_t K = o->k;
  // NaN/Inf per image in the logits as evaluated (float32, at the mask's size).
  nonfinite->push_back(at::isfinite(logits).logical_not().sum({1, 2, 3}).to(at::kLong));
  at::Tensor pred = C == 1 ? logits.select(1, 0).gt(0).to(at::kLong) : logits.argmax(1);
  if (options_.count_logit_ties && C >= 2) {
    at::Tensor top2 = std::get<0>(logits.topk(2, 1));
    at::Tensor t = top2.select(1, 0).eq(top2.select(1, 1)).sum();
    *ties = ties->defined() ? *ties + t : t;
  }
  if (!logits.is_cuda() && K <= 256 && gt.numel() / std::max<int64_t>(1, n) < (int64_t{1} << 31)) {
    // On the CPU, one pass over the labels (metrics/label_counts.h, 32-bit cells per image) instead
    // of the index arithmetic below, whose int64 temporaries cost some 40 bytes a pixel: the same
    // counts.
    at::Tensor c = at::zeros({n, K, K}, at::TensorOptions().dtype(at::kLong));
    const at::Tensor ref16 = gt.to(at::kShort).contiguous();
    const at::Tensor pred16 = pred.to(at::kShort).contiguous();
    const int64_t hw = gt.numel() / std::max<int64_t>(1, n);
    for (int64_t i = 0; i < n; ++i) {
      CountConfusionMatrix(reinterpret_cast<const uint16_t*>(pred16.data_ptr<int16_t>()) + i * hw,
                           reinterpret_cast<const uint16_t*>(ref16.data_ptr<int16_t>()) + i * hw,
                           static_cast<size_t>(hw), static_cast<int>(K), c.data_ptr<int64_t>() + i * K * K);
    }
    counts->push_back(c);
    if (want_labels) labels->push_back(pred16);
    return;
  }
  at::Tensor ref = gt.to(at::kLong);
  // Prepared masks hold ignored pixels as -1 (metrics/label_counts.h kIgnoredPixel): out of [0, K).
  at::Tensor valid = ref.ge(0).logical_and(ref.lt(K));
  at::Tensor base = at::arange(n, ref.options()).view({n, 1, 1}).mul(K * K);
  at::Tensor idx = at::where(valid, base + ref * K + pred, at::full({}, n * K * K, ref.options()));
  at::Tensor c = at::bincount(idx.reshape({-1}), {}, n * K * K + 1).narrow(0, 0, n * K * K).view({n, K, K});
  counts->push_back(c);
  if (want_labels) labels->push_back(pred.to(at::kShort));
}

void TorchRunner::CountCalibrationOf(const at::Tensor& logits, const at::Tensor& gt, Outputs* o) const {
  const int64_t n = gt.size(0), hw = gt.size(1) * gt.size(2);
  const int k = o->k;
  const bool single = logits.size(1) == 1;
  // A single logit's class-1 probability as LibTorch computes it, at the store's precision
  // (QuantizeScore: NaN as 0) where the rows it answers are counted so.
  at::Tensor one;
  if (single) {
    one = at::sigmoid(logits.select(1, 0));
    if (options_.calibration_quantized) one = at::nan_to_num(one, 0.0, 1.0, 0.0).mul(65535.0).round().div(65535.0);
    one = one.contiguous();
  }
  const at::Tensor ref = gt.to(at::kShort).contiguous();
  const auto long_opts = ref.options().dtype(at::kLong);
  at::Tensor rows = at::zeros({n, CalibrationRowSize(k)}, long_opts);
  if (!o->calibration_fine.defined()) o->calibration_fine = at::zeros({CalibrationFineSize(k)}, long_opts);
#if TALLY_CUDA_KERNELS
  if (cuda_) {
    // One pass over each pixel: the softmax (of more than one logit) and the labels computed there.
    const at::Tensor lg = logits.contiguous();
    CalibrationInput in;
    in.logits = lg.data_ptr<float>();
    in.channels = static_cast<int>(logits.size(1));
    in.one = single ? one.data_ptr<float>() : nullptr;
    in.ref = ref.data_ptr<int16_t>();
    in.n = n;
    in.k = k;
    in.hw = hw;
    at::Tensor scratch = at::empty({CalibrationScratchWords(k)}, long_opts);
    if (LaunchCalibration(in, rows.data_ptr<int64_t>(), o->calibration_fine.data_ptr<int64_t>(),
                          scratch.data_ptr<int64_t>(), at::cuda::getCurrentCUDAStream().stream(), o->fine_images)) {
      o->calibration.push_back(rows);
      return;
    }
  }
#endif
  // The CPU's count (on a CUDA device without the kernels, or out of their range: of the tensors
  // brought to the host): the probabilities as LibTorch computes them, the labels as the argmax.
  const at::Tensor probs = (single ? at::cat({at::ones_like(one).sub_(one).unsqueeze(1), one.unsqueeze(1)}, 1)
                                   : at::softmax(logits, 1)).contiguous();
  const at::Tensor pred = (single ? logits.select(1, 0).gt(0) : logits.argmax(1)).to(at::kShort).contiguous();
  const at::Tensor hp = probs.to(at::kCPU), hr = ref.to(at::kCPU), hl = pred.to(at::kCPU);
  at::Tensor hrows = at::zeros({n, CalibrationRowSize(k)}, at::TensorOptions().dtype(at::kLong));
  at::Tensor hfine = at::zeros({CalibrationFineSize(k)}, at::TensorOptions().dtype(at::kLong));
  CountCalibration(hp.data_ptr<float>(), hr.data_ptr<int16_t>(), hl.data_ptr<int16_t>(), n, k, hw,
                   hrows.data_ptr<int64_t>(), hfine.data_ptr<int64_t>(), o->fine_images);
  o->calibration.push_back(hrows.to(rows.device()));
  o->calibration_fine.add_(hfine.to(rows.device()));
}

absl::Status TorchRunner::Postprocess(const at::Tensor& raw_logits, const at::Tensor& gt, const std::string& input_shape,
                                      bool want_labels, const SurfaceRequest& surface, Outputs* o) {
  ASSIGN_OR_RETURN(const at::Tensor logits, CheckLogits(raw_logits, gt, input_shape, o));
  if (options_.calibration) CountCalibrationOf(logits, gt, o);
  if (PostprocessOnKernels(logits, gt, want_labels, surface, o)) return absl::OkStatus();
  o->on_kernels = false;
  if (surface.enabled) o->surface_missing = true;
  PostprocessWithTorch(logits, gt, want_labels, o);
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
  // One size, back to back in the buffers (a batch the pipeline staged; the prediction store's
  // rows left to the model may leave gaps).
  const BatchImage& first = batch.items[0];
  const size_t pixels = static_cast<size_t>(first.height) * first.width;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const BatchImage& it = batch.items[i];
    g.uniform &= it.height == first.height && it.width == first.width &&
                 it.image_offset == first.image_offset + i * pixels * 3 && it.mask_offset == first.mask_offset + i * pixels;
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

// The resize rule of Preprocess: every image to --input-height x --input-width where given.
std::string TorchRunner::ModelInputShape(int64_t n, int64_t h, int64_t w) const {
  const bool resized = options_.input_height > 0;
  return absl::StrCat("[", n, ", 3, ", resized ? options_.input_height : h, ", ", resized ? options_.input_width : w,
                      "]");
}

at::Tensor TorchRunner::Preprocess(const Groups& dev, bool channels_last) const {
  auto preprocess = [&](const at::Tensor& u8) {
    at::Tensor x = u8.permute({0, 3, 1, 2}).to(at::kFloat).div_(255.0);
    if (mean_.defined()) x = x.sub_(mean_);
    if (std_.defined()) x = x.div_(std_);
    if (options_.input_height > 0) {  // ModelInputShape says the same.
      x = at::upsample_bilinear2d(x, {options_.input_height, options_.input_width}, /*align_corners=*/false);
    }
    return x.contiguous(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  };
  if (dev.uniform) return preprocess(dev.images[0]);
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : dev.images) parts.push_back(preprocess(t));
  return at::cat(parts, 0);
}

absl::StatusOr<c10::IValue> TorchRunner::Forward(torch::jit::Module& module, const at::Tensor& x,
                                                 const std::string& input_shape) {
  if (package_) return RunPackage(x, input_shape);
  return RunGuarded(
      [&] {
        // Per calling thread: the batcher's, the completion thread's retries and estimate's trials alike.
        torch::jit::GraphOptimizerEnabledGuard optimize(options_.jit_optimize);
        return module.forward({x});
      },
      input_shape);
}

namespace {

// The per-image detection dicts of a model's output, or an empty list when it returned something
// else: a list of dicts holding "masks", or a tuple whose last element is one (torchvision's
// scripted detectors return (losses, detections)).
c10::List<c10::IValue> DetectionDicts(const c10::IValue& out) {
  c10::IValue list = out;
  if (out.isTuple() && !out.toTupleRef().elements().empty()) list = out.toTupleRef().elements().back();
  if (!list.isList()) return c10::impl::GenericList(c10::AnyType::get());
  c10::List<c10::IValue> items = list.toList();
  if (items.size() == 0 || !items.get(0).isGenericDict()) return c10::impl::GenericList(c10::AnyType::get());
  for (const auto& kv : items.get(0).toGenericDict()) {
    if (kv.key().isString() && kv.key().toStringRef() == "masks") return items;
  }
  return c10::impl::GenericList(c10::AnyType::get());
}

// One image's detection dict decoded at `height` x `width`; "" or what breaks the contract.
std::string DecodeDetections(const c10::IValue& value, int height, int width, int classes,
                             std::vector<CocoInstance>* out) {
  at::Tensor masks, scores, labels;
  for (const auto& kv : value.toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isTensor()) continue;
    const std::string& key = kv.key().toStringRef();
    if (key == "masks") masks = kv.value().toTensor();
    if (key == "scores") scores = kv.value().toTensor();
    if (key == "labels") labels = kv.value().toTensor();
  }
  if (!masks.defined() || !scores.defined() || !labels.defined()) {
    return "the model's detection dict lacks masks, scores or labels (tensors)";
  }
  if (masks.dim() == 4 && masks.size(1) == 1) masks = masks.squeeze(1);
  if (masks.dim() != 3 || masks.size(1) != height || masks.size(2) != width) {
    return absl::StrCat("the model's masks have shape ", Shape(masks), "; expected N x ", height, " x ", width,
                        " (or N x 1 x H x W), the image's size (instance outputs are not resized: no --input-size)");
  }
  const int64_t n = masks.size(0);
  if (scores.numel() != n || labels.numel() != n) {
    return absl::StrCat("the model returned ", n, " masks, ", scores.numel(), " scores and ", labels.numel(), " labels");
  }
  if (masks.is_floating_point()) masks = masks > 0.5;  // Probabilities, thresholded on the device.
  const at::Tensor m = masks.to(at::kCPU, at::kByte).contiguous();
  const at::Tensor s = scores.to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor l = labels.to(at::kCPU, at::kLong).contiguous();
  const uint8_t* mp = m.data_ptr<uint8_t>();
  for (int64_t d = 0; d < n; ++d) {
    CocoInstance inst;
    inst.id = d + 1;
    inst.category_id = l.data_ptr<int64_t>()[d];
    inst.score = s.data_ptr<double>()[d];
    if (!std::isfinite(inst.score)) return absl::StrCat("the model's detection ", d, " has a score of NaN or infinity");
    if (inst.category_id < 1 || inst.category_id >= classes) {
      return absl::StrCat("the model's detection ", d, " has label ", inst.category_id,
                          ", not a category id of the annotation file (1..", classes - 1, ")");
    }
    inst.mask = RleFromMask(mp + d * static_cast<int64_t>(height) * width, height, width);
    out->push_back(std::move(inst));
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<PendingBatch>> TorchRunner::InstancesToHost(const c10::IValue& out,
                                                                            const BatchSpec& batch) {
  const c10::List<c10::IValue> dicts = DetectionDicts(out);
  if (dicts.size() == 0) return std::unique_ptr<PendingBatch>();
  const size_t n = batch.items.size();
  if (dicts.size() != n) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned ", dicts.size(),
                                                      " detection dicts for ", n, " images"));
  }
  const int k = options_.num_classes;
  if (k <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned detections (masks, ",
                                                      "scores, labels): instance outputs are scored against COCO ",
                                                      "annotations (--coco with --images)"));
  }
  auto pending = std::make_unique<TorchPendingBatch>();
  pending->k_ = k;
  pending->instances_.resize(n);
  pending->owned_labels_.resize(n);
  pending->errors_.assign(n, std::string());
  pending->owned_counts_.assign(n * k * k, 0);
  for (size_t i = 0; i < n; ++i) {
    const BatchImage& it = batch.items[i];
    const size_t hw = static_cast<size_t>(it.height) * it.width;
    std::vector<uint16_t>& labels = pending->owned_labels_[i];
    labels.assign(hw, 0);
    pending->errors_[i] = DecodeDetections(dicts.get(i), it.height, it.width, k, &pending->instances_[i]);
    if (pending->errors_[i].empty()) {
      PaintCocoLabels(pending->instances_[i], true, it.height, it.width, labels.data());
      const uint16_t* mask = reinterpret_cast<const uint16_t*>(batch.masks->data()) + it.mask_offset;
      CountConfusionMatrix(labels.data(), mask, hw, k, pending->owned_counts_.data() + i * k * k);
    }
    pending->label_ptrs_.push_back(labels.data());
  }
  pending->counts_ = pending->owned_counts_.data();
  return std::unique_ptr<PendingBatch>(std::move(pending));
}

absl::Status TorchRunner::PostprocessGroups(const at::Tensor& logits, const Groups& dev, const std::string& input_shape,
                                            bool device_labels, const SurfaceRequest& surface, Outputs* o) {
  if (dev.uniform) {
    o->fine_images = o->calibration_items;
    return Postprocess(logits, dev.masks[0], input_shape, device_labels, surface, o);
  }
  if (logits.dim() != 4 || logits.size(0) != dev.n) {
    return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_path, "' returned logits of shape ",
                                                      Shape(logits), " for an input of shape ", input_shape,
                                                      "; expected [N, C, H, W] with N = ", dev.n));
  }
  for (int64_t i = 0; i < dev.n; ++i) {
    o->fine_images = o->calibration_items < 0 || i < o->calibration_items ? -1 : 0;
    RETURN_IF_ERROR(Postprocess(logits.narrow(0, i, 1), dev.masks[i], input_shape, device_labels, surface, o));
  }
  return absl::OkStatus();
}

std::unique_ptr<PendingBatch> TorchRunner::ResultsToHost(const Outputs& o, bool want_labels) {
  auto pending = std::make_unique<TorchPendingBatch>();
  pending->k_ = o.k;
  // Each result as one device tensor (groups concatenated on the compute stream), then copied.
  const auto one = [](const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 0); };
  const at::Tensor counts = one(o.counts), nonfinite = one(o.nonfinite);
  const bool surface = !o.surface.empty() && !o.surface_missing;
  auto host_opts = at::TensorOptions().device(at::kCPU);
#if TALLY_WITH_CUDA
  // On CUDA the copies to (pinned) host memory go on a stream of their own, after the launch's
  // work: the pinned memory's allocator records an event on every stream a block was copied on
  // when the block is freed, from whichever thread frees it, and an event recorded on a stream
  // while a CUDA graph is captured on it belongs to the capture (torch_runner_graph.cc); querying
  // it later fails (cudaErrorInvalidValue). The device tensors copied are kept until the batch is
  // done: the compute stream may reuse their memory as soon as they are freed.
  std::optional<c10::cuda::CUDAStreamGuard> on_results;
  if (cuda_) {
    host_opts = host_opts.pinned_memory(true);
    at::cuda::CUDAEvent computed;
    computed.record(*compute_stream_);
    computed.block(*results_stream_);
    on_results.emplace(*results_stream_);
  }
#endif
  auto to_host = [&](const at::Tensor& all, at::ScalarType type) {
    at::Tensor h = at::empty(all.sizes(), host_opts.dtype(type));
    h.copy_(all, /*non_blocking=*/cuda_);
    if (cuda_) pending->device_inputs_.push_back(all);
    return h;
  };
  pending->counts_host_ = to_host(counts, at::kLong);
  pending->counts_ = pending->counts_host_.data_ptr<int64_t>();
  if (!want_labels) {
    for (const at::Tensor& l : o.labels) {
      for (int64_t i = 0; i < l.size(0); ++i) pending->device_labels_.emplace_back(l, i);
    }
  }
  // Label maps and scores per group (groups may differ in size): int16 [n, H, W] each.
  const auto maps_to_host = [&](const std::vector<at::Tensor>& groups, std::vector<at::Tensor>* hosts,
                                std::vector<const uint16_t*>* ptrs) {
    for (const at::Tensor& g : groups) {
      at::Tensor h = to_host(g, at::kShort);
      for (int64_t i = 0; i < g.size(0); ++i) {
        ptrs->push_back(reinterpret_cast<const uint16_t*>(h.data_ptr<int16_t>() + i * g.size(1) * g.size(2)));
      }
      hosts->push_back(h);
    }
  };
  if (want_labels) maps_to_host(o.labels, &pending->labels_host_, &pending->label_ptrs_);
  maps_to_host(o.scores, &pending->scores_host_, &pending->score_ptrs_);
  pending->nonfinite_host_ = to_host(nonfinite, at::kLong);
  pending->nonfinite_ptr_ = pending->nonfinite_host_.data_ptr<int64_t>();
  if (o.ties.defined()) pending->ties_ = to_host(o.ties, at::kLong);
  if (!o.calibration.empty()) pending->calibration_host_ = to_host(one(o.calibration), at::kLong);
  if (o.calibration_fine.defined()) pending->calibration_fine_host_ = to_host(o.calibration_fine, at::kLong);
  if (!o.thresholds.empty()) {
    pending->thresholds_host_ = to_host(one(o.thresholds), at::kLong);
    pending->thresholds_ptr_ = pending->thresholds_host_.data_ptr<int64_t>();
    pending->num_thresholds_ = options_.thresholds.size();
  }
  if (surface) {
    pending->surface_host_ = to_host(one(o.surface), at::kDouble);
    pending->surface_ptr_ = pending->surface_host_.data_ptr<double>();
  }
#if TALLY_WITH_CUDA
  if (cuda_) {
    // The completion thread sleeps on the event instead of spinning: CUDA's default for a process
    // with fewer contexts than CPUs is to spin, which kept a CPU busy per worker for the whole of
    // every batch, taken from the decode threads beside it (measured on four H200s, 2026-11-28).
    // TALLY_SPIN_WAIT=1 spins as before (the A/B of that measurement). After the copies, so after
    // the launch's work too.
    static const unsigned int flags =
        cudaEventDisableTiming | (std::getenv("TALLY_SPIN_WAIT") != nullptr ? 0u : cudaEventBlockingSync);
    pending->done_ = std::make_unique<at::cuda::CUDAEvent>(flags);
    pending->done_->record(*results_stream_);
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
  const bool device_labels = batch.want_labels || batch.keep_labels || batch.surface.enabled;
#if TALLY_WITH_CUDA
  const std::string graph_key = timed ? "" : GraphKey(module, channels_last, host, batch, device_labels);
  if (!graph_key.empty()) {
    const at::Tensor& img = host.images[0];  // [n, H, W, 3].
    *input_shape = ModelInputShape(img.size(0), img.size(1), img.size(2));
    absl::MutexLock graphs(&graph_mu_);
    if (GraphedLaunch* g = GraphFor(module, channels_last, host, graph_key, device_labels, batch.surface, *input_shape)) {
      return ReplayGraph(g, host, batch.want_labels);
    }
  }
  absl::ReaderMutexLock eager(&graph_mu_);  // No capture while this launch queues its kernels.
#endif
  std::unique_ptr<ComputeStreamScope> compute;  // On CUDA, the rest runs on the compute stream.
  const Groups dev = Upload(host, &compute);
  step("upload");
  at::Tensor x = Preprocess(dev, channels_last);
  step("preprocess");
  *input_shape = Shape(x);
  ASSIGN_OR_RETURN(const c10::IValue raw, Forward(module, x, *input_shape));
  x = at::Tensor();  // The input is not needed past the forward pass: its memory goes back first.
  step("forward");
  ASSIGN_OR_RETURN(std::unique_ptr<PendingBatch> instances, InstancesToHost(raw, batch));
  if (instances) return instances;
  ASSIGN_OR_RETURN(const at::Tensor logits, ExtractLogits(raw, options_.model_path));
  Outputs outputs;
  outputs.want_scores = batch.want_scores;
  outputs.calibration_items = batch.calibration_items;
  RETURN_IF_ERROR(PostprocessGroups(logits, dev, *input_shape, device_labels, batch.surface, &outputs));
  step("postprocess");
#if TALLY_WITH_CUDA
  NoteEagerLaunch(graph_key, outputs.on_kernels && !outputs.surface_missing);
#endif
  // Where the device could not score the surfaces, the labels go to the host for the CPU to.
  auto pending = ResultsToHost(outputs, batch.want_labels || (batch.surface.enabled && outputs.surface_missing));
  step("results to host");
  if (timed) Log("first launch (", *input_shape, "): ", steps);
  return pending;
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

int64_t TorchRunner::MeasureHostBytes(const BatchSpec& batch) {
  if (cuda_ || launch_thread_) return -1;  // Device tensors; a launch thread of its own (CUDA only).
  auto peak = std::make_shared<HostMemoryPeak>();
  absl::StatusOr<std::unique_ptr<PendingBatch>> pending;
  {
    // Tensors allocated on this thread while the guard lives are counted (the forward pass's
    // outputs and scratch; an intra-op thread's own allocations are not, a small part).
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, peak);
    pending = LaunchWith(module_, channels_last_, batch);
    if (pending.ok() && !(*pending)->Wait().ok()) return -1;
  }
  return pending.ok() ? peak->peak() : -1;
}

}  // namespace torch_internal
}  // namespace tally
