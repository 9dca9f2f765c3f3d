#include "worker/pipeline.h"

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
#include "common/base/clock.h"
#include "common/job/job_config.h"
#include "common/base/log.h"

namespace tally {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
bool AllCopied(std::atomic<int>* remaining) { return remaining->load() == 0; }

// Writes labels (K classes) as folder/PredictionFileName: 8-bit PNG up to 256 classes, else 16-bit.
// Through a temporary file and a rename, so a file there is always whole.
absl::Status SavePrediction(const std::string& folder, const std::string& id, int64_t index, const uint16_t* labels,
                            int height, int width, int k) {
  const std::string path = absl::StrCat(folder, "/", PredictionFileName(id, index));
  const std::string temp = absl::StrCat(path, ".tmp", getpid());
  absl::Status s;
  if (k <= 256) {
    std::vector<uint8_t> bytes(labels, labels + static_cast<size_t>(height) * width);
    s = WritePng(temp, height, width, 1, 8, bytes.data(), 1);
  } else {
    s = WritePng(temp, height, width, 1, 16, labels, 1);
  }
  if (s.ok() && std::rename(temp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("rename to '", path, "': ", std::strerror(errno)));
  }
  if (!s.ok()) {
    std::remove(temp.c_str());
    return absl::Status(s.code(), absl::StrCat("cannot save the prediction (--save-predictions): ", s.message()));
  }
  return absl::OkStatus();
}
}  // namespace

// One launched batch: its staging slot, the rows in it and the device work.
struct Pipeline::InFlight {
  std::shared_ptr<Shard> shard;
  Slot* slot = nullptr;
  BatchSpec spec;
  std::vector<int64_t> index;
  std::vector<int> max_label;
  std::vector<int64_t> mask_ignored;
  std::shared_ptr<PendingBatch> pending;
  std::vector<std::shared_ptr<PendingBatch>> retries;  // Results of out-of-memory retries.
  std::vector<std::unique_ptr<LabelMap>> masks;         // For surface metrics: handed to their task.
  std::string error;  // Why the model failed on the whole batch (Complete), for its retry.
  bool provisional = false;  // Launched while the layout trial ran beside: its results are held.
};

// Registers what the calling thread is about to do with the watchdog, for the scope's lifetime.
class Pipeline::ActivityScope {
 public:
  ActivityScope(Pipeline* p, const LeaseKey& lease, std::vector<int64_t> indices, std::string what) : p_(p) {
    Activity a;
    a.since = NowUnix();
    a.what = std::move(what);
    a.lease = lease;
    a.indices = std::move(indices);
    absl::MutexLock lock(&p_->mu_);
    id_ = p_->next_activity_++;
    p_->activities_[id_] = std::move(a);
  }
  ~ActivityScope() {
    absl::MutexLock lock(&p_->mu_);
    p_->activities_.erase(id_);
  }

 private:
  Pipeline* p_;
  int64_t id_ = 0;
};

Pipeline::Pipeline(ModelRunner* runner, PipelineOptions options, ResultFn on_result, FatalFn on_fatal,
                   TimeoutFn on_timeout)
    : runner_(runner),
      options_(std::move(options)),
      on_result_(std::move(on_result)),
      on_fatal_(std::move(on_fatal)),
      on_timeout_(std::move(on_timeout)),
      surface_(AnySurfaceMetric(options_.metrics)),
      // TALLY_CPU_SURFACE=1: the CPU path on a GPU worker too (benchmarks and tests compare them).
      device_surface_(surface_ && runner_->ScoresSurfaceOnDevice() && std::getenv("TALLY_CPU_SURFACE") == nullptr),
      saving_(!options_.save_predictions.empty()),
      profile_enabled_(std::getenv("TALLY_PIPELINE_PROFILE") != nullptr),
      label_lut_(MakeLabelLut(options_.label_map)),
      workers_worst_(options_.thumbnails) {
  absl::MutexLock lock(&mu_);  // No other thread yet; the analysis wants the guard all the same.
  gpu_decode_ = options_.decode_gpu;
  batch_size_ = options_.batch_size > 0 ? options_.batch_size : 0;
  const int b = batch_size_ > 0 ? batch_size_ : kDefaultBatchAlignment;
  max_decoded_waiting_ = DecodeWindowRows(b, options_.decode_threads);
  for (int i = 0; i < std::max(2, options_.staging_slots); ++i) {
    slots_.push_back(std::make_unique<Slot>());
    free_slots_.push_back(slots_.back().get());
  }
  decoding_.resize(std::max(1, options_.decode_threads));
  for (size_t i = 0; i < decoding_.size(); ++i) threads_.emplace_back([this, i] { DecodeLoop(i); });
  threads_.emplace_back([this] { BatchLoop(); });
  threads_.emplace_back([this] { CompletionLoop(); });
  if (on_timeout_ && options_.batch_timeout_seconds > 0) threads_.emplace_back([this] { WatchdogLoop(); });
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
  for (size_t i = 0; i < rows.size(); ++i) shard->items[i].row = std::move(rows[i]);
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

void Pipeline::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &Pipeline::IdleLocked));
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

namespace {

// Reads an image file as LoadImage does (its errors prefixed "image: "), into a reused buffer.
absl::Status ReadImageBytes(const std::string& path, std::string* bytes) {
  absl::Status s = ReadFileBytes(path, bytes);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("image: ", s.message()));
  return absl::OkStatus();
}

// CPU time of the calling thread (the auto decoder's trial: preemption and the start-up's other
// work on the machine do not count against the decoder).
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// --decode auto keeps the CPU decoders only when they can decode this much faster than the model
// runs: the same threads also stage batches and compute metrics.
constexpr double kCpuDecodeMargin = 1.5;

// Rows nvJPEG decodes in one call per decode thread: enough to keep the JPEG engines busy, few
// enough that the rows reach the batcher in time (8: 1997 img/s with 4 threads on the H100 against
// 1844-1924 with 16, BENCHMARKS.md).
// TALLY_GPU_DECODE_ROWS overrides it (benchmarks).
size_t GpuDecodeRows() {
  static const size_t rows = [] {
    const char* v = std::getenv("TALLY_GPU_DECODE_ROWS");
    const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    return n > 0 && n <= 256 ? static_cast<size_t>(n) : size_t{8};
  }();
  return rows;
}

}  // namespace

void Pipeline::Decode(Item* item) {
  if (!item->row.error().empty()) {
    item->error = item->row.error();
    return;
  }
  thread_local std::string bytes;
  std::unique_ptr<RgbImage> image = TakeImage();
  absl::Status s = ReadImageBytes(item->row.image_path(), &bytes);
  if (s.ok()) {
    item->jpeg = LooksLikeJpeg(bytes);
    s = DecodeImage(bytes, item->row.image_path(), image.get(), options_.max_image_pixels);
  }
  if (bytes.capacity() > kKeepBufferBytes) std::string().swap(bytes);
  if (!s.ok()) {
    item->error = std::string(s.message());
    item->image = std::move(image);
    return;
  }
  DecodeMask(item, std::move(image));
}

