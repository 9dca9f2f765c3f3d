// ModelRunner: a TorchScript segmentation model on one device, and everything that touches tensors:
// host staging memory (pinned on CUDA), upload, preprocessing, forward, resize of the logits to the
// mask size, argmax and per-image confusion counts. This header has no torch types, so only
// model_runner.cc pays for LibTorch's headers.
//
// On CUDA, Launch() only enqueues work: the upload runs on a copy stream, the rest on a compute
// stream that waits for it, and the small results come back to pinned host memory; Wait() blocks
// on an event. On CPU, Launch() computes and Wait() returns at once.
//
// Thread-compatible: one thread launches; PendingBatch::Wait() may run on another thread.
#ifndef TALLY_WORKER_INTERFACES_MODEL_RUNNER_H_
#define TALLY_WORKER_INTERFACES_MODEL_RUNNER_H_

#include <cstddef>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/coco/coco_masks.h"
#include "metrics/surface_distance.h"

namespace tally {


namespace v1 {
class CompileTrial;
class ManifestRow;
}  // namespace v1

// --compile (Python models): given this worker's trial (compiled faster or not, and what it
// measured), the job's choice, which the first worker's trial makes for every worker: true to run
// compiled.
using CompileResolver = std::function<absl::StatusOr<bool>(bool faster, const v1::CompileTrial& trial)>;

struct ModelRunnerOptions {
  std::string model_path;
  std::string device = "cpu";     // cpu | cuda | cuda:N
  std::string precision = "fp32"; // fp32 | bf16 | fp16 (autocast)
  bool channels_last = false;
  std::vector<float> mean;        // 0 or 3 values, on [0, 1] inputs.
  std::vector<float> std;
  int input_height = 0;           // > 0: bilinear resize of the inputs to this size.
  int input_width = 0;
  int cpu_threads = 0;            // Intra-op threads on CPU; 0 = LibTorch's default.
  bool count_logit_ties = false;  // Count pixels whose two largest logits are equal (costs a topk).
  bool cudnn_benchmark = false;  // cuDNN picks algorithms by timing them (per process: not exact).
  bool jit_optimize = false;     // TorchScript's graph executor optimisations (WorkerOptions).
  // CUDA: while the model is read, a generic warm-up on the device takes the first pass's
  // shape-independent start-up (cuDNN's libraries, kernel loading): ~0.3-0.8 s off the first batch.
  bool warm_up_device = true;
  // TrialLayout's results on disk (WorkerOptions::cache_dir): the folder, and what identifies this
  // runner's options there (the model's network, TorchScriptArchitecture, the batch shape, GPU and
  // versions are added; the weights are not part of it).
  std::string trial_cache_dir;
  std::string trial_cache_key;
  double memory_limit_gib = 0;    // CUDA: cap this process's device memory (0 = no cap).
  // Single-score outputs: counts of the foreground class at each probability threshold (sorted,
  // in (0, 1)); a model with another output shape fails with FAILED_PRECONDITION.
  std::vector<double> thresholds;
  // --metrics calibration (metrics/calibration.h): per image the coarse bins of every probability
  // histogram (PendingBatch::calibration), per batch the fine histogram (calibration_fine).
  bool calibration = false;
  // ...with the probabilities of a single-score output at the prediction store's precision (each
  // QuantizeScore'd: v / 65535), so that rows the store answers count as the model's do.
  bool calibration_quantized = false;
  // Python backend (worker/python/python_runner.h).
  std::vector<std::string> devices;  // What the model is given: {"cpu"} or {"cuda:0", ...}.
  std::string python;                // Interpreter; empty = python3.
  std::string class_name = "Model";
  std::vector<std::pair<std::string, std::string>> model_options;
  bool compile = false;               // torch.compile the model's modules (JobSpec.compile).
  // Inductor's cache (TORCHINDUCTOR_CACHE_DIR), with --compile or without; empty: its default.
  std::string compile_cache_dir;
  // Where the stub keeps bytecode of packages installed without it (python/tally/bytecode.py,
  // TALLY_BYTECODE_DIR); empty: not kept.
  std::string bytecode_cache_dir;
  // Where each stub keeps the list of installed modules it imported, per interpreter, for the
  // spare one (python/tally/spare.py, TALLY_PRELOAD_DIR); empty: none kept.
  std::string preload_dir;
  // Once the model is loaded, start the next job's model process ahead
  // (worker/python/stub_process.h); and take such a process for this one where it was started with
  // the same interpreter and environment.
  bool spare_interpreter = false;
  std::vector<std::string> columns;  // Names of ManifestRow.columns.
  int num_classes = 0;               // --num-classes: the class count of label-map outputs.
  // Volume jobs, TorchScript (PredictVolume): patches of this size (z, y, x) blended with a Gaussian
  // as MONAI's sliding_window_inference; all 0: the whole volume in one pass.
  std::array<int, 3> sliding_window{};
  double overlap = 0.5;
  int sw_batch_size = 4;             // Patches per forward pass.
};

// One volume for a model (volume jobs, worker/scoring/volume_model.h): C x D x H x W voxels (z, y, x per
// channel, row-major), float32 after the job's intensity preprocessing, or with `dtype` other than
// "float32" the stored voxels as they are (--keep-dtype, Python models only).
struct VolumeRequest {
  const void* data = nullptr;
  std::string dtype = "float32";     // numpy's names: uint8, int16, ..., float32, float64.
  int channels = 1;
  int64_t depth = 0, height = 0, width = 0;
  std::array<double, 3> spacing{};   // z, y, x.
  std::array<std::array<double, 4>, 4> affine{};  // Voxel (i=x, j=y, k=z, 1) -> world, as nibabel's.
  int64_t index = 0;
  std::vector<std::pair<std::string, std::string>> row;  // id, image, mask and the other columns.
  // The XXH128 of the channel files' bytes as read (one file: its own; several: of their digests in
  // order), what the prediction store keys the volume's input by; empty where unknown.
  std::string input_digest;
};

// The model's answer: D x H x W labels (z, y, x), `classes` its class count (the score channels, or
// the declared count of a label output; 0: unknown), `nonfinite` NaN/Inf scores.
struct VolumePrediction {
  std::vector<uint16_t> labels;
  int classes = 0;
  int64_t nonfinite = 0;
  bool from_store = false;  // Taken from the prediction store: the model did not run on it.
};

// Host memory from the runner: page-locked on CUDA, so uploads are asynchronous.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
};

