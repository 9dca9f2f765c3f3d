#include "worker/python/python_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/sources/tar_shards.h"
#include "base/clock.h"
#include "base/log.h"
#include "common/coco/coco_instances.h"
#include "common/process/subprocess.h"
#include "common/store/prediction_store.h"
#include "metrics/label_counts.h"
#include "google/protobuf/util/json_util.h"
#include "proto/tally.pb.h"
#include "worker/python/python_channel.h"

namespace tally {
namespace python_internal {
namespace {

// What the stub answered for one batch, turned into the counts the pipeline reads.
class PythonPendingBatch final : public PendingBatch {
 public:
  PythonPendingBatch(std::shared_ptr<Channel> channel, v1::StubRequest request, BatchSpec spec,
                     std::unique_ptr<ShmBuffer> output, std::shared_ptr<Reply> reply, std::unique_ptr<ShmBuffer> raw)
      : channel_(std::move(channel)),
        request_(std::move(request)),
        spec_(std::move(spec)),
        output_(std::move(output)),
        raw_(std::move(raw)),
        reply_(std::move(reply)) {}
  ~PythonPendingBatch() override {
    // The stub has answered (or died): nothing writes to the buffer any more.
    if (reply_->done.HasBeenNotified()) channel_->ReturnOutput(std::move(output_));
  }

  absl::Status Wait() override;
  int num_classes() const override { return k_; }
  const int64_t* confusion(int i) const override { return counts_.data() + static_cast<size_t>(i) * k_ * k_; }
  const uint16_t* labels(int i) const override { return label_ptrs_[i]; }
  int64_t nonfinite(int i) const override { return nonfinite_[i]; }
  int64_t logit_ties() const override { return 0; }
  std::string error(int i) const override { return errors_[i]; }
  const int64_t* threshold_counts(int i) const override {
    return thresholds_.empty() ? nullptr : thresholds_.data() + static_cast<size_t>(i) * 4 * num_thresholds_;
  }
  const std::vector<CocoInstance>* instances(int i) const override {
    return instance_kind_[i] ? &instances_[i] : nullptr;
  }
  const uint16_t* scores(int i) const override {
    return owned_scores_.empty() || owned_scores_[i].empty() ? nullptr : owned_scores_[i].data();
  }

 private:
  absl::Status Evaluate();
  void EvaluateImage(size_t i, const v1::StubOutput& out);
  // An instance output: the detections decoded and painted as image i's label map; false (and
  // errors_[i] set) when one breaks the contract.
  bool DecodeInstances(size_t i, const v1::StubOutput& out);