void Pipeline::DecodeMask(Item* item, std::unique_ptr<RgbImage> image) {
  std::unique_ptr<LabelMap> mask = TakeMask();
  absl::Status s = LoadMask(item->row.mask_path(), mask.get(), options_.max_image_pixels);
  if (s.ok()) PrepareMask(mask.get(), label_lut_, options_.ignore_index);
  if (!s.ok()) {
    item->error = std::string(s.message());
  } else if (mask->height != image->height || mask->width != image->width) {
    item->error = absl::StrCat("image '", item->row.image_path(), "' is ", image->height, "x", image->width,
                               " (height x width) but mask '", item->row.mask_path(), "' is ", mask->height, "x",
                               mask->width);
  }
  item->mask = std::move(mask);
  item->image = std::move(image);
}

GpuJpegDecoder* Pipeline::GpuDecoder(size_t slot) {
  {
    absl::MutexLock lock(&gpu_decoders_mu_);
    if (slot < gpu_decoders_.size() && gpu_decoders_[slot]) return gpu_decoders_[slot].get();
  }
  // Created outside the lock: a decoder's start-up (its decode states) takes a while, and the
  // threads start theirs at once.
  absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> d = GpuJpegDecoder::Create(options_.decode_device);
  if (!d.ok()) {
    Fail(absl::StrCat("--decode gpu: ", d.status().message()), false);
    return nullptr;
  }
  absl::MutexLock lock(&gpu_decoders_mu_);
  if (gpu_decoders_.size() <= slot) gpu_decoders_.resize(slot + 1);
  gpu_decoders_[slot] = std::move(*d);
  return gpu_decoders_[slot].get();
}

void Pipeline::DecodeOnGpu(const std::vector<Item*>& items, size_t slot) {
  GpuJpegDecoder* decoder = GpuDecoder(slot);
  thread_local std::vector<std::string> bytes;
  if (bytes.size() < items.size()) bytes.resize(items.size());
  // First the JPEG images' files (read, headers checked) go to the GPU; while it decodes them,
  // this thread decodes the PNG images and every mask.
  std::vector<GpuJpegImage> jobs;
  std::vector<Item*> jpeg_items;
  std::vector<std::unique_ptr<RgbImage>> images(items.size());
  std::vector<absl::Status> status(items.size());
  const double t0 = profile_enabled_ ? NowUnix() : 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Item* item = items[i];
    if (!item->row.error().empty()) continue;
    images[i] = TakeImage();
    const std::string& path = item->row.image_path();
    status[i] = ReadImageBytes(path, &bytes[i]);
    if (!status[i].ok()) continue;
    item->jpeg = LooksLikeJpeg(bytes[i]);
    if (!item->jpeg || decoder == nullptr) continue;
    int h = 0, w = 0;
    status[i] = InspectJpeg(bytes[i], path, options_.max_image_pixels, &h, &w);
    if (!status[i].ok()) continue;
    RgbImage* image = images[i].get();
    image->height = h;
    image->width = w;
    image->pixels.resize(static_cast<size_t>(h) * w * 3);
    GpuJpegImage job;
    job.bytes = &bytes[i];
    job.name = path;
    job.height = h;
    job.width = w;
    job.out = image->pixels.data();
    jobs.push_back(std::move(job));
    jpeg_items.push_back(item);
  }
  const double t1 = profile_enabled_ ? NowUnix() : 0;
  if (!jobs.empty()) decoder->Start(&jobs);
  const double t2 = profile_enabled_ ? NowUnix() : 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Item* item = items[i];
    if (!item->row.error().empty()) {
      item->error = item->row.error();
      continue;
    }
    if (status[i].ok() && (!item->jpeg || decoder == nullptr)) {
      status[i] = DecodeImage(bytes[i], item->row.image_path(), images[i].get(), options_.max_image_pixels);
    }
    if (!status[i].ok()) {
      item->error = std::string(status[i].message());
      item->image = std::move(images[i]);
      continue;
    }
    DecodeMask(item, std::move(images[i]));  // The pixels' buffer stays where the decoder writes.
    HelpStage();  // A group takes tens of milliseconds; the batcher should not wait that long.
  }
  const double t3 = profile_enabled_ ? NowUnix() : 0;
  if (!jobs.empty()) decoder->Finish();
  if (profile_enabled_) {
    const double t4 = NowUnix();
    profile_.gpu_read += static_cast<int64_t>((t1 - t0) * 1e6);
    profile_.gpu_start += static_cast<int64_t>((t2 - t1) * 1e6);
    profile_.gpu_cpu += static_cast<int64_t>((t3 - t2) * 1e6);
    profile_.gpu_finish += static_cast<int64_t>((t4 - t3) * 1e6);
  }
  for (size_t k = 0; k < jobs.size(); ++k) {
    if (!jobs[k].status.ok()) {
      if (jpeg_items[k]->error.empty()) jpeg_items[k]->error = std::string(jobs[k].status.message());
    } else {
      jpeg_items[k]->gpu_pixels = true;
    }
  }
  for (std::string& b : bytes) {
    if (b.capacity() > kKeepBufferBytes) std::string().swap(b);
  }
}

void Pipeline::RedecodeStaged(const BatchSpec& spec, const std::vector<bool>& redo) {
  GpuJpegDecoder* decoder = GpuDecoder(static_cast<size_t>(std::max(1, options_.decode_threads)));
  if (decoder == nullptr) return;
  std::vector<std::string> bytes(spec.items.size());
  std::vector<GpuJpegImage> jobs;
  for (size_t i = 0; i < spec.items.size(); ++i) {
    if (!redo[i]) continue;
    const BatchImage& b = spec.items[i];
    // The file was decoded moments ago; reading it again can only fail if it changed meanwhile,
    // and then the CPU's pixels stay (the row still has an image of the right size).
    if (!ReadImageBytes(b.row->image_path(), &bytes[i]).ok() || !LooksLikeJpeg(bytes[i])) continue;
    GpuJpegImage job;
    job.bytes = &bytes[i];
    job.name = b.row->image_path();
    job.height = b.height;
    job.width = b.width;
    job.out = spec.images->data() + b.image_offset;
    jobs.push_back(std::move(job));
  }
  if (!jobs.empty()) decoder->Decode(&jobs);
  for (const GpuJpegImage& j : jobs) {
    if (!j.status.ok()) {
      Fail(absl::StrCat("--decode auto: decoding '", j.name, "' again on the GPU failed: ", j.status.message()), false);
      return;
    }
  }
}