struct RawImage;  // common/formats/image_formats.h

struct BatchImage {
  size_t image_offset = 0;  // Byte offset of H x W x 3 uint8 RGB in the image buffer.
  size_t mask_offset = 0;   // Element offset of H x W uint16 labels in the mask buffer.
  int height = 0;
  int width = 0;
  const v1::ManifestRow* row = nullptr;  // The manifest row (Python models read its columns).
  // Python models: the image's stored values where a byte does not hold them (16-bit TIFF, DICOM),
  // valid until the batch is finished; null otherwise.
  const RawImage* raw = nullptr;
  // The XXH128 of the image file's bytes as decoded (v1::InputDigests.image); null where unknown.
  const std::string* image_digest = nullptr;
  // The row's prediction, found before its image was decoded (ModelRunner::FindHeld): its pixels in
  // the image buffer were never filled, and the runner scores it from this. Null otherwise.
  const struct HeldPrediction* held = nullptr;
};

// A prediction a runner holds for a row before its image is decoded (the prediction store's entry).
struct HeldPrediction {
  virtual ~HeldPrediction() = default;
  int height = 0;
  int width = 0;
};

// Surface metrics (hd, hd95, assd, nsd of every class) computed where the labels are, when the runner
// can (ModelRunner::ScoresSurfaceOnDevice): the values of metrics/surface_distance.h's
// ClassSurfaceMetrics to the bit, with the reference's ignored pixels outside every mask.
struct SurfaceRequest {
  bool enabled = false;
  SurfaceOptions options;
};

