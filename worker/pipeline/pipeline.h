// The worker's data path for one job: decode threads -> batcher -> ModelRunner (device) ->
// completion thread -> per-image results, with every stage overlapping the others.
//
//   Submit(shard rows) ─> decode pool (T threads: read + decode PNG/JPEG, check sizes)
//        ─> batcher thread: batches of images aligned to global index multiples of the batch
//           size, same-size images only (or any size with an input size), copied into one of a
//           few reusable staging buffers (pinned on CUDA), launched without waiting
//        ─> completion thread: waits for each batch in order, turns confusion counts into
//           results, hands surface-metric work to the CPU pool, delivers results.
//
// Batches depend only on the manifest indices and the batch size, never on which shards a worker
// got, so results are bit-identical across worker counts and shard sizes (docs/how-it-works.md "Exact results").
// On device out-of-memory, and when the model raises on a batch, the batch is split in halves and
// retried down to single images, so only the guilty rows fail (with the model's message). A
// watchdog reports a decode or forward pass that runs past the batch timeout.
//
// Thread-safe. Callbacks run on pipeline threads and must not block for long.
#ifndef TALLY_WORKER_PIPELINE_PIPELINE_H_
#define TALLY_WORKER_PIPELINE_PIPELINE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/coco/coco_instances.h"
#include "common/formats/decode.h"
#include "metrics/overlap.h"
#include "common/job/job_config.h"
#include "metrics/lesion.h"
#include "metrics/surface_distance.h"
#include "common/formats/thumbnail.h"
#include "proto/tally.pb.h"
#include "worker/pipeline/gpu_jpeg.h"
#include "worker/pipeline/memory_budget.h"
#include "worker/interfaces/model_runner.h"
#include "worker/interfaces/row_evaluator.h"