bool Pipeline::DecodeWorkLocked() const {
  if (stopping_ || !copy_tasks_.empty() || !metric_tasks_.empty()) return true;
  if (decoded_waiting_ >= max_decoded_waiting_) return false;
  for (const auto& s : shards_) {
    if (!s->dropped && s->next_decode < s->items.size()) return true;
  }
  return false;
}

void Pipeline::DecodeLoop(size_t slot) {
  absl::MutexLock lock(&mu_);
  while (true) {
    std::shared_ptr<Shard> shard;
    const double idle0 = profile_enabled_ ? NowUnix() : 0;
    mu_.Await(absl::Condition(this, &Pipeline::DecodeWorkLocked));
    if (stopping_) return;
    const double busy0 = profile_enabled_ ? NowUnix() : 0;
    if (profile_enabled_) profile_.idle += static_cast<int64_t>((busy0 - idle0) * 1e6);
    if (!copy_tasks_.empty() || !metric_tasks_.empty()) {
      std::function<void()> task;
      if (copy_tasks_.empty()) {  // Staging copies first (HelpStage takes them all).
        task = std::move(metric_tasks_.front());
        metric_tasks_.pop_front();
      }
      mu_.Unlock();
      if (task) {
        task();
      } else {
        HelpStage();
      }
      if (profile_enabled_) profile_.tasks += static_cast<int64_t>((NowUnix() - busy0) * 1e6);
      mu_.Lock();
      continue;
    }
    // On the GPU, a few consecutive rows at once (nvJPEG decodes them in one call).
    const bool gpu = gpu_decode_;
    std::vector<Item*> items;
    for (auto& s : shards_) {
      if (!s->dropped && s->next_decode < s->items.size()) {
        shard = s;
        // Always the same count where the shard allows (nvJPEG sets its batch decoder up for one
        // count); the backlog may pass max_decoded_waiting_ by less than a group.
        const size_t n = gpu ? std::min(GpuDecodeRows(), s->items.size() - s->next_decode) : 1;
        for (size_t k = 0; k < n; ++k) items.push_back(&s->items[s->next_decode++]);
        break;
      }
    }
    decoded_waiting_ += static_cast<int>(items.size());
    // For the watchdog, set while the lock is held anyway: no extra locking per image.
    Activity& activity = decoding_[slot];
    // Timed only while --decode auto waits for its trial.
    const bool timed = !gpu && options_.resolve_decode;
    const double cpu0 = timed ? ThreadCpuSeconds() : 0;
    activity.since = NowUnix();
    activity.what = "decoding";
    activity.lease = shard->lease;
    activity.indices.clear();
    for (Item* it : items) activity.indices.push_back(it->row.index());
    mu_.Unlock();
    if (gpu) {
      DecodeOnGpu(items, slot);
    } else {
      Decode(items[0]);
    }
    if (profile_enabled_) {
      profile_.decoding += static_cast<int64_t>((NowUnix() - busy0) * 1e6);
      profile_.rows += static_cast<int64_t>(items.size());
    }
    mu_.Lock();
    activity.since = 0;
    if (timed && items[0]->jpeg && items[0]->error.empty()) {
      cpu_jpeg_seconds_ += ThreadCpuSeconds() - cpu0;
      ++cpu_jpeg_rows_;
    }
    for (Item* it : items) it->decoded = true;
  }
}

void Pipeline::Stage(const std::vector<Item*>& items, Slot* slot, BatchSpec* spec) {
  size_t image_bytes = 0, mask_words = 0;
  for (const Item* it : items) {
    image_bytes += static_cast<size_t>(it->image->height) * it->image->width * 3;
    mask_words += static_cast<size_t>(it->mask->height) * it->mask->width;
  }
  // Grown as needed; given back when an outlier left a buffer far larger than this batch needs.
  auto fits = [](const std::unique_ptr<HostBuffer>& b, size_t bytes) {
    return b && b->size() >= bytes && b->size() <= std::max(4 * bytes, kKeepBufferBytes);
  };
  if (!fits(slot->images, image_bytes)) {
    slot->images.reset();
    slot->images = runner_->AllocateHost(image_bytes + image_bytes / 4);
  }
  if (!fits(slot->masks, mask_words * 2)) {
    slot->masks.reset();
    slot->masks = runner_->AllocateHost((mask_words + mask_words / 4) * 2);
  }
  {
    absl::MutexLock lock(&mu_);
    last_image_bytes_ = image_bytes;
    last_mask_bytes_ = mask_words * 2;
  }
  spec->images = slot->images.get();
  spec->masks = slot->masks.get();
  spec->want_labels = (surface_ && !device_surface_) || saving_;
  spec->surface = SurfaceRequest{device_surface_, options_.surface};
  spec->keep_labels = options_.thumbnails > 0;  // A few rows per batch copy theirs (Finish).
  spec->items.clear();
  size_t image_off = 0, mask_off = 0;
  for (const Item* it : items) {
    BatchImage b;
    b.image_offset = image_off;
    b.mask_offset = mask_off;
    b.height = it->image->height;
    b.width = it->image->width;
    b.row = &it->row;
    image_off += it->image->pixels.size();
    mask_off += it->mask->labels.size();
    spec->items.push_back(b);
  }
  // The copies into the staging buffer (1.3 MB per 512x512 image) run on the pool threads, ahead
  // of their decoding work, so this thread is free to launch the next batch sooner.
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(items.size()));
  uint8_t* image_base = slot->images->data();
  uint16_t* mask_base = reinterpret_cast<uint16_t*>(slot->masks->data());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      const Item* it = items[i];
      const BatchImage b = spec->items[i];
      copy_tasks_.push_back([this, it, b, image_base, mask_base, remaining] {
        std::memcpy(image_base + b.image_offset, it->image->pixels.data(), it->image->pixels.size());
        std::memcpy(mask_base + b.mask_offset, it->mask->labels.data(), it->mask->labels.size() * sizeof(uint16_t));
        // The batcher waits for the count to reach 0; releasing mu_ makes it look again.
        if (--*remaining == 0) absl::MutexLock done(&mu_);
      });
    }
    copy_tasks_queued_ += static_cast<int>(items.size());
  }
  HelpStage();  // With the decode threads, whichever is free.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&AllCopied, remaining.get()));
}

void Pipeline::HelpStage() {
  while (copy_tasks_queued_.load(std::memory_order_relaxed) > 0) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      if (copy_tasks_.empty()) return;
      task = std::move(copy_tasks_.front());
      copy_tasks_.pop_front();
      --copy_tasks_queued_;
    }
    task();
  }
}

void Pipeline::OutlierBuffersLocked(Slot* slot, std::vector<std::unique_ptr<HostBuffer>>* out) {
  auto outlier = [](const std::unique_ptr<HostBuffer>& b, size_t last) {
    return b && b->size() > std::max(4 * last, kKeepBufferBytes);
  };
  if (outlier(slot->images, last_image_bytes_)) out->push_back(std::move(slot->images));
  if (outlier(slot->masks, last_mask_bytes_)) out->push_back(std::move(slot->masks));
}