struct BatchSpec {
  HostBuffer* images = nullptr;
  HostBuffer* masks = nullptr;  // uint16 elements.
  std::vector<BatchImage> items;
  bool want_labels = false;     // Return the predicted label map of each image.
  // Keep them where they were computed instead (on the device): PendingBatch::CopyLabels fetches
  // one image's when asked (report thumbnails need a few per batch, not a copy of every one).
  bool keep_labels = false;
  // Surface metrics on the device. Where the runner cannot for this batch (too many classes, too
  // large an image), PendingBatch::surface is null and the labels come to the host as with
  // want_labels, so the caller computes them itself.
  SurfaceRequest surface;
  // JPEG images of this batch were decoded on the GPU (nvJPEG): their pixels differ from libjpeg's.
  bool decoded_on_gpu = false;
  // Single-score outputs: return each pixel's probability, quantised (PendingBatch::scores), for
  // the prediction store. Runners that cannot ignore it.
  bool want_scores = false;
  // RunnerOptions::calibration: only the first this many items count in the batch's fine histogram
  // (a store's batch padded with copies of its last row; -1: all).
  int calibration_items = -1;
};

class PendingBatch {
 public:
  virtual ~PendingBatch() = default;
  // Blocks until the results are in host memory.
  virtual absl::Status Wait() = 0;
  // K = number of classes (2 for a single-logit model). After Wait().
  virtual int num_classes() const = 0;
  // K x K counts of image i: row = reference class, column = predicted class; ignore pixels
  // (label -1 as int16: PrepareMask's kIgnoredPixel) and labels >= K are left out.
  virtual const int64_t* confusion(int i) const = 0;
  // Predicted labels of image i (H x W) when want_labels was set; else null or the labels.
  virtual const uint16_t* labels(int i) const = 0;
  // Copies the `pixels` predicted labels of image i into `out`, from the host or, with keep_labels,
  // from the device (synchronously; after Wait()). False when there are none.
  virtual bool CopyLabels(int i, size_t pixels, std::vector<uint16_t>* out) const {
    const uint16_t* l = labels(i);
    if (l == nullptr) return false;
    out->assign(l, l + pixels);
    return true;
  }
  // NaN and infinite values in the model's output for image i: the float32 logits at the mask's
  // size (after the bilinear resize, when the model's output size differs), every channel.
  virtual int64_t nonfinite(int i) const = 0;
  virtual int64_t logit_ties() const = 0;
  // Non-empty: image i's output broke the model contract (shape, dtype, a label >= K); its row
  // fails with this message and the rest of the batch stands.
  virtual std::string error(int /*i*/) const { return std::string(); }
  // With BatchSpec::surface: K x 4 values (hd, hd95, assd, nsd per class) of image i; null when the
  // runner did not compute them (then labels(i) holds the predicted labels).
  virtual const double* surface(int /*i*/) const { return nullptr; }
  // With BatchSpec::want_scores and a single-score output: image i's probabilities (H x W), each
  // QuantizeScore'd (common/store/prediction_store.h); null otherwise.
  virtual const uint16_t* scores(int /*i*/) const { return nullptr; }
  // With thresholds: tp, fp, fn, tn of the foreground class at each threshold for image i.
  virtual const int64_t* threshold_counts(int /*i*/) const { return nullptr; }
  // With RunnerOptions::calibration: image i's CalibrationRowSize(K) values, and the batch's
  // CalibrationFineSize(K) fine histogram (every image of the batch); null otherwise.
  virtual const int64_t* calibration(int /*i*/) const { return nullptr; }
  virtual const int64_t* calibration_fine() const { return nullptr; }
  // Instance outputs (a Python model's detection dict, docs/instances.md "Instances"): image i's detections,
  // decoded; null for other outputs. labels(i) is then their semantic label map
  // (common/coco/coco_masks.h PaintCocoLabels).
  virtual const std::vector<CocoInstance>* instances(int /*i*/) const { return nullptr; }
  // Image i was scored from the prediction store: the model did not run on it.
  virtual bool from_store(int /*i*/) const { return false; }
};