namespace tally {

// Rows the decode threads may hold decoded (or decoding) ahead of the batcher: three batches, and
// at least two rows per thread. The worker's lease target counts on it (Worker::LeaseTargetRows).
inline int DecodeWindowRows(int batch_size, int decode_threads) {
  return std::max({3 * batch_size, 2 * decode_threads, 16});
}

struct PipelineOptions {
  int decode_threads = 2;
  int batch_size = 8;           // kBatchAuto: pick the largest that fits (ModelRunner::FindMaxBatch).
  int default_batch_size = 8;   // What kBatchAuto falls back to where it cannot measure (CPU).
  double max_memory = 0;        // For batch_size -1.
  int max_batch_size = 256;     // Upper bound for the automatic choice.
  int staging_slots = 3;        // Batches in flight on the device.
  int warmup_batches = 2;       // Extra forward passes on the first batch before the clock starts.
  // The runner has not run a batch yet (a fresh CUDA model): with no warm-up passes the first
  // batch's own pass takes the start-up, so the steady rate's clock starts when it completes.
  bool cold_runner = false;
  std::vector<Metric> metrics;
  SurfaceOptions surface;
  LesionOptions lesion;  // Lesion metrics: the job's settings (spacing from `surface`).
  bool any_input_size = false;  // Images of different sizes may share a batch (inputs are resized).
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // Larger declared images/masks fail their row.
  // TIFF pages and 16-bit/DICOM windows (common/formats/image_formats.h DecodeOptions): the job's --window and
  // the index of the manifest's 'page' column in each row's columns (-1: none).
  Window window;
  int page_column = -1;
  // Python models: 16-bit TIFF and DICOM images also decoded to their stored values (RawImage),
  // which the model gets instead of the 8-bit pixels (docs/data.md "What a model gets").
  bool raw_images = false;
  double batch_timeout_seconds = 600;  // A decode or forward pass running longer calls on_timeout.
  bool nonfinite_warn = false;  // Evaluate rows whose model output has NaN/Inf (else they fail).
  // Measure each row's properties while decoding it (ImageResult.properties: groups and slices).
  bool row_properties = false;
  std::vector<std::string> dicom_tags;  // With it: these attributes of DICOM images (RowProperties.tags).
  int ignore_index = 255;       // Reference pixels with this value leave every count; -1: none.
  std::vector<std::pair<int, int>> label_map;  // Applied to reference masks first (value -> label).
  bool calibration = false;     // Results carry the runner's calibration counts (metrics/calibration.h).
  size_t num_thresholds = 0;    // Results carry the runner's threshold counts (ModelRunnerOptions).
  // Report thumbnails (common/formats/thumbnail.h): the worst rows per class and shard that get one.
  int thumbnails = 0;
  EmptyScore empty_score = EmptyScore::kNaN;  // The Dice that orders them.
  bool all_foreground = false;                // Class 0 gets thumbnails too.
  // Non-empty: an existing folder (resolved) where every predicted label map is written as PNG.
  std::string save_predictions;
  // COCO jobs (docs/instances.md "Instances"): rows of the annotation file's images get their references (and
  // a Python model's detections their records) from here; referring rows their coco_ann_ids' union.
  std::shared_ptr<const CocoSource> coco;
  bool instance_job = false;  // Rows are the annotation file's images (thumbnails by instance F1).
  // --channels-last auto, not yet resolved for the job: the runner's trial is proposed here and the
  // answer (the job's choice, the first worker's) is what runs. An error fails the job here. Null:
  // the layout is already fixed. When the runner keeps no answer for the first batch's shape, the
  // trial runs beside the evaluation (ModelRunner::PrepareLayoutTrial): rows are evaluated in the
  // current layout meanwhile and their results held back until the job's layout is agreed; they
  // are delivered if it is the layout they ran in, else evaluated again (every row's result comes
  // from the job's layout, whichever rows a worker evaluated while its trial ran). Jobs that save
  // predictions run the trial before their first batch instead (nothing is written twice).
  std::function<absl::StatusOr<bool>(bool channels_last, const std::string& trial)> resolve_layout;
  // JPEG decoding (worker/pipeline/gpu_jpeg.h): on the GPU `decode_device` (a CUDA device index) when
  // decode_gpu; else libjpeg-turbo on the decode threads.
  bool decode_gpu = false;
  int decode_device = -1;
  // --decode auto, not yet resolved for the job: the images are decoded on the CPU until the first
  // batch has run, then the decode threads' measured rate is compared with the model's and the
  // proposal made here; the answer (the job's choice) is what runs from then on, and images already
  // decoded the other way are decoded again, so every row of the job comes from one decoder.
  std::function<absl::StatusOr<bool>(bool gpu, const std::string& trial)> resolve_decode;
  // The host memory this worker may use for the job's rows (worker/pipeline/memory_budget.h), bytes; 0: no
  // budget. A row that needs more fails before its pixels are decoded, naming the sizes, and batch
  // groups are split into launches that fit.
  int64_t memory_budget = 0;
  int64_t input_pixels = 0;  // --input-size's height x width (0: none): what the model sees of every row.
  // The job's rows left (ShardAssignment.expected_rows; 0: unknown): the layout trial runs only
  // where they can repay it (ModelRunner::SkipLayoutTrial), the same choice for any worker count.
  int64_t expected_rows = 0;
};

class Pipeline : public RowEvaluator {
 public:
  using ResultFn = std::function<void(const LeaseKey&, v1::ImageResult)>;
  // A problem with the model itself: the job cannot go on here. `definitive`: it will recur on any
  // worker (the model broke its output contract, or every image of its first batches failed).
  using FatalFn = std::function<void(const std::string& message, bool definitive)>;
  // A decode or forward pass of the rows `indices` of `lease` has run for `seconds`, past the batch
  // timeout; `what` says which. Called once, from the watchdog thread; the stuck thread cannot be
  // stopped, so the owner is expected to end the process.
  using TimeoutFn = std::function<void(const LeaseKey& lease, const std::vector<int64_t>& indices,
                                       const std::string& what, double seconds)>;