void Pipeline::ReleaseSlot(Slot* slot) {
  std::vector<std::unique_ptr<HostBuffer>> released;  // Freed after the lock.
  absl::MutexLock lock(&mu_);
  OutlierBuffersLocked(slot, &released);
  free_slots_.push_back(slot);
}

void Pipeline::ReleaseIdleBuffers() {
  std::vector<std::unique_ptr<HostBuffer>> released;
  {
    absl::MutexLock lock(&mu_);
    for (Slot* slot : free_slots_) OutlierBuffersLocked(slot, &released);
  }
}

void Pipeline::Deliver(const std::shared_ptr<Shard>& shard, v1::ImageResult result, bool provisional) {
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
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

void Pipeline::NoteEarlyBatch(size_t rows, size_t failed, const std::string& message) {
  bool give_up = false;
  {
    absl::MutexLock lock(&mu_);
    if (early_batches_ >= 2) return;
    ++early_batches_;
    if (rows > 0 && failed == rows) ++early_batches_all_failed_;
    give_up = early_batches_ == 2 && early_batches_all_failed_ == 2;
  }
  // The model raised on every image of its first two batches: a broken model, not bad rows.
  if (give_up) Fail(absl::StrCat(message, " (and on every other image of the first two batches)"), true);
}

Pipeline::BatcherStep Pipeline::NextBatcherStepLocked() const {
  if (stopping_) return BatcherStep::kStop;
  if (!failed_ && layout_trial_ == LayoutTrial::kAfterFirstBatch && early_batches_ >= 1) {
    return BatcherStep::kStartLayoutTrial;
  }
  if (!failed_ && layout_trial_ == LayoutTrial::kReady) return BatcherStep::kResolveLayout;
  if (failed_ || shards_.empty()) return BatcherStep::kWait;
  const Shard& shard = *shards_.front();
  const size_t n = shard.items.size();
  if (shard.dropped) {
    // Items handed to decoders finish decoding first; the rest are never decoded.
    for (size_t i = shard.next_batch; i < shard.next_decode; ++i) {
      if (!shard.items[i].decoded) return BatcherStep::kWait;
    }
    return BatcherStep::kDiscardShard;
  }
  if (shard.next_batch >= n) return BatcherStep::kNextShard;
  const size_t i0 = shard.next_batch;
  if (batch_size_ == 0) return shard.items[i0].decoded ? BatcherStep::kChooseBatchSize : BatcherStep::kWait;
  const size_t i1 = BlockEndLocked(shard);
  for (size_t i = i0; i < i1; ++i) {
    if (!shard.items[i].decoded) return BatcherStep::kWait;
  }
  return BatcherStep::kTakeBlock;
}

bool Pipeline::BatcherCanActLocked() const { return NextBatcherStepLocked() != BatcherStep::kWait; }

size_t Pipeline::BlockEndLocked(const Shard& shard) const {
  const int64_t b = batch_size_;
  const size_t i0 = shard.next_batch;
  const int64_t idx0 = shard.items[i0].row.index();
  const int64_t block_end = (idx0 / b + 1) * b;  // Aligned to global index multiples of b.
  // A leased shard's rows are consecutive; rows queued again after a layout trial may have gaps
  // (rows that failed to decode were not held), so the block ends at the first index past it.
  size_t i1 = std::min(shard.items.size(), i0 + static_cast<size_t>(block_end - idx0));
  while (i1 > i0 + 1 && shard.items[i1 - 1].row.index() >= block_end) --i1;
  return i1;
}

void Pipeline::DiscardFrontShardLocked() {
  Shard& shard = *shards_.front();
  const size_t n = shard.items.size();
  decoded_waiting_ -= static_cast<int>(shard.next_decode - shard.next_batch);
  backlog_ -= static_cast<int64_t>(n - shard.next_batch);
  for (size_t i = shard.next_batch; i < n; ++i) {
    RecycleLocked(std::move(shard.items[i].image));
    RecycleLocked(std::move(shard.items[i].mask));
  }
  shard.next_batch = n;
  shards_.pop_front();
}

void Pipeline::ChooseBatchSize() {
  int h = 0, w = 0;
  {
    absl::MutexLock lock(&mu_);
    const Shard& shard = *shards_.front();
    const Item& first = shard.items[shard.next_batch];
    if (!first.image || !first.error.empty()) {
      batch_size_ = 1;  // Fail this row alone; the next one sets the size.
      return;
    }
    h = first.image->height;
    w = first.image->width;
  }
  // Trial passes at the size of the first decodable image.
  absl::StatusOr<int> b =
      runner_->FindMaxBatch(h, w, options_.max_memory, options_.max_batch_size, options_.default_batch_size);
  if (!b.ok()) {
    Fail(std::string(b.status().message()), absl::IsFailedPrecondition(b.status()));
    return;
  }
  absl::MutexLock lock(&mu_);
  batch_size_ = *b;
  max_decoded_waiting_ = DecodeWindowRows(batch_size_, options_.decode_threads);
  Log("automatic batch size: ", batch_size_, " at ", h, "x", w);
}

std::vector<std::vector<Pipeline::Item*>> Pipeline::GroupBlock(const std::shared_ptr<Shard>& shard, size_t i0,
                                                                size_t i1) {
  // Rows that failed to decode are reported now; the others are grouped by size.
  std::vector<std::vector<Item*>> groups;
  std::map<std::pair<int, int>, size_t> group_of_size;
  for (size_t i = i0; i < i1; ++i) {
    Item& it = shard->items[i];
    if (!it.error.empty()) {
      v1::ImageResult r;
      r.set_index(it.row.index());
      r.set_error(it.error);
      Deliver(shard, std::move(r));
      continue;
    }
    const auto key =
        options_.any_input_size ? std::make_pair(0, 0) : std::make_pair(it.image->height, it.image->width);
    auto [pos, inserted] = group_of_size.emplace(key, groups.size());
    if (inserted) groups.emplace_back();
    groups[pos->second].push_back(&it);
  }
  return groups;
}

bool Pipeline::SlotOrStopLocked() const { return stopping_ || failed_ || !free_slots_.empty(); }

std::shared_ptr<Pipeline::InFlight> Pipeline::StageGroup(const std::shared_ptr<Shard>& shard,
                                                         const std::vector<Item*>& group) {
  Slot* slot = nullptr;
  const double t0 = NowUnix();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Pipeline::SlotOrStopLocked));
    if (stopping_ || failed_) return nullptr;
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  const double t1 = NowUnix();
  auto batch = std::make_shared<InFlight>();
  batch->shard = shard;
  batch->slot = slot;
  Stage(group, slot, &batch->spec);
  // Rows decoded on the CPU before --decode auto chose the GPU.
  std::vector<bool> redo(group.size());
  bool any_redo = false;
  {
    absl::MutexLock lock(&mu_);
    if (gpu_decode_) {
      for (size_t i = 0; i < group.size(); ++i) any_redo |= redo[i] = group[i]->jpeg && !group[i]->gpu_pixels;
    }
  }
  if (any_redo) RedecodeStaged(batch->spec, redo);
  if (profile_enabled_) {
    profile_.slot_wait += static_cast<int64_t>((t1 - t0) * 1e6);
    profile_.stage += static_cast<int64_t>((NowUnix() - t1) * 1e6);
  }
  absl::MutexLock lock(&mu_);
  for (Item* it : group) {
    batch->index.push_back(it->row.index());
    batch->max_label.push_back(it->mask->max_label);
    batch->mask_ignored.push_back(it->mask->ignored);
    RecycleLocked(std::move(it->image));
    // Surface metrics read the reference labels after the batch has left the staging buffer.
    if (surface_) {
      batch->masks.push_back(std::move(it->mask));
    } else {
      RecycleLocked(std::move(it->mask));
    }
  }
  return batch;
}