struct GpuUsage {
  std::string device;
  std::string name;
  int64_t peak_memory_bytes = 0;   // The most this process's allocator reserved on it.
  int64_t memory_used_bytes = 0;   // The whole device's, when the stats were taken (0: unknown).
  int64_t memory_total_bytes = 0;
};

struct RunnerStats {
  std::string device;
  std::string gpu_name;
  int64_t peak_memory_bytes = 0;
  double load_seconds = 0;
  std::vector<GpuUsage> gpus;  // Every GPU the model uses.
};

// Whether the TorchScript file at `path`, loaded to the CPU, moves to a GPU whole with Module::to():
// what a CUDA worker does when it loads a model (the CPU part overlaps CUDA's initialisation), reading
// the file again onto the GPU when not. `stays` names the first tensor that would stay behind. For
// tests and diagnostics; INVALID_ARGUMENT when the file is not TorchScript.
absl::StatusOr<bool> TorchScriptMovesWithTo(const std::string& path, std::string* stays);

// What --channels-last auto's kept trials (ModelRunnerOptions::trial_cache_dir) are keyed by, of
// the TorchScript file at `path`: the SHA-256 (hex) of its network, i.e. the code of its methods and
// the names, shapes and dtypes of its parameters and buffers, not their values, so a retrained
// checkpoint of a network takes the trial kept for another. For tests and diagnostics;
// INVALID_ARGUMENT when the file is not TorchScript.
absl::StatusOr<std::string> TorchScriptArchitecture(const std::string& path);

class ModelRunner {
 public:
  // Loads the model. Errors name the model file: NOT_FOUND when missing, INVALID_ARGUMENT when it
  // is not TorchScript, UNIMPLEMENTED when the device is not supported by this build, UNAVAILABLE
  // when the device is not there or cannot be initialised. NOT_FOUND, UNIMPLEMENTED and UNAVAILABLE
  // are problems of this worker's host, not of the model.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelRunnerOptions& options);
  // Checks that `device` (cpu, cuda, cuda:N) exists and works here; UNAVAILABLE or UNIMPLEMENTED
  // (as Create) when it does not.
  static absl::Status CheckDevice(const std::string& device);
  virtual ~ModelRunner() = default;