  std::shared_ptr<Channel> channel_;
  v1::StubRequest request_;
  BatchSpec spec_;
  std::unique_ptr<ShmBuffer> output_;
  std::unique_ptr<ShmBuffer> raw_;  // The batch's stored values (16-bit TIFF, DICOM), if any.
  std::shared_ptr<Reply> reply_;
  bool waited_ = false;
  absl::Status status_;
  int k_ = 0;
  std::vector<int> item_k_;
  std::vector<int64_t> counts_;
  std::vector<const uint16_t*> label_ptrs_;
  std::vector<std::vector<uint16_t>> owned_labels_;
  std::vector<std::vector<uint16_t>> owned_scores_;  // BatchSpec::want_scores: score outputs, quantised.
  std::vector<int64_t> nonfinite_;
  std::vector<std::string> errors_;
  size_t num_thresholds_ = 0;
  std::vector<int64_t> thresholds_;
  std::vector<std::vector<CocoInstance>> instances_;
  std::vector<bool> instance_kind_;
};

absl::Status PythonPendingBatch::Wait() {
  if (waited_) return status_;
  waited_ = true;
  reply_->done.WaitForNotification();
  if (!reply_->died.empty() && spec_.items.size() == 1) {
    // One image: restart the stub and try once more before blaming the row.
    Log("[model] the model process died (", reply_->died, ") on row ",
        request_.items(0).index(), "; restarting it and retrying the row once");
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return status_ = absl::FailedPreconditionError(s.message());
    reply_ = channel_->Send(request_);
    reply_->done.WaitForNotification();
  }
  if (!reply_->died.empty()) {
    const std::string died = reply_->died;
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return status_ = absl::FailedPreconditionError(s.message());
    return status_ = absl::AbortedError(absl::StrCat("model process died (", died, ")"));
  }
  const v1::StubResponse& r = reply_->response;
  if (r.oom()) return status_ = absl::ResourceExhaustedError(r.error());
  if (!r.error().empty()) return status_ = absl::AbortedError(absl::StrCat("model raised ", r.error()));
  const double t0 = NowUnix();
  status_ = Evaluate();
  static const bool profile = std::getenv("TALLY_PIPELINE_PROFILE") != nullptr;
  if (profile) {
    // Counting on the CPU, per batch (worker/pipeline/pipeline.h's profile has the rest).
    static std::atomic<int64_t> batches{0}, micros{0};
    micros += static_cast<int64_t>((NowUnix() - t0) * 1e6);
    if (++batches % 50 == 0) {
      Log("python runner profile: counting ", absl::StrFormat("%.2f", micros.load() / 1000.0 / batches.load()),
          " ms per batch over ", batches.load(), " batches");
    }
  }
  return status_;
}

absl::Status PythonPendingBatch::Evaluate() {
  const v1::StubResponse& r = reply_->response;
  const size_t n = spec_.items.size();
  if (static_cast<size_t>(r.outputs_size()) != n) {
    return absl::AbortedError(absl::StrCat("the model process answered ", r.outputs_size(), " outputs for ", n,
                                           " images"));
  }
  const ModelRunnerOptions& o = channel_->options();
  const int declared = channel_->model_classes() > 0 ? channel_->model_classes() : o.num_classes;
  item_k_.assign(n, 0);
  errors_.assign(n, std::string());
  nonfinite_.assign(n, 0);
  label_ptrs_.assign(n, nullptr);
  owned_labels_.resize(n);
  if (spec_.want_scores) owned_scores_.resize(n);
  instances_.assign(n, {});
  instance_kind_.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const v1::StubOutput& out = r.outputs(static_cast<int>(i));
    nonfinite_[i] = out.nonfinite();
    if (!out.error().empty()) {
      errors_[i] = out.error();
    } else if (out.kind() == "argmax") {
      item_k_[i] = out.channels();
      if (declared > 0 && out.channels() != declared) {
        errors_[i] = absl::StrCat("the model returned ", out.channels(), " score channels, but it has ", declared,
                                  " classes (", channel_->model_classes() > 0 ? "Model.num_classes" : "--num-classes",
                                  ")");
      }
    } else if (out.kind() == "score") {
      item_k_[i] = 2;
    } else if (out.kind() == "instances") {
      if (o.num_classes <= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", o.model_path, "' returned detections (masks, scores, labels): instance outputs are scored ",
            "against COCO annotations (--coco with --images)"));
      }
      item_k_[i] = o.num_classes;
      instance_kind_[i] = true;
    } else if (out.kind() == "labels") {
      if (declared <= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", o.model_path, "' returned label maps, but neither its num_classes attribute nor --num-classes "
            "says how many classes there are"));
      }
      item_k_[i] = declared;
    } else {
      errors_[i] = absl::StrCat("the model process answered an unknown output kind '", out.kind(), "'");
    }
    if (!o.thresholds.empty() && errors_[i].empty() && out.kind() != "score") {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", o.model_path, "': --thresholds needs a single-score output (H x W or 1 x H x W floats); it "
          "returned ", out.kind() == "argmax" ? absl::StrCat(out.channels(), " score channels") : "class labels"));
    }
  }
  for (size_t i = 0; i < n && k_ == 0; ++i) k_ = item_k_[i];
  if (k_ == 0) k_ = std::max(2, declared);
  counts_.assign(n * k_ * k_, 0);
  num_thresholds_ = o.thresholds.size();
  thresholds_.assign(n * 4 * num_thresholds_, 0);
  // Counting is per pixel: spread the images over a few threads.
  const size_t threads = std::min<size_t>(n, std::max<size_t>(1, std::min(8u, std::thread::hardware_concurrency() / 2)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      if (errors_[i].empty()) EvaluateImage(i, r.outputs(static_cast<int>(i)));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return absl::OkStatus();
}

void PythonPendingBatch::EvaluateImage(size_t i, const v1::StubOutput& out) {
  const BatchImage& it = spec_.items[i];
  const size_t hw = static_cast<size_t>(it.height) * it.width;
  const uint8_t* base = output_->data() + request_.items(static_cast<int>(i)).output_offset();
  const uint16_t* mask = reinterpret_cast<const uint16_t*>(spec_.masks->data()) + it.mask_offset;
  if (item_k_[i] != k_) {
    errors_[i] = absl::StrCat("the model returned ", item_k_[i], " classes for this image but ", k_,
                              " for others in its batch");
    return;
  }
  const int K = k_;
  const uint16_t* pred = nullptr;
  if (out.kind() == "instances") {
    if (!DecodeInstances(i, out)) return;
    pred = owned_labels_[i].data();
  } else if (out.kind() == "score") {
    const float* score = reinterpret_cast<const float*>(base);
    const bool probs = channel_->outputs_probabilities();
    std::vector<uint16_t>& labels = owned_labels_[i];
    labels.resize(hw);
    int64_t bad = 0;
    const float cut = probs ? 0.5f : 0.0f;
    for (size_t p = 0; p < hw; ++p) {
      bad += !std::isfinite(score[p]);
      labels[p] = score[p] > cut ? 1 : 0;
    }
    nonfinite_[i] = bad;
    pred = labels.data();
    if (spec_.want_scores) {  // As the prediction store keeps them: the probability, 16 bits.
      std::vector<uint16_t>& q = owned_scores_[i];
      q.resize(hw);
      for (size_t p = 0; p < hw; ++p) {
        const double x = score[p];
        q[p] = QuantizeScore(probs ? x : 1.0 / (1.0 + std::exp(-x)));
      }
    }
    const std::vector<double>& ts = channel_->options().thresholds;
    if (!ts.empty()) {
      // Foreground where the probability is > t: for logits, sigmoid(x) > t <=> x > log(t / (1 - t)).
      int64_t* tc = thresholds_.data() + i * 4 * ts.size();
      for (size_t t = 0; t < ts.size(); ++t) {
        const double c = probs ? ts[t] : std::log(ts[t] / (1.0 - ts[t]));
        int64_t tp = 0, fp = 0, fn = 0, tn = 0;
        for (size_t p = 0; p < hw; ++p) {
          const uint16_t ref = mask[p];
          if (ref == kIgnoredPixel || ref >= 2) continue;
          const bool fg = static_cast<double>(score[p]) > c;
          tp += fg && ref == 1;
          fp += fg && ref == 0;
          fn += !fg && ref == 1;
          tn += !fg && ref == 0;
        }
        tc[4 * t] = tp;
        tc[4 * t + 1] = fp;
        tc[4 * t + 2] = fn;
        tc[4 * t + 3] = tn;
      }
    }
  } else {
    pred = reinterpret_cast<const uint16_t*>(base);
  }
  label_ptrs_[i] = pred;
  // A label >= K fails the row, named by its first pixel (the maximum first: one vectorised pass).
  uint16_t top = 0;
  for (size_t p = 0; p < hw; ++p) top = std::max(top, pred[p]);
  if (top >= K) {
    for (size_t p = 0; p < hw; ++p) {
      if (pred[p] >= K) {
        errors_[i] = absl::StrCat("the model's output has label ", pred[p], " at (y=", p / it.width, ", x=",
                                  p % it.width, ") >= number of classes ", K);
        return;
      }
    }
  }
  CountConfusionMatrix(pred, mask, hw, K, counts_.data() + i * K * K);
}

bool PythonPendingBatch::DecodeInstances(size_t i, const v1::StubOutput& out) {
  const BatchImage& it = spec_.items[i];
  std::vector<CocoInstance>& dets = instances_[i];
  for (int d = 0; d < out.instances_size(); ++d) {
    const v1::StubInstance& x = out.instances(d);
    if (x.label() < 1 || x.label() >= k_) {
      errors_[i] = absl::StrCat("the model's detection ", d, " has label ", x.label(),
                                ", not a category id of the annotation file (1..", k_ - 1, ")");
      return false;
    }
    absl::StatusOr<Rle> mask = RleFromCounts({x.counts().begin(), x.counts().end()}, it.height, it.width);
    if (!mask.ok()) {
      errors_[i] = absl::StrCat("the model's detection ", d, ": ", mask.status().message());
      return false;
    }
    CocoInstance inst;
    inst.id = d + 1;
    inst.category_id = x.label();
    inst.score = x.score();
    inst.mask = *std::move(mask);
    dets.push_back(std::move(inst));
  }
  owned_labels_[i].resize(static_cast<size_t>(it.height) * it.width);
  PaintCocoLabels(dets, true, it.height, it.width, owned_labels_[i].data());
  return true;
}

class PythonRunner final : public ModelRunner {
 public:
  explicit PythonRunner(std::shared_ptr<Channel> channel, double load_seconds)
      : channel_(std::move(channel)), load_seconds_(load_seconds) {}
  ~PythonRunner() override {
    channel_->Stop();
    channel_->ClosePool();
  }

  std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) override { return ShmBuffer::Create(channel_, bytes); }

  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) override {
    auto* images = dynamic_cast<ShmBuffer*>(batch.images);
    if (images == nullptr || batch.masks == nullptr || batch.items.empty()) {
      return absl::InternalError("Launch: buffers not allocated by this runner, or an empty batch");
    }
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return absl::FailedPreconditionError(s.message());
    size_t need = 0;
    for (const BatchImage& it : batch.items) need += static_cast<size_t>(it.height) * it.width * 4;
    std::unique_ptr<ShmBuffer> output = channel_->TakeOutput(channel_, need);
    if (!output) return absl::ResourceExhaustedError("cannot allocate shared memory for the model's outputs");
    v1::StubRequest req;
    req.set_op("predict");
    req.set_image_buffer(images->id());
    req.set_output_buffer(output->id());
    const std::vector<std::string>& columns = channel_->options().columns;
    // Images with stored values a byte does not hold go as those values, in a buffer of their own.
    size_t raw_bytes = 0;
    for (const BatchImage& it : batch.items) raw_bytes += it.raw != nullptr ? it.raw->data.size() : 0;
    std::unique_ptr<ShmBuffer> raw;
    if (raw_bytes > 0) {
      raw = ShmBuffer::Create(channel_, raw_bytes);
      if (!raw) return absl::ResourceExhaustedError("cannot allocate shared memory for the images' stored values");
      req.set_raw_buffer(raw->id());
    }
    size_t off = 0, raw_off = 0;
    for (const BatchImage& it : batch.items) {
      v1::StubItem* item = req.add_items();
      item->set_image_offset(static_cast<int64_t>(it.image_offset));
      item->set_output_offset(static_cast<int64_t>(off));
      item->set_height(it.height);
      item->set_width(it.width);
      off += static_cast<size_t>(it.height) * it.width * 4;
      if (it.row != nullptr) {
        const v1::ManifestRow& row = *it.row;
        item->set_index(row.index());
        auto& m = *item->mutable_row();
        // Other columns first: the fixed keys win where a column shares their name.
        for (int c = 0; c < row.columns_size() && c < static_cast<int>(columns.size()); ++c) m[columns[c]] = row.columns(c);
        m["id"] = row.id();
        m["image"] = DisplayPath(row.image_path());
        m["mask"] = DisplayPath(row.mask_path());
      }
      if (it.raw != nullptr) {
        std::memcpy(raw->data() + raw_off, it.raw->data.data(), it.raw->data.size());
        item->set_raw_offset(static_cast<int64_t>(raw_off));
        item->set_dtype(it.raw->dtype);
        item->set_channels(it.raw->channels);
        raw_off += it.raw->data.size();
        for (const auto& [k, v] : it.raw->header) (*item->mutable_row())[k] = v;
      }
    }
    std::shared_ptr<Reply> reply = channel_->Send(req);
    return std::unique_ptr<PendingBatch>(new PythonPendingBatch(channel_, std::move(req), batch, std::move(output),
                                                                std::move(reply), std::move(raw)));
  }

  // One volume through the stub's predict_volume: the voxels in a shared buffer, the labels back in
  // another (uint16, z, y, x).
  absl::StatusOr<VolumePrediction> PredictVolume(const VolumeRequest& r) override {
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return absl::FailedPreconditionError(s.message());
    static const std::map<std::string, size_t> kSizes = {{"uint8", 1}, {"int8", 1}, {"int16", 2}, {"uint16", 2},
                                                         {"int32", 4}, {"uint32", 4}, {"int64", 8}, {"uint64", 8},
                                                         {"float32", 4}, {"float64", 8}};
    auto size = kSizes.find(r.dtype);
    if (size == kSizes.end()) return absl::InvalidArgumentError(absl::StrCat("unknown voxel type '", r.dtype, "'"));
    const size_t voxels = static_cast<size_t>(r.depth * r.height * r.width);
    const size_t in_bytes = static_cast<size_t>(r.channels) * voxels * size->second;
    std::unique_ptr<ShmBuffer> input = ShmBuffer::Create(channel_, in_bytes);
    std::unique_ptr<ShmBuffer> output = ShmBuffer::Create(channel_, voxels * 2);
    if (!input || !output) return absl::ResourceExhaustedError("cannot allocate shared memory for a volume");
    std::memcpy(input->data(), r.data, in_bytes);
    v1::StubRequest req;
    req.set_op("predict_volume");
    req.set_image_buffer(input->id());
    req.set_output_buffer(output->id());
    v1::StubItem* item = req.add_items();
    item->set_channels(r.channels);
    item->set_depth(static_cast<int32_t>(r.depth));
    item->set_height(static_cast<int32_t>(r.height));
    item->set_width(static_cast<int32_t>(r.width));
    item->set_dtype(r.dtype);
    item->set_index(r.index);
    for (double v : r.spacing) item->add_spacing(v);
    for (const auto& row : r.affine) {
      for (double v : row) item->add_affine(v);
    }
    for (const auto& [k, v] : r.row) (*item->mutable_row())[k] = v;
    std::shared_ptr<Reply> reply = channel_->Send(req);
    reply->done.WaitForNotification();
    if (!reply->died.empty()) return absl::AbortedError(absl::StrCat("model process died (", reply->died, ")"));
    const v1::StubResponse& resp = reply->response;
    channel_->NoteGpus(resp);
    if (!resp.error().empty()) {
      return resp.oom() ? absl::ResourceExhaustedError(resp.error()) : absl::AbortedError(resp.error());
    }
    if (resp.outputs_size() != 1) return absl::InternalError("the model process answered no output for the volume");
    const v1::StubOutput& o = resp.outputs(0);
    if (!o.error().empty()) return absl::FailedPreconditionError(o.error());
    VolumePrediction p;
    p.labels.resize(voxels);
    std::memcpy(p.labels.data(), output->data(), voxels * 2);
    p.nonfinite = o.nonfinite();
    p.classes = o.kind() == "argmax" ? o.channels()
                : channel_->model_classes() > 0 ? channel_->model_classes()
                                                : channel_->options().num_classes;
    return p;
  }

  void ReleaseCachedMemory() override {
    v1::StubRequest req;
    req.set_op("empty_cache");
    channel_->SendNoReply(req);
  }

  void ResetPeakMemory() override {
    v1::StubRequest req;
    req.set_op("reset_peak");
    channel_->SendNoReply(req);
  }

  absl::StatusOr<int> FindMaxBatch(int, int, double, int, int fallback) override { return fallback; }

  void SetCompileResolver(CompileResolver resolver) override {
    if (channel_->options().compile) channel_->SetCompileResolver(std::move(resolver));
  }

  RunnerStats Stats() override {
    RunnerStats s;
    const std::vector<std::string>& devices = channel_->options().devices;
    s.device = devices.empty() ? "cpu" : absl::StrJoin(devices, ",");
    s.load_seconds = load_seconds_;
    s.gpus = channel_->gpus();
    for (const GpuUsage& g : s.gpus) {
      if (s.gpu_name.empty()) s.gpu_name = g.name;
      s.peak_memory_bytes = std::max(s.peak_memory_bytes, g.peak_memory_bytes);
    }
    return s;
  }

  bool is_cuda() const override {
    const std::vector<std::string>& devices = channel_->options().devices;
    return !devices.empty() && devices[0].rfind("cuda", 0) == 0;
  }

 private:
  std::shared_ptr<Channel> channel_;
  double load_seconds_;
};

}  // namespace
}  // namespace python_internal

using python_internal::Channel;
using python_internal::PythonRunner;

absl::StatusOr<std::unique_ptr<ModelRunner>> CreatePythonRunner(const ModelRunnerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  struct stat st;
  if (stat(options.model_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", options.model_path, "' does not exist"));
  }
  auto channel = std::make_shared<Channel>(options);
  if (absl::Status s = channel->EnsureRunning(); !s.ok()) return s;
  const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log("Python model ", options.model_path, ":", options.class_name, " loaded in ", load, " s on ",
      absl::StrJoin(options.devices, ","));
  return std::unique_ptr<ModelRunner>(new PythonRunner(std::move(channel), load));
}

}  // namespace tally