bool Pipeline::ResolveDecode(const BatchSpec& spec) {
  double cpu_seconds = 0;
  int64_t cpu_rows = 0;
  {
    absl::MutexLock lock(&mu_);
    cpu_seconds = cpu_jpeg_seconds_;
    cpu_rows = cpu_jpeg_rows_;
  }
  const int threads = std::max(1, options_.decode_threads);
  bool gpu = false;
  std::string trial;
  absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> probe = absl::UnavailableError("not tried");
  if (cpu_rows == 0 || cpu_seconds <= 0) {
    trial = "no JPEG images in the first batch";
  } else {
    // The model's rate on this batch (one more pass, timed alone), against what the decode
    // threads can do: CPU time per row (reading, decoding image and mask) over the threads that
    // can run at once.
    const double t0 = NowUnix();
    auto p = runner_->Launch(spec);
    const bool ran = p.ok() && (*p)->Wait().ok();
    const double model = ran ? spec.items.size() / std::max(NowUnix() - t0, 1e-6) : 0;
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const double cpu = std::min(threads, cores) * cpu_rows / cpu_seconds;
    probe = GpuJpegDecoder::Create(options_.decode_device);
    if (!probe.ok()) {
      trial = absl::StrCat("nvJPEG unavailable: ", probe.status().message());
    } else {
      gpu = ran && cpu < kCpuDecodeMargin * model;
      trial = absl::StrFormat("CPU decoders %.0f img/s (%d threads) %s %.1f x model %.0f img/s", cpu, threads,
                              gpu ? "<" : ">=", kCpuDecodeMargin, model);
    }
  }
  absl::StatusOr<bool> answer = options_.resolve_decode(gpu, trial);
  if (!answer.ok()) {
    Fail(absl::StrCat("cannot agree on the job's JPEG decoder with the coordinator: ", answer.status().message()),
         false);
    return false;
  }
  Log("JPEG decoding on the ", *answer ? "GPU" : "CPU", " for this job (", gpu == *answer ? "" : "not ",
      "this worker's choice; ", trial, ")");
  if (!*answer) return false;
  // Every decode thread's decoder now, in parallel, before the clock starts; the probe is the
  // batcher's (it decodes again what the CPU decoded before the answer).
  if (probe.ok()) {
    absl::MutexLock lock(&gpu_decoders_mu_);
    gpu_decoders_.resize(threads + 1);
    gpu_decoders_[threads] = std::move(*probe);
  }
  std::vector<std::thread> starts;
  for (int i = 0; i < threads; ++i) starts.emplace_back([this, i] { GpuDecoder(i); });
  for (std::thread& t : starts) t.join();
  absl::MutexLock lock(&mu_);
  gpu_decode_ = true;
  return true;
}

bool Pipeline::AgreeLayout(const std::string& choice, const std::string& trial) {
  if (choice.empty()) return true;
  absl::StatusOr<bool> on = options_.resolve_layout(choice == "on", trial);
  if (!on.ok()) {
    Fail(absl::StrCat("cannot agree on the job's memory layout with the coordinator: ", on.status().message()), false);
    return false;
  }
  runner_->SetChannelsLast(*on);
  Log("channels-last ", *on ? "on" : "off", " for this job (", choice == (*on ? "on" : "off") ? "" : "not ",
      "this worker's choice; ", trial, ")");
  return true;
}

bool Pipeline::ProvisionalSettledLocked() const {
  return stopping_ || failed_ || (provisional_rows_ == 0 && in_flight_.empty() && !launches_paused_);
}

void Pipeline::ResolveLayoutTrial() {
  const double t0 = NowUnix();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Pipeline::ProvisionalSettledLocked));
    if (stopping_ || failed_) return;
  }
  const double t1 = NowUnix();
  const bool ran_channels_last = runner_->ChannelsLast();
  std::string trial;
  const std::string choice = runner_->FinishLayoutTrial(&trial);
  if (!AgreeLayout(choice, trial)) return;
  const bool again = runner_->ChannelsLast() != ran_channels_last;
  std::vector<std::pair<std::shared_ptr<Shard>, v1::ImageResult>> held;
  {
    absl::MutexLock lock(&mu_);
    layout_provisional_ = false;
    held.swap(held_);
    if (!again && !held.empty() && first_batch_unix_ == 0) first_batch_unix_ = NowUnix();
  }
  const std::string timing =
      absl::StrFormat(" (waited %.2f s for them, timed and agreed in %.2f s)", t1 - t0, NowUnix() - t1);
  if (!again) {
    Log("layout trial beside the evaluation: ", held.size(), " rows evaluated meanwhile are delivered", timing);
    for (auto& [shard, result] : held) Deliver(shard, std::move(result));
    return;
  }
  // The held results go, with their places among the worst rows: every thumbnail selection starts
  // again from the rows evaluated from now on (a subset of the job's rows: the argument of
  // common/io/thumbnail.h holds for it).
  {
    absl::MutexLock lock(&worst_mu_);
    workers_worst_ = RunningWorst(options_.thumbnails);
  }
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Shard>& shard : shards_) shard->thumbnails = NewShardThumbnails();
  // The rows again, per shard, at the back of the queue: they form the same batches as before
  // (batches are index-aligned blocks of a shard's consecutive rows, and these are whole batches).
  std::vector<std::shared_ptr<Shard>> order;
  std::map<const Shard*, std::vector<int64_t>> rows;
  for (const auto& [shard, result] : held) {
    auto [it, inserted] = rows.try_emplace(shard.get());
    if (inserted) order.push_back(shard);
    it->second.push_back(result.index());
  }
  size_t dropped = 0;
  for (const std::shared_ptr<Shard>& old : order) {
    std::vector<int64_t>& indices = rows[old.get()];
    if (old->dropped) {  // Its lease went meanwhile (revoked, job cancelled).
      backlog_ -= static_cast<int64_t>(indices.size());
      dropped += indices.size();
      continue;
    }
    std::sort(indices.begin(), indices.end());
    std::vector<v1::ManifestRow> again;
    for (const Item& it : old->items) {
      if (std::binary_search(indices.begin(), indices.end(), it.row.index())) again.push_back(it.row);
    }
    shards_.push_back(NewShard(old->lease, std::move(again)));
  }
  Log("layout trial beside the evaluation: ", held.size() - dropped,
      " rows evaluated meanwhile are evaluated again in the job's layout", timing,
      dropped > 0 ? absl::StrCat("; ", dropped, " more were dropped with their leases") : "");
}

