// The pipeline (worker/pipeline/pipeline.h): construction and shutdown, shards in and out, the watchdog,
// delivery of results and stats. Its stages live beside it: pipeline_decode.cc (decode threads),
// pipeline_stage.cc (staging buffers), pipeline_batcher.cc (batches, warm-up, the layout and decode
// trials), pipeline_completion.cc (results, metrics, thumbnails).
#include "worker/pipeline/pipeline.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <thread>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "common/job/job_config.h"
#include "base/log.h"
#include "worker/pipeline/pipeline_internal.h"

namespace tally {

Pipeline::Pipeline(ModelRunner* runner, PipelineOptions options, ResultFn on_result, FatalFn on_fatal,
                   TimeoutFn on_timeout)
    : runner_(runner),
      options_(std::move(options)),
      on_result_(std::move(on_result)),
      on_fatal_(std::move(on_fatal)),
      on_timeout_(std::move(on_timeout)),
      surface_(AnySurfaceMetric(options_.metrics) || AnyLesionMetric(options_.metrics)),
      // TALLY_CPU_SURFACE=1: the CPU path on a GPU worker too (benchmarks and tests compare them).
      // Lesion metrics need both label maps on the host: the CPU path.
      device_surface_(surface_ && !AnyLesionMetric(options_.metrics) && runner_->ScoresSurfaceOnDevice() &&
                      std::getenv("TALLY_CPU_SURFACE") == nullptr),
      saving_(!options_.save_predictions.empty()),
      profile_enabled_(std::getenv("TALLY_PIPELINE_PROFILE") != nullptr),
      label_lut_(MakeLabelLut(options_.label_map)),
      workers_worst_(options_.thumbnails) {
  absl::MutexLock lock(&mu_);  // No other thread yet; the analysis wants the guard all the same.
  gpu_decode_ = options_.decode_gpu;
  memory_model_ready_ = options_.memory_budget <= 0;
  batch_size_ = options_.batch_size > 0 ? options_.batch_size : 0;
  const int b = batch_size_ > 0 ? batch_size_ : kDefaultBatchAlignment;
  max_decoded_waiting_ = DecodeWindowRows(b, options_.decode_threads);
  for (int i = 0; i < std::max(2, options_.staging_slots); ++i) {
    slots_.push_back(std::make_unique<Slot>());
    free_slots_.push_back(slots_.back().get());
  }
  decoding_.resize(std::max(1, options_.decode_threads));
  // Named so that per-thread CPU (top -H, /proc/PID/task) tells the stages apart.
  for (size_t i = 0; i < decoding_.size(); ++i) {
    threads_.emplace_back([this, i] {
      NameThisThread(absl::StrCat("decode-", i));
      DecodeLoop(i);
    });
  }
  threads_.emplace_back([this] {
    NameThisThread("batcher");
    BatchLoop();
  });
  threads_.emplace_back([this] {
    NameThisThread("completion");
    CompletionLoop();
  });
  if (on_timeout_ && options_.batch_timeout_seconds > 0) {
    threads_.emplace_back([this] {
      NameThisThread("watchdog");
      WatchdogLoop();
    });
  }
}

void Pipeline::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
    if (stopping_ || timed_out_) return;
    const double now = NowUnix();
    std::vector<const Activity*> running;
    for (const auto& [id, a] : activities_) running.push_back(&a);
    for (const Activity& a : decoding_) {
      if (a.since > 0) running.push_back(&a);
    }
    for (const Activity* p : running) {
      const Activity& a = *p;
      if (now - a.since <= options_.batch_timeout_seconds) continue;
      timed_out_ = true;
      const Activity stuck = a;
      mu_.Unlock();
      Log(stuck.what, " of ", stuck.indices.size(), " row(s) of job ", stuck.lease.job_id, " has run for ",
          absl::StrFormat("%.0f", now - stuck.since), " s, past the batch timeout");
      on_timeout_(stuck.lease, stuck.indices, stuck.what, options_.batch_timeout_seconds);
      mu_.Lock();  // Released by the scope.
      return;
    }
  }
}

