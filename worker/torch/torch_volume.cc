// Volume jobs on TorchScript models (TorchRunner::PredictVolume): the whole volume in one pass, or
// sliding windows as MONAI's sliding_window_inference (monai/inferers/utils.py) runs them:
//   * a volume smaller than the window along an axis is zero-padded there, half before (rounded
//     down) and the rest after, and the output cropped back;
//   * windows start every int(roi x (1 - overlap)) voxels (at least 1; the whole axis when the
//     window covers it), the last moved back to end at the border; row-major order (z slowest);
//   * each window's scores are weighted by a Gaussian importance map (per axis exp(-x^2 / 2 sigma^2)
//     over x = -(n-1)/2 .. (n-1)/2, sigma = 0.125 n, the axes' product, clamped below at max(its
//     minimum, 1e-3)), summed, and divided by the summed weights;
//   * `sw_batch_size` windows per forward pass.
// Everything runs in float32 on the model's device; the summed scores stay there unless they would
// take more than half of the free device memory, in which case they are summed in host memory.
// The labels are the argmax over the channels (first maximum on ties); one channel: logit > 0.
#include "worker/torch/torch_runner.h"

#include <algorithm>
#include <cstring>

namespace tally {
namespace torch_internal {
namespace {

std::vector<int64_t> WindowStarts(int64_t size, int64_t roi, double overlap) {
  const int64_t interval = roi == size ? roi : std::max<int64_t>(static_cast<int64_t>(roi * (1.0 - overlap)), 1);
  const int64_t num = (size + interval - 1) / interval;
  int64_t scan = 1;
  for (int64_t d = 0; d < num; ++d) {
    if (d * interval + roi >= size) {
      scan = d + 1;
      break;
    }
  }
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < scan; ++i) {
    const int64_t s = i * interval;
    starts.push_back(s - std::max<int64_t>(s + roi - size, 0));
  }
  return starts;
}

at::Tensor ImportanceMap(const std::array<int64_t, 3>& roi) {
  at::Tensor map;
  for (int i = 0; i < 3; ++i) {
    const double n = static_cast<double>(roi[i]);
    const double sigma = n * 0.125;
    at::Tensor x = at::arange(-(n - 1) / 2.0, (n - 1) / 2.0 + 1, at::TensorOptions().dtype(at::kFloat));
    x = at::exp(x.pow(2) / (-2 * sigma * sigma));
    map = i == 0 ? x : map.unsqueeze(-1) * x.view(i == 1 ? std::vector<int64_t>{1, roi[1]}
                                                          : std::vector<int64_t>{1, 1, roi[2]});
  }
  const double floor = std::max(map.min().item<double>(), 1e-3);
  return at::clamp_min(map, floor);
}

// The model's scores for a batch of windows: N x K x (window) float32.
absl::StatusOr<at::Tensor> ScoresOf(const c10::IValue& out, int64_t n, const std::array<int64_t, 3>& roi,
                                    const std::string& model) {
  at::Tensor t;
  if (out.isTensor()) {
    t = out.toTensor();
  } else if (out.isTuple() && !out.toTupleRef().elements().empty() && out.toTupleRef().elements()[0].isTensor()) {
    t = out.toTupleRef().elements()[0].toTensor();
  } else if (out.isList() && out.toList().size() > 0 && out.toList().get(0).isTensor()) {
    t = out.toList().get(0).toTensor();
  } else {
    return absl::FailedPreconditionError(absl::StrCat("model '", model, "' returned no tensor for a volume"));
  }
  if (t.dim() != 5 || t.size(0) != n || t.size(2) != roi[0] || t.size(3) != roi[1] || t.size(4) != roi[2]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model, "' returned shape ", Shape(t), " for input windows of ", n, " x C x ", roi[0], " x ",
        roi[1], " x ", roi[2], "; a volume model returns N x K x D x H x W scores of its input's size"));
  }
  return t.to(at::kFloat);
}

}  // namespace