  // `runner` must outlive the pipeline.
  Pipeline(ModelRunner* runner, PipelineOptions options, ResultFn on_result, FatalFn on_fatal,
           TimeoutFn on_timeout = nullptr);
  ~Pipeline() override;  // Stops the threads; undelivered work is dropped.

  // Queues the rows of one leased shard. Never blocks on decoding.
  void Submit(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) override;
  // Stops work for a lease (revoked, job cancelled): its remaining rows produce no results.
  void Drop(int64_t lease_id) override;
  // Rows accepted and not yet delivered, held or dropped.
  int64_t Backlog() const override;
  bool HoldingResults() const override;
  int64_t HeldRows() const override;
  void ReleaseIdleBuffers() override;
  // Blocks until the backlog is empty or the pipeline failed.
  bool WaitIdle(absl::Duration limit) override;

  int batch_size() const override;
  v1::WorkerStats Stats() const override;
  int num_classes() const;

 private:
  struct Item {
    v1::ManifestRow row;
    std::unique_ptr<RgbImage> image;
    std::unique_ptr<LabelMap> mask;
    std::unique_ptr<RawImage> raw;  // PipelineOptions::raw_images, where the image has one.
    std::string error;
    bool decoded = false;
    bool jpeg = false;        // The image is a JPEG...
    bool gpu_pixels = false;  // ...decoded by nvJPEG.
    v1::InputDigests inputs;  // The digests of the files as read (set by the decoding thread).
    v1::RowProperties properties;  // PipelineOptions::row_properties (set by the decoding thread).
    std::shared_ptr<const HeldPrediction> held;  // The runner's prediction, found before decoding.
  };
  // Guarded by the pipeline's mu_ (its items' `decoded` too); an item's buffers belong to the
  // thread that took it (decoder, then batcher).
  struct Shard {
    LeaseKey lease;
    std::vector<Item> items;
    size_t next_decode = 0;  // Next item to hand to a decode thread.
    size_t next_batch = 0;   // Next item the batcher takes.
    bool dropped = false;
    std::shared_ptr<ShardThumbnails> thumbnails;  // Null when the job has none.
    absl::flat_hash_map<int64_t, size_t> position;  // Row index -> its item (fixed at creation).
  };
  struct Slot {
    std::unique_ptr<HostBuffer> images;
    std::unique_ptr<HostBuffer> masks;
  };
  struct InFlight;
  // What a pipeline thread is doing now, for the watchdog.
  struct Activity {
    double since = 0;
    std::string what;
    LeaseKey lease;
    std::vector<int64_t> indices;
  };
  class ActivityScope;

  // A shard of `rows` for `lease`, with its thumbnail selection when the job has thumbnails.
  std::shared_ptr<Shard> NewShard(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) const;
  std::shared_ptr<ShardThumbnails> NewShardThumbnails() const;