Pipeline::~Pipeline() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  runner_->CancelLayoutTrial();  // Its thread calls back into this pipeline.
  if (profile_enabled_ && profile_.batches > 0) {
    const double n = static_cast<double>(profile_.batches);
    auto ms = [n](const std::atomic<int64_t>& us) { return absl::StrFormat("%.2f", us.load() / n / 1000.0); };
    Log("pipeline profile (ms per batch, ", profile_.batches.load(), " batches): batcher slot wait ",
        ms(profile_.slot_wait), ", stage ", ms(profile_.stage), ", launch ", ms(profile_.launch),
        "; completion wait ", ms(profile_.wait), ", finish ", ms(profile_.finish));
  }
  if (profile_enabled_ && profile_.rows > 0) {
    const double n = static_cast<double>(profile_.rows);
    auto ms = [n](const std::atomic<int64_t>& us) { return absl::StrFormat("%.3f", us.load() / n / 1000.0); };
    Log("decode profile (ms per row summed over ", decoding_.size(), " threads, ", profile_.rows.load(),
        " rows): decoding ", ms(profile_.decoding), " (on the GPU path: files ", ms(profile_.gpu_read), ", queue ",
        ms(profile_.gpu_start), ", PNG and masks ", ms(profile_.gpu_cpu), ", wait and copy ",
        ms(profile_.gpu_finish), "), tasks ", ms(profile_.tasks), ", idle ", ms(profile_.idle), "; ",
        profile_.thumbnails.load(), " thumbnails rendered");
  }
}

std::shared_ptr<ShardThumbnails> Pipeline::NewShardThumbnails() const {
  if (options_.thumbnails <= 0) return nullptr;
  return std::make_shared<ShardThumbnails>(options_.thumbnails, options_.empty_score, options_.all_foreground);
}

std::shared_ptr<Pipeline::Shard> Pipeline::NewShard(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) const {
  auto shard = std::make_shared<Shard>();
  shard->lease = lease;
  shard->items.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    shard->items[i].row = std::move(rows[i]);
    shard->position.emplace(shard->items[i].row.index(), i);
  }
  shard->thumbnails = NewShardThumbnails();
  return shard;
}

void Pipeline::Submit(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) {
  std::shared_ptr<Shard> shard = NewShard(lease, std::move(rows));
  {
    absl::MutexLock lock(&mu_);
    backlog_ += static_cast<int64_t>(shard->items.size());
    shards_.push_back(std::move(shard));
  }
}

void Pipeline::Drop(int64_t lease_id) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& s : shards_) {
      if (s->lease.lease_id == lease_id) s->dropped = true;
    }
    // Shards the batcher is done with whose results wait for a layout trial.
    for (auto& [s, result] : held_) {
      if (s->lease.lease_id == lease_id) s->dropped = true;
    }
  }
}

int64_t Pipeline::Backlog() const {
  absl::MutexLock lock(&mu_);
  return backlog_ - static_cast<int64_t>(held_.size());
}

int64_t Pipeline::HeldRows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

bool Pipeline::HoldingResults() const {
  absl::MutexLock lock(&mu_);
  return layout_provisional_;
}

bool Pipeline::IdleLocked() const { return backlog_ == 0 || failed_ || stopping_; }

bool Pipeline::WaitIdle(absl::Duration limit) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &Pipeline::IdleLocked), limit);
}

int Pipeline::batch_size() const {
  absl::MutexLock lock(&mu_);
  return batch_size_;
}

int Pipeline::num_classes() const {
  absl::MutexLock lock(&mu_);
  return num_classes_;
}

v1::WorkerStats Pipeline::Stats() const {
  RunnerStats rs = runner_->Stats();
  absl::MutexLock lock(&mu_);
  v1::WorkerStats s;
  s.set_device(rs.device);
  s.set_gpu_name(rs.gpu_name);
  s.set_peak_memory_bytes(rs.peak_memory_bytes);
  s.set_model_load_seconds(rs.load_seconds);
  s.set_batch_size(batch_size_);
  s.set_oom_retries(oom_retries_);
  s.set_images(images_done_);
  s.set_decode_threads(options_.decode_threads);
  s.set_first_batch_unix(first_batch_unix_);
  s.set_logit_ties(logit_ties_);
  for (const GpuUsage& g : rs.gpus) {
    v1::GpuStats* gs = s.add_gpus();
    gs->set_device(g.device);
    gs->set_name(g.name);
    gs->set_peak_memory_bytes(g.peak_memory_bytes);
  }
  if (clock_start_ > 0 && last_result_ > clock_start_) {
    s.set_images_per_second(static_cast<double>(images_after_warmup_) / (last_result_ - clock_start_));
  }
  return s;
}

void Pipeline::RecycleLocked(std::unique_ptr<RgbImage> image) {
  if (!image) return;
  ShrinkIfLarger(&image->pixels, kKeepBufferBytes);
  image_pool_.push_back(std::move(image));
}