absl::StatusOr<VolumePrediction> TorchRunner::SlidingWindow(const VolumeRequest& r) {
  if (r.dtype != "float32") {
    return absl::InvalidArgumentError("TorchScript models take float32 volumes (--keep-dtype is for Python models)");
  }
  const std::array<int64_t, 3> size = {r.depth, r.height, r.width};
  at::Tensor image = at::from_blob(const_cast<void*>(r.data), {1, r.channels, r.depth, r.height, r.width},
                                   at::TensorOptions().dtype(at::kFloat));
  image = cuda_ ? image.to(device_) : image.clone();
  const bool whole = options_.sliding_window == std::array<int, 3>{0, 0, 0};
  std::array<int64_t, 3> roi{}, before{}, padded{};
  std::vector<int64_t> pad;  // constant_pad_nd order: last axis first.
  for (int a = 2; a >= 0; --a) {
    roi[a] = whole ? size[a] : options_.sliding_window[a];
    const int64_t diff = std::max<int64_t>(roi[a] - size[a], 0);
    before[a] = diff / 2;
    pad.push_back(diff / 2);
    pad.push_back(diff - diff / 2);
    padded[a] = size[a] + diff;
  }
  if (std::any_of(pad.begin(), pad.end(), [](int64_t p) { return p > 0; })) image = at::constant_pad_nd(image, pad, 0);
  std::vector<std::array<int64_t, 3>> windows;
  for (int64_t z : WindowStarts(padded[0], roi[0], options_.overlap)) {
    for (int64_t y : WindowStarts(padded[1], roi[1], options_.overlap)) {
      for (int64_t x : WindowStarts(padded[2], roi[2], options_.overlap)) windows.push_back({z, y, x});
    }
  }
  const std::string shape = absl::StrCat("windows of ", r.channels, " x ", roi[0], " x ", roi[1], " x ", roi[2]);
  at::Tensor weights = ImportanceMap(roi);
  at::Tensor sum, count, result;
  const size_t per_pass = static_cast<size_t>(std::max(1, options_.sw_batch_size));
  for (size_t first = 0; first < windows.size(); first += per_pass) {
    const size_t last = std::min(windows.size(), first + per_pass);
    std::vector<at::Tensor> parts;
    for (size_t w = first; w < last; ++w) {
      const auto& o = windows[w];
      parts.push_back(image.slice(2, o[0], o[0] + roi[0]).slice(3, o[1], o[1] + roi[1]).slice(4, o[2], o[2] + roi[2]));
    }
    absl::StatusOr<c10::IValue> out = Forward(module_, at::cat(parts, 0), shape);
    if (!out.ok()) return out.status();
    absl::StatusOr<at::Tensor> scores = ScoresOf(*out, static_cast<int64_t>(parts.size()), roi, options_.model_path);
    if (!scores.ok()) return scores.status();
    if (windows.size() == 1) {
      result = (*scores)[0];
      break;
    }
    if (!sum.defined()) {
      at::Device where = device_;
#if TALLY_WITH_CUDA
      size_t free_bytes = 0, total_bytes = 0;
      const double bytes = 4.0 * static_cast<double>(scores->size(1) + 1) * padded[0] * padded[1] * padded[2];
      if (cuda_ && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && bytes * 2 > free_bytes) where = at::kCPU;
#endif
      sum = at::zeros({scores->size(1), padded[0], padded[1], padded[2]}, at::TensorOptions().dtype(at::kFloat).device(where));
      count = at::zeros({1, padded[0], padded[1], padded[2]}, sum.options());
      weights = weights.to(where);
    }
    const at::Tensor local = scores->to(sum.device());
    for (size_t w = first; w < last; ++w) {
      const auto& o = windows[w];
      auto region = [&](const at::Tensor& t) {
        return t.slice(1, o[0], o[0] + roi[0]).slice(2, o[1], o[1] + roi[1]).slice(3, o[2], o[2] + roi[2]);
      };
      region(sum).add_(weights * local[static_cast<int64_t>(w - first)]);
      region(count).add_(weights);
    }
  }
  if (!result.defined()) result = sum / count;
  result = result.slice(1, before[0], before[0] + size[0]).slice(2, before[1], before[1] + size[1])
               .slice(3, before[2], before[2] + size[2]);
  VolumePrediction p;
  p.nonfinite = (~at::isfinite(result)).sum().item<int64_t>();
  const at::Tensor labels =
      (result.size(0) == 1 ? (result[0] > 0).to(at::kInt) : result.argmax(0).to(at::kInt)).contiguous().to(at::kCPU);
  p.classes = result.size(0) == 1 ? 2 : static_cast<int>(result.size(0));
  p.labels.resize(static_cast<size_t>(labels.numel()));
  const int32_t* src = labels.data_ptr<int32_t>();
  for (size_t i = 0; i < p.labels.size(); ++i) p.labels[i] = static_cast<uint16_t>(src[i]);
  return p;
}

}  // namespace torch_internal
}  // namespace tally