bool Pipeline::WarmUp(const BatchSpec& spec) {
  const double t0 = NowUnix();
  bool beside = false;
  if (options_.resolve_layout) {
    if (!saving_ && runner_->PrepareLayoutTrial(spec)) {
      // The trial starts after this batch and runs beside the evaluation; results wait for it.
      beside = true;
      absl::MutexLock lock(&mu_);
      layout_trial_ = LayoutTrial::kAfterFirstBatch;
      layout_provisional_ = true;
    } else {
      std::string trial;
      const std::string choice = runner_->TrialLayout(spec, &trial);
      if (!AgreeLayout(choice, trial)) return false;
    }
  }
  // TorchScript's profiling executor optimises after a few runs (--jit-optimize): run the first
  // batch a few extra times so that every result comes from the optimised graph. --decode auto
  // times one pass against the decoders: never the cold one.
  const double t1 = NowUnix();
  int passes = options_.warmup_batches;
  if (options_.cold_runner && options_.resolve_decode && passes == 0) passes = 1;
  for (int k = 0; k < passes; ++k) {
    auto p = runner_->Launch(spec);
    if (!p.ok() || !(*p)->Wait().ok()) break;
  }
  const double t2 = NowUnix();
  const bool redecode = options_.resolve_decode && ResolveDecode(spec);
  if (options_.resolve_layout || passes > 0 || options_.resolve_decode) {
    Log("warm-up on the first batch (", spec.items.size(), " rows): ",
        !options_.resolve_layout ? ""
        : beside                 ? "layout trial beside the evaluation from the next batch on, "
                                 : absl::StrFormat("layout trial %.2f s, ", t1 - t0),
        passes,
        absl::StrFormat(" passes %.2f s", t2 - t1),
        options_.resolve_decode ? absl::StrFormat(", decoder trial %.2f s", NowUnix() - t2) : "");
  }
  absl::MutexLock lock(&mu_);
  if (options_.cold_runner && passes == 0) {
    clock_after_first_batch_ = true;
  } else {
    clock_start_ = NowUnix();
  }
  return redecode;
}

void Pipeline::LaunchBatch(std::shared_ptr<InFlight> batch) {
  {
    absl::MutexLock lock(&mu_);  // Not while the completion thread retries a batch (CompletionLoop).
    mu_.Await(absl::Condition(this, &Pipeline::LaunchesAllowedLocked));
    batch->provisional = layout_provisional_;
    if (batch->provisional) provisional_rows_ += static_cast<int64_t>(batch->index.size());
  }
  absl::StatusOr<std::unique_ptr<PendingBatch>> pending = runner_->Launch(batch->spec);
  if (pending.ok()) {
    batch->pending = std::move(*pending);
    absl::MutexLock q(&mu_);
    in_flight_.push_back(std::move(batch));
  } else if (absl::IsResourceExhausted(pending.status()) || absl::IsAborted(pending.status())) {
    std::string model_error = std::string(pending.status().message());
    const size_t failed = RunNow(batch, 0, batch->index.size(), &model_error);
    NoteEarlyBatch(batch->index.size(), failed, model_error);
    ReleaseSlot(batch->slot);
  } else {
    Fail(std::string(pending.status().message()), absl::IsFailedPrecondition(pending.status()));
    ReleaseSlot(batch->slot);
  }
}

void Pipeline::BatchLoop() {
  bool warmed = false;
  while (true) {
    std::shared_ptr<Shard> shard;
    size_t i0 = 0, i1 = 0;
    BatcherStep step = BatcherStep::kWait;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Pipeline::BatcherCanActLocked));
      step = NextBatcherStepLocked();
      switch (step) {
        case BatcherStep::kWait:
          continue;
        case BatcherStep::kStop:
          return;
        case BatcherStep::kStartLayoutTrial:
          layout_trial_ = LayoutTrial::kRunning;
          break;
        case BatcherStep::kResolveLayout:
          layout_trial_ = LayoutTrial::kNone;
          break;
        case BatcherStep::kDiscardShard:
          DiscardFrontShardLocked();
          continue;
        case BatcherStep::kNextShard:
          shards_.pop_front();
          continue;
        case BatcherStep::kChooseBatchSize:
          break;
        case BatcherStep::kTakeBlock:
          shard = shards_.front();
          i0 = shard->next_batch;
          i1 = BlockEndLocked(*shard);
          shard->next_batch = i1;
          decoded_waiting_ -= static_cast<int>(i1 - i0);
          break;
      }
    }
    if (step == BatcherStep::kStartLayoutTrial) {
      // After the first batch, whose passes show what the evaluation needs of the device's memory.
      const bool beside = runner_->StartLayoutTrial([this] {
        absl::MutexLock lock(&mu_);
        if (layout_trial_ == LayoutTrial::kRunning) layout_trial_ = LayoutTrial::kReady;
      });
      if (!beside) {
        absl::MutexLock lock(&mu_);
        layout_trial_ = LayoutTrial::kReady;  // The whole trial on this thread, now.
      }
      continue;
    }
    if (step == BatcherStep::kResolveLayout) {
      ResolveLayoutTrial();
      continue;
    }
    if (!shard) {
      ChooseBatchSize();
      continue;
    }
    for (const std::vector<Item*>& group : GroupBlock(shard, i0, i1)) {
      std::shared_ptr<InFlight> batch = StageGroup(shard, group);
      if (!batch) break;
      ActivityScope activity(this, shard->lease, batch->index, "the model's forward pass");
      if (!warmed) {
        if (WarmUp(batch->spec)) RedecodeStaged(batch->spec, std::vector<bool>(batch->spec.items.size(), true));
        warmed = true;
      }
      const double t0 = NowUnix();
      LaunchBatch(std::move(batch));
      if (profile_enabled_) profile_.launch += static_cast<int64_t>((NowUnix() - t0) * 1e6);
    }
  }
}