void Pipeline::RecycleLocked(std::unique_ptr<LabelMap> mask) {
  if (!mask) return;
  ShrinkIfLarger(&mask->labels, kKeepBufferBytes);
  mask_pool_.push_back(std::move(mask));
}

std::unique_ptr<RgbImage> Pipeline::TakeImage() {
  absl::MutexLock lock(&mu_);
  if (image_pool_.empty()) return std::make_unique<RgbImage>();
  auto p = std::move(image_pool_.back());
  image_pool_.pop_back();
  return p;
}

std::unique_ptr<LabelMap> Pipeline::TakeMask() {
  absl::MutexLock lock(&mu_);
  if (mask_pool_.empty()) return std::make_unique<LabelMap>();
  auto p = std::move(mask_pool_.back());
  mask_pool_.pop_back();
  return p;
}

void Pipeline::Deliver(const std::shared_ptr<Shard>& shard, v1::ImageResult result, bool provisional) {
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    // What the row was scored from (its item is decoded by now: `decoded` was set under mu_).
    if (auto p = shard->position.find(result.index()); p != shard->position.end() && !result.has_inputs()) {
      const v1::InputDigests& inputs = shard->items[p->second].inputs;
      if (!inputs.image().empty() || !inputs.mask().empty()) *result.mutable_inputs() = inputs;
      if (options_.row_properties && result.error().empty()) *result.mutable_properties() = shard->items[p->second].properties;
    }
    if (provisional) {
      --provisional_rows_;
      held_.emplace_back(shard, std::move(result));
      return;
    }
    dropped = shard->dropped;
    --backlog_;
    ++images_done_;
    last_result_ = NowUnix();
    if (clock_start_ > 0) ++images_after_warmup_;
  }
  if (!dropped) on_result_(shard->lease, std::move(result));
}

void Pipeline::Fail(const std::string& message, bool definitive) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    failed_ = true;
  }
  Log("job cannot continue here: ", message);
  on_fatal_(message, definitive);
}

size_t Pipeline::RunNow(std::shared_ptr<InFlight> batch, size_t begin, size_t end, std::string* model_error) {
  BatchSpec sub = batch->spec;
  sub.items.assign(batch->spec.items.begin() + begin, batch->spec.items.begin() + end);
  absl::Status s;
  absl::StatusOr<std::unique_ptr<PendingBatch>> pending = absl::UnknownError("not launched");
  {
    ActivityScope activity(this, batch->shard->lease,
                           std::vector<int64_t>(batch->index.begin() + begin, batch->index.begin() + end),
                           "the model's forward pass");
    pending = runner_->Launch(sub);
    s = pending.ok() ? (*pending)->Wait() : pending.status();
  }
  if (s.ok()) {
    std::shared_ptr<PendingBatch> shared(std::move(*pending));
    {
      // Metric tasks read the predicted labels; the batch (which they hold) owns the results.
      absl::MutexLock lock(&mu_);
      batch->retries.push_back(shared);
    }
    Finish(batch, shared.get(), begin, end);
    return 0;
  }
  const bool oom = absl::IsResourceExhausted(s);
  if (!oom && !absl::IsAborted(s)) {
    Fail(std::string(s.message()), absl::IsFailedPrecondition(s));
    return 0;
  }
  if (oom) {
    runner_->ReleaseCachedMemory();
    absl::MutexLock lock(&mu_);
    ++oom_retries_;
    batch_size_ = std::max<int>(1, std::min<int>(batch_size_, static_cast<int>((end - begin) / 2)));
  }
  if (end - begin == 1) {
    const BatchImage& it = batch->spec.items[begin];
    v1::ImageResult r;
    r.set_index(batch->index[begin]);
    if (oom) {
      r.set_error(absl::StrCat("device out of memory even for this image alone (", it.height, "x", it.width, ")"));
    } else {
      *model_error = std::string(s.message());
      r.set_error(*model_error);
    }
    Deliver(batch->shard, std::move(r), batch->provisional);
    return oom ? 0 : 1;
  }
  Log(oom ? "device out of memory" : "the model raised", " on a batch of ", end - begin, "; retrying in halves (",
      s.message(), ")");
  const size_t mid = begin + (end - begin) / 2;
  return RunNow(batch, begin, mid, model_error) + RunNow(batch, mid, end, model_error);
}

}  // namespace tally