  // What the batcher does next, decided from the state alone; kWait is its wait condition.
  enum class BatcherStep {
    kWait,
    kStop,
    kDiscardShard,
    kNextShard,
    kChooseBatchSize,
    kTakeBlock,
    kStartLayoutTrial,  // The first batch is done: the trial beside the evaluation may start.
    kResolveLayout,     // The trial can be timed: the job's layout is agreed, held results settled.
  };
  // The trial beside the evaluation (PipelineOptions::resolve_layout).
  enum class LayoutTrial { kNone, kAfterFirstBatch, kRunning, kReady };
  BatcherStep NextBatcherStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BatcherCanActLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // End of the index-aligned block starting at the front shard's next item.
  size_t BlockEndLocked(const Shard& shard) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DiscardFrontShardLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChooseBatchSize() ABSL_LOCKS_EXCLUDED(mu_);
  // Reports the block's rows that failed to decode; groups the others by image size.
  std::vector<std::vector<Item*>> GroupBlock(const std::shared_ptr<Shard>& shard, size_t i0, size_t i1);
  // Takes a staging slot (waiting for one) and packs the group into it; null when stopping.
  std::shared_ptr<InFlight> StageGroup(const std::shared_ptr<Shard>& shard, const std::vector<Item*>& group)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns true when it switched JPEG decoding to the GPU (--decode auto): the batch is to be
  // decoded again (RedecodeStaged).
  bool WarmUp(const BatchSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the runner whether its prepared layout trial can repay itself over the rows this worker
  // expects (PipelineOptions::expected_rows). True, with `layout_skip_` saying why (the trial
  // dropped; the current layout is the one to agree), when it cannot.
  bool SkipLayoutTrial() ABSL_LOCKS_EXCLUDED(mu_);
  // The prepared trial's proposal for AgreeLayout, its text in `trial`: the current layout when
  // SkipLayoutTrial skipped it, else the runner's timing (FinishLayoutTrial).
  std::string LayoutTrialChoice(std::string* trial);
  // BatcherStep::kStartLayoutTrial: the trial beside the evaluation starts, or runs here when the
  // device has no room for it, or is skipped.
  void StartLayoutTrial() ABSL_LOCKS_EXCLUDED(mu_);
  // Proposes the runner's layout trial (`choice`, "" when it made none) and switches to the
  // job's answer; false when the pipeline failed.
  bool AgreeLayout(const std::string& choice, const std::string& trial) ABSL_LOCKS_EXCLUDED(mu_);
  // The trial beside the evaluation is ready: waits until every row evaluated meanwhile is held,
  // times the layouts, agrees the job's and delivers the held results or queues their rows again.
  void ResolveLayoutTrial() ABSL_LOCKS_EXCLUDED(mu_);
  bool ProvisionalSettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memory budget: on a CPU runner, the model's host bytes measured on probe passes at two sizes
  // (memory_model_), before the first batch; then decoding may ask (CheckMemory).
  void MeasureMemory() ABSL_LOCKS_EXCLUDED(mu_);
  // OK, or why the row whose image file is `bytes` cannot run within the budget (before decoding).
  absl::Status CheckMemory(const std::string& bytes, const std::string& path, int page = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // A batch group cut into launches that fit the budget (one group where there is none).
  std::vector<std::vector<Item*>> SplitByBudget(const std::vector<Item*>& group) ABSL_LOCKS_EXCLUDED(mu_);
  void LaunchBatch(std::shared_ptr<InFlight> batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Wait conditions, one per wait.
  bool DecodeWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TaskWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SlotOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompletionWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LaunchesAllowedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Stopped() const ABSL_LOCKS_EXCLUDED(mu_);

  void DecodeLoop(size_t slot);
  void WatchdogLoop();
  // A top-level batch (not a retry) has finished; `failed` rows of it failed in the model.
  void NoteEarlyBatch(size_t rows, size_t failed, const std::string& message);
  void BatchLoop();
  void CompletionLoop();
  // Waits for `batch` and delivers its results (or fails the pipeline), releasing its slot; false
  // when the model raised or ran out of memory on it: the batch, slot and error kept for a retry.
  bool Complete(const std::shared_ptr<InFlight>& batch) ABSL_LOCKS_EXCLUDED(mu_);
  void Decode(Item* item);
  // The mask half of Decode: loads and prepares the item's mask and checks it against `image`.
  // A held row's image, decoded again for its thumbnail; false when it cannot be (the file changed).
  bool HeldRowPixels(const BatchImage& it, std::vector<uint8_t>* rgb) const;
  void DecodeMask(Item* item, std::unique_ptr<RgbImage> image);
  // PipelineOptions::row_properties: the row's components per label and mean intensity.
  void MeasureRow(Item* item) const;
  // PipelineOptions::dicom_tags of a DICOM image's bytes into its properties.
  void ReadTags(Item* item, const std::string& bytes) const;
  // After nvJPEG's batch: each JPEG item's error, or its pixels marked decoded (and measured).
  void FinishGpuItems(const std::vector<GpuJpegImage>& jobs, const std::vector<Item*>& items) const;
  // The image's 8-bit pixels, and with PipelineOptions::raw_images its stored values where it has
  // them (item->raw).
  absl::Status DecodePixels(Item* item, const std::string& bytes, const DecodeOptions& decode, RgbImage* image);
  // A --window the row's image did not go through (an 8-bit format): its format, for the report.
  void NoteUnusedWindow(Item* item, const std::string& bytes, const RgbImage& image) const;
  // The row's TIFF page and the job's window (PipelineOptions::page_column, window).
  absl::StatusOr<DecodeOptions> RowOptions(const v1::ManifestRow& row) const;
  // Decodes `items` (consecutive rows of one shard) with nvJPEG (the `slot`'s decoder): JPEG images
  // in one call, PNG images and masks on this thread.
  void DecodeOnGpu(const std::vector<Item*>& items, size_t slot);
  // The decoder of decode thread `slot` (the batcher's is the last), created on first use; null
  // (the pipeline failed) when nvJPEG cannot start.
  GpuJpegDecoder* GpuDecoder(size_t slot);
  // After "auto" resolved to the GPU: decodes again with nvJPEG, straight into the staging
  // buffer, the JPEG images of `spec` that `redo` marks (decoded on the CPU before the answer).
  void RedecodeStaged(const BatchSpec& spec, const std::vector<bool>& redo);
  // --decode auto: times a forward pass of the first batch against the decode threads' rate, asks
  // the coordinator and switches decoders; true when the job decodes on the GPU from now on.
  bool ResolveDecode(const BatchSpec& spec);
  // Runs queued staging copies (copy_tasks_) until none is left; any thread, without mu_ held.
  void HelpStage();
  // Packs `items` into `slot` and fills `spec`.
  void Stage(const std::vector<Item*>& items, Slot* slot, BatchSpec* spec);
  // Launches and waits (for warm-up and retries). Splits on out-of-memory and when the model
  // raises, down to single images. Returns the rows that failed because the model raised.
  size_t RunNow(std::shared_ptr<InFlight> batch, size_t begin, size_t end, std::string* model_error);
  // Rows [begin, end) of a finished launch into results: each failed with a reason, or its counts
  // filled and, where the CPU still has work for it (surface distances, thumbnails, saving), queued
  // as a metric task; else delivered.
  void Finish(std::shared_ptr<InFlight> batch, PendingBatch* pending, size_t begin, size_t end);
  // The job's class count (the first batch sets it); notes the batch's logit ties and first time.
  int NoteBatchClasses(const InFlight& batch, PendingBatch* pending) ABSL_LOCKS_EXCLUDED(mu_);
  // Why item i (the launch's row j) fails, or "".
  std::string RowError(const InFlight& batch, PendingBatch* pending, size_t i, size_t j, int job_classes) const;
  // Per-class counts, threshold counts, mask statistics and the device's surface values.
  // COCO rows of the annotation file's images: the model's detections evaluated into `r`'s
  // records (worker/pipeline/pipeline_completion.cc). Errors fail the row.
  absl::Status EvaluateInstances(const InFlight& batch, size_t i, const std::vector<CocoInstance>* detections,
                                 v1::ImageResult* r) const;
  void FillCounts(const InFlight& batch, PendingBatch* pending, size_t i, size_t j, v1::ImageResult* r) const;
  void AttachCalibrationFine(const InFlight& batch, PendingBatch* pending, size_t begin, size_t end,
                             v1::ImageResult* r) const;
  // Per evaluated row, the classes whose thumbnail it gets.
  std::vector<std::vector<int>> ThumbnailClasses(const InFlight& batch,
                                                 const std::vector<std::pair<size_t, v1::ImageResult>>& ok);
  // Delivers an evaluated row, or queues its CPU work (RowTask) as a metric task.
  void FinishRow(const std::shared_ptr<InFlight>& batch, PendingBatch* pending, size_t i, size_t j,
                 std::vector<int> thumbs, v1::ImageResult r) ABSL_LOCKS_EXCLUDED(mu_);
  // A row's CPU work, on a pool thread: surface distances from `ref` (when given), thumbnails of
  // `classes`, the saved prediction (a failure to save fails the row).
  void RowTask(const InFlight& batch, const uint16_t* pred, const LabelMap* ref, const std::vector<uint16_t>& ref_copy,
               int k, int h, int w, const std::string& id, const std::vector<int>& classes,
               const std::vector<uint8_t>& rgb, v1::ImageResult* r);
  // Of `thumbs` (per row of `rows`, the classes its shard would render), those where the row is
  // also among this worker's worst of the job so far (every row is offered first). A shard's worst
  // rows are rendered so that any order of evaluation keeps the job's worst; most of them are not
  // among the job's, and this filter (the same argument over all of this worker's rows) skips
  // them: a few dozen renders for thousands of rows instead of `thumbnails` per shard and class.
  void AmongWorkersWorst(const std::vector<const v1::ImageResult*>& rows, std::vector<std::vector<int>>* thumbs);
  // Renders the thumbnails of `classes` of one row into `r` (a pool task).
  void AddThumbnails(Shard* shard, const uint8_t* rgb, const uint16_t* pred, const uint16_t* ref, int height, int width,
                     const std::vector<int>& classes, v1::ImageResult* r);
  // `provisional`: the row ran while the layout trial was beside the evaluation; its result is held.
  void Deliver(const std::shared_ptr<Shard>& shard, v1::ImageResult result, bool provisional = false);
  void Fail(const std::string& message, bool definitive);
  // Back to the batcher; its buffers are released when an outlier batch grew them past what the
  // batch staged last needs (OutlierBuffersLocked).
  void ReleaseSlot(Slot* slot);
  // Moves out of `slot` the buffers larger than max(4 x the last staged batch's bytes, 16 MiB), for
  // the caller to free outside the lock (freeing pinned memory synchronises the device).
  void OutlierBuffersLocked(Slot* slot, std::vector<std::unique_ptr<HostBuffer>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<RgbImage> TakeImage();
  std::unique_ptr<LabelMap> TakeMask();
  // Back to the pools; buffers grown by an outlier image are released first.
  void RecycleLocked(std::unique_ptr<RgbImage> image) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecycleLocked(std::unique_ptr<LabelMap> mask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ModelRunner* const runner_;
  PipelineOptions options_;
  const ResultFn on_result_;
  const FatalFn on_fatal_;
  const TimeoutFn on_timeout_;
  const bool surface_;  // Surface or lesion metrics: work on the label maps after the counts.
  const bool device_surface_;  // surface_, computed by the runner on the device (ScoresSurfaceOnDevice).
  const bool saving_;  // options_.save_predictions is set.
  const bool profile_enabled_;  // TALLY_PIPELINE_PROFILE is set (Profile below).
  const std::vector<uint16_t> label_lut_;  // From options_.label_map; empty = identity.

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  int decoded_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // Decoded or decoding items not yet taken by the batcher.
  int max_decoded_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t backlog_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  int batch_size_ ABSL_GUARDED_BY(mu_) = 0;  // Resolved (auto -> number) by the batcher.
  int num_classes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Slot*> free_slots_ ABSL_GUARDED_BY(mu_);
  // What the batch staged last needed (Stage): the measure of an outlier slot buffer.
  size_t last_image_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t last_mask_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<std::shared_ptr<InFlight>> in_flight_ ABSL_GUARDED_BY(mu_);
  // The completion thread is finishing the batches in flight before retrying a failed one: the
  // batcher launches nothing meanwhile.
  bool launches_paused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<RgbImage>> image_pool_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<LabelMap>> mask_pool_ ABSL_GUARDED_BY(mu_);
  // Short tasks run by the decode threads before any decoding: staging copies (at the front) and
  // surface metrics.
  std::deque<std::function<void()>> metric_tasks_ ABSL_GUARDED_BY(mu_);
  // The copies of decoded rows into a staging buffer: the batcher waits on them, so they go
  // before any other work, and threads in the middle of a long piece of work (a GPU decode
  // group, the batcher itself) run them between rows (HelpStage).
  std::deque<std::function<void()>> copy_tasks_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> copy_tasks_queued_{0};  // copy_tasks_.size(), read without the lock.
  std::map<int64_t, Activity> activities_ ABSL_GUARDED_BY(mu_);  // Forward passes in progress.
  int64_t next_activity_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Activity> decoding_ ABSL_GUARDED_BY(mu_);  // Per decode thread; `since` 0 when idle.
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  int early_batches_ ABSL_GUARDED_BY(mu_) = 0;  // Top-level batches finished (counted up to 2).
  int early_batches_all_failed_ ABSL_GUARDED_BY(mu_) = 0;

  // The layout trial beside the evaluation: batches launched while `layout_provisional_` are
  // provisional; their rows count in `provisional_rows_` until their results are held in `held_`.
  LayoutTrial layout_trial_ ABSL_GUARDED_BY(mu_) = LayoutTrial::kNone;
  bool layout_provisional_ ABSL_GUARDED_BY(mu_) = false;
  int64_t provisional_rows_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::shared_ptr<Shard>, v1::ImageResult>> held_ ABSL_GUARDED_BY(mu_);
  // From the warm-up's start to the first batch's completion: the start-up a layout pays once.
  double warmup_start_unix_ ABSL_GUARDED_BY(mu_) = 0;
  double first_batch_seconds_ ABSL_GUARDED_BY(mu_) = -1;
  std::string layout_skip_;  // The batcher's: why the trial was skipped (ModelRunner::SkipLayoutTrial).

  // Statistics.
  int64_t images_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t images_after_warmup_ ABSL_GUARDED_BY(mu_) = 0;
  double clock_start_ ABSL_GUARDED_BY(mu_) = 0;
  bool clock_after_first_batch_ ABSL_GUARDED_BY(mu_) = false;  // clock_start_ set by the first completion.
  double last_result_ ABSL_GUARDED_BY(mu_) = 0;
  double first_batch_unix_ ABSL_GUARDED_BY(mu_) = 0;
  int oom_retries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t logit_ties_ ABSL_GUARDED_BY(mu_) = 0;

  // TALLY_PIPELINE_PROFILE=1: where the batcher and the completion thread spend their time,
  // logged when the pipeline ends (microseconds, summed over batches).
  struct Profile {
    std::atomic<int64_t> batches{0}, slot_wait{0}, stage{0}, launch{0}, wait{0}, finish{0};
    // Decode threads: rows decoded; time decoding, running tasks (staging copies, CPU metrics,
    // thumbnails) and waiting for work; --decode gpu's phases (files and headers, queueing to
    // nvJPEG, PNG images and masks, waiting for the GPU and copying its pixels out).
    std::atomic<int64_t> rows{0}, decoding{0}, tasks{0}, idle{0}, gpu_read{0}, gpu_start{0}, gpu_cpu{0},
        gpu_finish{0};
    std::atomic<int64_t> thumbnails{0};  // Rendered.
  };
  Profile profile_;

  absl::Mutex worst_mu_;
  RunningWorst workers_worst_ ABSL_GUARDED_BY(worst_mu_);  // AmongWorkersWorst's, per job.

  // What rows cost against options_.memory_budget; ready once MeasureMemory has run.
  MemoryModel memory_model_ ABSL_GUARDED_BY(mu_);
  bool memory_model_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> split_logged_{false};

  // JPEG decoding: on the GPU now (options_.decode_gpu, or "auto" resolved to it).
  bool gpu_decode_ ABSL_GUARDED_BY(mu_) = false;
  // --decode auto's trial: CPU decode time of rows with JPEG images so far.
  double cpu_jpeg_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cpu_jpeg_rows_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex gpu_decoders_mu_;
  std::vector<std::unique_ptr<GpuJpegDecoder>> gpu_decoders_ ABSL_GUARDED_BY(gpu_decoders_mu_);

  std::vector<std::thread> threads_;
};

}  // namespace tally

#endif  // TALLY_WORKER_PIPELINE_PIPELINE_H_