bool Pipeline::CompletionWorkLocked() const { return stopping_ || !in_flight_.empty(); }

bool Pipeline::Complete(const std::shared_ptr<InFlight>& batch) {
  absl::Status s;
  const double t0 = NowUnix();
  {
    ActivityScope activity(this, batch->shard->lease, batch->index, "the model's forward pass");
    s = batch->pending->Wait();
  }
  const double t1 = NowUnix();
  if (absl::IsResourceExhausted(s) || absl::IsAborted(s)) {
    batch->pending.reset();
    batch->error = std::string(s.message());
    return false;  // The slot stays with the batch until its retry.
  }
  if (s.ok()) {
    Finish(batch, batch->pending.get(), 0, batch->index.size());
    NoteEarlyBatch(batch->index.size(), 0, "");
    {
      absl::MutexLock lock(&mu_);
      if (clock_after_first_batch_ && clock_start_ == 0) clock_start_ = NowUnix();
    }
    if (profile_enabled_) {
      ++profile_.batches;
      profile_.wait += static_cast<int64_t>((t1 - t0) * 1e6);
      profile_.finish += static_cast<int64_t>((NowUnix() - t1) * 1e6);
    }
  } else {
    Fail(std::string(s.message()), absl::IsFailedPrecondition(s));
  }
  ReleaseSlot(batch->slot);
  return true;
}

bool Pipeline::LaunchesAllowedLocked() const { return stopping_ || !launches_paused_; }

bool Pipeline::Stopped() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Pipeline::CompletionLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &Pipeline::CompletionWorkLocked));
    if (stopping_) return;
    std::shared_ptr<InFlight> batch = in_flight_.front();
    in_flight_.pop_front();
    mu_.Unlock();
    if (!Complete(batch)) {
      // The model raised or ran out of memory: the batch is retried in parts. The batches launched
      // after it are ahead of any retry in the model's queue (the device's stream, the Python
      // stub's requests), so they are finished first, with no new launches meanwhile: each retry's
      // wait, which the watchdog holds against the batch timeout, is then its own, and a batch that
      // hangs is blamed as itself rather than on a retried row queued behind it (its memory is
      // free for the retries too).
      std::vector<std::shared_ptr<InFlight>> retries = {batch};
      {
        absl::MutexLock pause(&mu_);
        launches_paused_ = true;
      }
      while (true) {
        std::shared_ptr<InFlight> next;
        {
          absl::MutexLock drain(&mu_);
          if (stopping_ || in_flight_.empty()) break;
          next = in_flight_.front();
          in_flight_.pop_front();
        }
        if (!Complete(next)) retries.push_back(next);
      }
      for (const std::shared_ptr<InFlight>& r : retries) {
        if (Stopped()) {
          ReleaseSlot(r->slot);
          continue;
        }
        std::string model_error = r->error;
        const size_t failed = RunNow(r, 0, r->index.size(), &model_error);
        NoteEarlyBatch(r->index.size(), failed, model_error);
        ReleaseSlot(r->slot);
      }
      absl::MutexLock resume(&mu_);
      launches_paused_ = false;
    }
    mu_.Lock();
  }
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