  virtual std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) = 0;
  // Errors: RESOURCE_EXHAUSTED on device out-of-memory (the caller may retry smaller); ABORTED when
  // the model's forward pass raised (an input it cannot handle: the caller may retry the images one
  // by one); FAILED_PRECONDITION when the model broke its output contract (wrong rank, batch size
  // or class count): the message names the model and the shapes.
  virtual absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) = 0;
  // Frees cached device memory (after an out-of-memory error).
  virtual void ReleaseCachedMemory() = 0;
  // Frees cached device memory and restarts the peak that Stats() reports (GpuUsage's
  // peak_memory_bytes), so the next passes' own peak can be read (tally estimate).
  virtual void ResetPeakMemory() {}
  // Largest batch (a power of two up to `limit`) whose forward pass at height x width fits in
  // `max_memory` (a fraction of the device memory if <= 1, else GiB), found by trial passes.
  // CPU: returns `fallback`.
  virtual absl::StatusOr<int> FindMaxBatch(int height, int width, double max_memory, int limit, int fallback) = 0;
  virtual RunnerStats Stats() = 0;
  virtual bool is_cuda() const = 0;
  // The prediction this runner holds already for a row whose image file's bytes have this XXH128
  // (the prediction store's entry), asked once the bytes are read and before they are decoded; a
  // row that has one is staged with pixels left unfilled, and Launch scores it from it. Null: the
  // row is decoded and run as any other.
  virtual std::shared_ptr<const HeldPrediction> FindHeld(const v1::ManifestRow& /*row*/,
                                                         const std::string& /*image_digest*/) {
    return nullptr;
  }
  // The most host memory the model's tensors held at once while running `batch` (launched and waited
  // for; its results dropped), for the worker's memory budget (worker/pipeline/memory_budget.h); -1 where the
  // runner cannot say or its tensors are not in this process's host memory (GPU, Python models).
  virtual int64_t MeasureHostBytes(const BatchSpec& batch) { return -1; }
  // Volume jobs: one volume's labels. Errors as Launch's (RESOURCE_EXHAUSTED: out of device memory;
  // ABORTED: the model raised; FAILED_PRECONDITION: its output broke the contract, the message
  // naming the shapes); UNIMPLEMENTED for runners without volumes.
  virtual absl::StatusOr<VolumePrediction> PredictVolume(const VolumeRequest& /*request*/) {
    return absl::UnimplementedError("this model backend does not run volumes");
  }
  // Whether BatchSpec::surface can be honoured here (CUDA builds with Tally's kernels).
  virtual bool ScoresSurfaceOnDevice() const { return false; }
  // --channels-last auto: times the forward pass of `batch` in both memory layouts (warm-up passes
  // first in each) and returns "on" or "off", what it measured in `trial`. The answer is kept per
  // batch shape: asked again (a later job on a cached runner), it answers without timing. Runners
  // with no layout to choose (CPU, Python models) return "" and leave it.
  virtual std::string TrialLayout(const BatchSpec& /*batch*/, std::string* /*trial*/) { return ""; }
  // Runs the model channels-last (parameters and inputs) or not from the next Launch on.
  virtual void SetChannelsLast(bool /*on*/) {}
  // --compile: how the job's choice between the compiled and the eager model is agreed (set per job,
  // before its first Launch). A runner whose model already ran a trial (an earlier job's) proposes
  // that trial at once and adopts the answer. Runners that do not compile ignore it.
  virtual void SetCompileResolver(CompileResolver /*resolver*/) {}
  virtual bool ChannelsLast() const { return false; }

  // --channels-last auto beside the evaluation (worker/pipeline/pipeline.h): the caller goes on launching in
  // the current layout while a copy of the weights in the other layout warms up on a thread of its
  // own (cuDNN's channels-last first pass compiles kernels for seconds), then both are timed with
  // the device to themselves.
  //   PrepareLayoutTrial(batch): copies `batch` for the trial. False when the runner has no layout
  //     to choose or already knows the answer for the batch's shape (TrialLayout answers at once).
  //   SkipLayoutTrial(rows, first_batch_seconds): whether the prepared trial can repay itself over
  //     `rows` rows (0: unknown, it runs): "" when it can, else why not, and the trial is dropped
  //     (the current layout stays). Times the batch in the current layout; `first_batch_seconds`,
  //     the first batch's start-up (negative: not run yet, this call's first pass is it), stands
  //     for the other layout's.
  //   StartLayoutTrial(on_ready): starts the other layout's warm-up; `on_ready` is called from its
  //     thread when FinishLayoutTrial will not wait. False when device memory cannot hold a second
  //     copy of the weights and a second batch beside the evaluation's: FinishLayoutTrial then runs
  //     the whole trial on the caller's thread, as TrialLayout does.
  //   FinishLayoutTrial(trial): times both layouts (nothing else may run on the device meanwhile)
  //     and answers as TrialLayout does, keeping the answer as it does. The copy stays until
  //     SetChannelsLast, which adopts it (with the thread its cuDNN plans were built on: PyTorch
  //     keeps them per thread) when it switches to its layout, or CancelLayoutTrial.
  //   CancelLayoutTrial(): drops a trial, after the pass in progress.
  // One caller at a time (the pipeline's batcher), and CancelLayoutTrial once nothing else calls.
  virtual bool PrepareLayoutTrial(const BatchSpec& /*batch*/) { return false; }
  virtual std::string SkipLayoutTrial(int64_t /*rows*/, double /*first_batch_seconds*/) { return ""; }
  virtual bool StartLayoutTrial(std::function<void()> /*on_ready*/) { return false; }
  virtual std::string FinishLayoutTrial(std::string* /*trial*/) { return ""; }
  virtual void CancelLayoutTrial() {}
};

}  // namespace tally

#endif  // TALLY_WORKER_INTERFACES_MODEL_RUNNER_H_