void Pipeline::Finish(std::shared_ptr<InFlight> batch, PendingBatch* pending, size_t begin, size_t end) {
  const int k = pending->num_classes();
  int job_classes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (num_classes_ == 0) num_classes_ = k;
    job_classes = num_classes_;
    logit_ties_ += pending->logit_ties();
    if (first_batch_unix_ == 0 && !batch->provisional) {  // Held results: when they are delivered.
      first_batch_unix_ = NowUnix();
      if (profile_enabled_) Log("first batch's results");
    }
  }
  const uint16_t* masks = reinterpret_cast<const uint16_t*>(batch->slot->masks->data());
  std::vector<std::pair<size_t, v1::ImageResult>> ok;  // (item, result) of the rows evaluated.
  for (size_t i = begin; i < end; ++i) {
    const size_t j = i - begin;
    const BatchImage& it = batch->spec.items[i];
    v1::ImageResult r;
    r.set_index(batch->index[i]);
    r.set_height(it.height);
    r.set_width(it.width);
    const uint16_t* mask = masks + it.mask_offset;
    // Results carry the job's one class count: a model whose class count changes with the input
    // fails those rows rather than sending results the coordinator must reject.
    const int64_t nonfinite = pending->nonfinite(static_cast<int>(j));
    std::string error = pending->error(static_cast<int>(j));
    if (!error.empty()) {
      // This image's output broke the model contract (Python models: shape, dtype, a label >= K).
    } else if (k != job_classes) {
      error = absl::StrCat("the model returned ", k, " classes for this input (", it.height, "x", it.width,
                           ") but ", job_classes, " for earlier ones");
    } else if (nonfinite > 0 && !options_.nonfinite_warn) {
      error = absl::StrCat("model output has ", nonfinite,
                           " non-finite values (NaN or infinity); --nonfinite warn evaluates such rows anyway");
    } else if (batch->max_label[i] >= k) {
      error = DescribeLabelOutOfRange(mask, it.height, it.width, k);
      if (error.empty()) error = absl::StrCat("mask label ", batch->max_label[i], " >= number of classes ", k);
    }
    if (!error.empty()) {
      r.set_error(error);
      Deliver(batch->shard, std::move(r), batch->provisional);
      if (surface_) {
        absl::MutexLock lock(&mu_);
        RecycleLocked(std::move(batch->masks[i]));
      }
      continue;
    }
    r.set_nonfinite(nonfinite);
    if (const int64_t* tc = pending->threshold_counts(static_cast<int>(j)); tc != nullptr) {
      for (size_t t = 0; t < options_.num_thresholds; ++t) {
        v1::ThresholdCounts* c = r.add_thresholds();
        c->set_tp(tc[4 * t]);
        c->set_fp(tc[4 * t + 1]);
        c->set_fn(tc[4 * t + 2]);
        c->set_tn(tc[4 * t + 3]);
      }
    }
    r.set_mask_max_label(batch->max_label[i]);
    r.set_mask_ignored_pixels(batch->mask_ignored[i]);
    const int64_t* m = pending->confusion(static_cast<int>(j));
    const double* sv = surface_ ? pending->surface(static_cast<int>(j)) : nullptr;  // From the device.
    int64_t total = 0;
    for (int a = 0; a < k * k; ++a) total += m[a];
    for (int c = 0; c < k; ++c) {
      int64_t row = 0, col = 0;
      for (int o = 0; o < k; ++o) {
        row += m[c * k + o];
        col += m[o * k + c];
      }
      v1::ClassResult* cr = r.add_classes();
      const int64_t tp = m[c * k + c];
      cr->set_tp(tp);
      cr->set_fp(col - tp);
      cr->set_fn(row - tp);
      cr->set_tn(total - row - col + tp);
      cr->set_hd(sv ? sv[4 * c] : kNaN);
      cr->set_hd95(sv ? sv[4 * c + 1] : kNaN);
      cr->set_assd(sv ? sv[4 * c + 2] : kNaN);
      cr->set_nsd(sv ? sv[4 * c + 3] : kNaN);
    }
    if (sv != nullptr) {  // The reference labels were kept for the CPU's surface metrics: not needed.
      absl::MutexLock lock(&mu_);
      RecycleLocked(std::move(batch->masks[i]));
    }
    ok.emplace_back(i, std::move(r));
  }
  // Thumbnails: every row is offered in index order first; only the rows still among the shard's
  // worst once the whole batch is in are rendered (a row pushed out by a later row of the same
  // batch never comes back), so a batch renders at most `thumbnails` rows per class.
  std::vector<std::vector<int>> thumbs(ok.size());
  if (ShardThumbnails* st = batch->shard->thumbnails.get(); st != nullptr) {
    for (size_t n = 0; n < ok.size(); ++n) thumbs[n] = st->Enter(ok[n].second);
    for (size_t n = 0; n < ok.size(); ++n) thumbs[n] = st->StillAmongWorst(ok[n].second, thumbs[n]);
    std::vector<const v1::ImageResult*> rows;
    for (const auto& [i, r] : ok) rows.push_back(&r);
    AmongWorkersWorst(rows, &thumbs);
  }
  for (size_t n = 0; n < ok.size(); ++n) {
    const size_t i = ok[n].first;
    const size_t j = i - begin;
    v1::ImageResult& r = ok[n].second;
    const BatchImage& it = batch->spec.items[i];
    const uint16_t* pred = pending->labels(static_cast<int>(j));
    std::vector<uint16_t> pred_copy;  // The row's labels when they stayed on the device.
    if (!thumbs[n].empty() && pred == nullptr) {
      if (pending->CopyLabels(static_cast<int>(j), static_cast<size_t>(it.height) * it.width, &pred_copy)) {
        pred = pred_copy.data();  // Only for the check below: the task points at its own copy.
      } else {
        thumbs[n].clear();
      }
    }
    const bool cpu_surface = surface_ && batch->masks[i] != nullptr;  // Not scored on the device.
    if (!cpu_surface && !saving_ && thumbs[n].empty()) {
      Deliver(batch->shard, std::move(r), batch->provisional);
      continue;
    }
    // The task owns the reference labels and keeps `batch` (hence the predicted labels) alive; it
    // does not hold the staging buffer, which goes back to the batcher at once: a row that gets a
    // thumbnail takes a copy of its image (and reference) along.
    std::shared_ptr<LabelMap> ref(cpu_surface ? std::move(batch->masks[i]) : nullptr);
    std::vector<uint8_t> rgb;
    std::vector<uint16_t> ref_copy;
    if (!thumbs[n].empty()) {
      const uint8_t* image = batch->slot->images->data() + it.image_offset;
      rgb.assign(image, image + static_cast<size_t>(it.height) * it.width * 3);
      if (!ref) ref_copy.assign(masks + it.mask_offset, masks + it.mask_offset + static_cast<size_t>(it.height) * it.width);
    }
    auto task = [this, batch, pred, ref, k, h = it.height, w = it.width, id = it.row->id(), classes = std::move(thumbs[n]),
                 rgb = std::move(rgb), ref_copy = std::move(ref_copy), pred_copy = std::move(pred_copy),
                 r = std::move(r)]() mutable {
      if (!pred_copy.empty()) pred = pred_copy.data();  // Fetched from the device for the thumbnails.
      if (ref) {  // Surface metrics on the CPU.
        std::vector<SurfaceValues> values;
        ClassSurfaceMetrics(pred, ref->labels.data(), h, w, k, kIgnoredPixel, options_.surface, &values);
        for (int c = 0; c < k; ++c) {
          v1::ClassResult* cr = r.mutable_classes(c);
          cr->set_hd(values[c].hd);
          cr->set_hd95(values[c].hd95);
          cr->set_assd(values[c].assd);
          cr->set_nsd(values[c].nsd);
        }
      }
      if (!classes.empty()) {
        AddThumbnails(batch->shard.get(), rgb.data(), pred, ref ? ref->labels.data() : ref_copy.data(), h, w, classes, &r);
      }
      if (saving_) {
        if (absl::Status s = SavePrediction(options_.save_predictions, id, r.index(), pred, h, w, k); !s.ok()) {
          v1::ImageResult failed;
          failed.set_index(r.index());
          failed.set_error(std::string(s.message()));
          r = std::move(failed);
        }
      }
      Deliver(batch->shard, std::move(r), batch->provisional);
      if (ref) {
        auto recycled = std::make_unique<LabelMap>();
        recycled->labels.swap(ref->labels);  // Keeps the buffer's capacity for the next mask.
        absl::MutexLock lock(&mu_);
        RecycleLocked(std::move(recycled));
      }
    };
    absl::MutexLock lock(&mu_);
    metric_tasks_.push_back(std::move(task));
  }
}

void Pipeline::AmongWorkersWorst(const std::vector<const v1::ImageResult*>& rows,
                                 std::vector<std::vector<int>>* thumbs) {
  absl::MutexLock lock(&worst_mu_);
  for (const v1::ImageResult* r : rows) {
    for (int c = options_.all_foreground ? 0 : 1; c < r->classes_size(); ++c) {
      const double score = RowDice(r->classes(c), options_.empty_score);
      // A row evaluated again (its shard leased again) is already there: offered twice, it would
      // push out another row.
      if (!workers_worst_.Contains(c, score, r->index())) workers_worst_.Offer(c, score, r->index());
    }
  }
  for (size_t n = 0; n < rows.size(); ++n) {
    std::vector<int> kept;
    for (int c : (*thumbs)[n]) {
      if (workers_worst_.Contains(c, RowDice(rows[n]->classes(c), options_.empty_score), rows[n]->index())) {
        kept.push_back(c);
      }
    }
    (*thumbs)[n] = std::move(kept);
  }
}

void Pipeline::AddThumbnails(Shard* shard, const uint8_t* rgb, const uint16_t* pred, const uint16_t* ref, int height,
                             int width, const std::vector<int>& classes, v1::ImageResult* r) {
  for (int c : classes) {
    int slice = 0;
    absl::StatusOr<std::string> jpeg = RenderClassThumbnail(rgb, pred, ref, 1, height, width, c, nullptr, &slice);
    if (profile_enabled_) ++profile_.thumbnails;
    if (!jpeg.ok()) {
      Log("no thumbnail for row ", r->index(), " class ", c, ": ", jpeg.status().message());
    } else if (!shard->thumbnails->Attach(r, c, slice, *std::move(jpeg))) {
      return;  // The shard's budget is spent.
    }
  }
}

}  // namespace tally
