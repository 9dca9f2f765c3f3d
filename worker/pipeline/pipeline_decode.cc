// Pipeline: the decode threads: images and masks read and decoded on the CPU, or JPEG images on the
// GPU (nvJPEG) in groups, and the --decode auto trial that chooses between them.
#include "worker/pipeline/pipeline.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <thread>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "common/sources/tar_shards.h"
#include "common/job/job_config.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "metrics/connected_components.h"
#include "worker/pipeline/pipeline_internal.h"
#include "metrics/parallel_for.h"
#include "common/sources/row_files.h"
#include "common/formats/dicom.h"
#include "common/formats/jpeg.h"

namespace tally {

namespace {

// Reads an image file as LoadImage does (its errors prefixed "image: "), into a reused buffer.
absl::Status ReadImageBytes(const std::string& path, std::string* bytes, v1::InputDigests* inputs) {
  FileFacts facts;
  absl::Status s = ReadFileBytes(path, bytes, inputs != nullptr ? &facts : nullptr);
  if (s.ok() && inputs != nullptr) {
    inputs->set_image(facts.xxh128);
    inputs->set_modified_ns(std::max(inputs->modified_ns(), facts.mtime_ns));
  }
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

// A benchmark knob: the environment variable's count when it is in 1..max, else `fallback`.
size_t EnvCount(const char* name, long max, size_t fallback) {
  const char* v = std::getenv(name);
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
  return n > 0 && n <= max ? static_cast<size_t>(n) : fallback;
}

// Rows nvJPEG decodes in one call per decode thread: enough to keep the JPEG engines busy, few
// enough that the rows reach the batcher in time (8: 1997 img/s with 4 threads on the H100 against
// 1844-1924 with 16, BENCHMARKS.md).
// TALLY_GPU_DECODE_ROWS overrides it (benchmarks).
size_t GpuDecodeRows() {
  static const size_t rows = EnvCount("TALLY_GPU_DECODE_ROWS", 256, 8);
  return rows;
}

// Decode threads that take rows to nvJPEG; the others (with --decode gpu) only run staging copies
// and metric tasks. More decoders than this gain nothing on one GPU (H100: 4 threads 2000-2062
// img/s, 16 threads 2003) and on several GPUs at once they lose: four workers of 16 nvJPEG threads
// each (64 decode states, their pinned buffers and streams) decoded 235-607 img/s a worker on four
// H200s and took 11.5-12.2 s to their first batch, four workers of 4 threads 2265-2300 img/s and
// 5.5-6.0 s (BENCHMARKS.md). TALLY_GPU_DECODE_THREADS overrides it (benchmarks).
size_t GpuDecodeThreads() {
  static const size_t threads = EnvCount("TALLY_GPU_DECODE_THREADS", 1024, 4);
  return threads;
}

}  // namespace

// Tests: a worker that meets the row with this id crashes (SIGSEGV), as on a file that crashes a
// decoder (TALLY_TEST_CRASH_ID).
static void CrashOnTestRow(const std::string& id) {
  static const std::string crash = std::getenv("TALLY_TEST_CRASH_ID") ? std::getenv("TALLY_TEST_CRASH_ID") : "";
  if (!crash.empty() && id == crash) std::raise(SIGSEGV);
}

void Pipeline::Decode(Item* item) {
  CrashOnTestRow(item->row.id());
  if (!item->row.error().empty()) {
    item->error = item->row.error();
    return;
  }
  thread_local std::string bytes;
  std::unique_ptr<RgbImage> image = TakeImage();
  absl::StatusOr<DecodeOptions> decode = RowOptions(item->row);
  absl::Status s = decode.status();
  if (s.ok()) s = ReadImageBytes(item->row.image_path(), &bytes, &item->inputs);
  if (s.ok()) s = CheckMemory(bytes, DisplayPath(item->row.image_path()), decode->page);
  item->held.reset();
  // A row whose prediction the runner holds (the prediction store) needs no pixels: an image of its
  // size is staged unfilled (FinishRow decodes it again for a thumbnail).
  if (s.ok()) item->held = runner_->FindHeld(item->row, item->inputs.image());
  if (s.ok()) ReadTags(item, bytes);
  // Jobs that measure rows decode a held row's pixels too: its properties are those of a row the
  // model ran on, whatever the store holds.
  if (s.ok() && item->held && !options_.row_properties) {
    image->height = item->held->height;
    image->width = item->held->width;
    image->pixels.resize(static_cast<size_t>(image->height) * image->width * 3);
    item->raw.reset();
  } else if (s.ok()) {
    item->jpeg = LooksLikeJpeg(bytes);
    s = DecodePixels(item, bytes, *decode, image.get());
  }
  if (bytes.capacity() > kKeepBufferBytes) std::string().swap(bytes);
  if (!s.ok()) {
    item->error = std::string(s.message());
    item->image = std::move(image);
    return;
  }
  DecodeMask(item, std::move(image));
  if (options_.row_properties && item->error.empty()) MeasureRow(item);
}

void Pipeline::ReadTags(Item* item, const std::string& bytes) const {
  if (options_.dicom_tags.empty() || DetectImageFormat(bytes) != ImageFormat::kDicom) return;
  std::vector<std::string> values;
  // A file DCMTK cannot read fails its row when decoded, saying why: here it only has no tags.
  if (!DicomTagValues(bytes, DisplayPath(item->row.image_path()), options_.dicom_tags, &values).ok()) return;
  for (std::string& v : values) item->properties.add_tags(std::move(v));
}

void MeasureIntensity(const uint8_t* pixels, size_t n, v1::RowProperties* p) {
  if (n == 0) return;
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += pixels[i];
  p->set_mean_intensity(static_cast<double>(sum) / static_cast<double>(n));
  p->set_has_mean_intensity(true);
}

void Pipeline::MeasureRow(Item* item) const {
  v1::RowProperties* p = &item->properties;
  // JPEG images nvJPEG decodes are measured once it has (DecodeOnGpu), and rows decoded again on
  // the GPU once staged (Stage).
  MeasureIntensity(item->image->pixels.data(), item->image->pixels.size(), p);
  const LabelMap& m = *item->mask;
  for (int64_t c : CountComponentsPerLabel(m.labels.data(), m.depth, m.height, m.width, m.max_label)) {
    p->add_components(c);
  }
}

bool Pipeline::HeldRowPixels(const BatchImage& it, std::vector<uint8_t>* rgb) const {
  std::string bytes;
  v1::InputDigests inputs;
  absl::StatusOr<DecodeOptions> decode = RowOptions(*it.row);
  RgbImage image;
  // The bytes must be those the row was scored by; where the file changed since, no thumbnail.
  if (!decode.ok() || !ReadImageBytes(it.row->image_path(), &bytes, &inputs).ok() || it.image_digest == nullptr ||
      inputs.image() != *it.image_digest ||
      !DecodeImage(bytes, DisplayPath(it.row->image_path()), &image, options_.max_image_pixels, *decode).ok() ||
      image.height != it.height || image.width != it.width) {
    return false;
  }
  *rgb = std::move(image.pixels);
  return true;
}

void Pipeline::NoteUnusedWindow(Item* item, const std::string& bytes, const RgbImage& image) const {
  if (!options_.window.given() || image.windowed) return;
  const ImageFormat format = DetectImageFormat(bytes);
  item->inputs.set_window_unused(format == ImageFormat::kTiff    ? "TIFF of 8 bits or fewer"
                                 : format == ImageFormat::kDicom ? "RGB DICOM"
                                                                 : ImageFormatName(format));
}

absl::Status Pipeline::DecodePixels(Item* item, const std::string& bytes, const DecodeOptions& decode,
                                    RgbImage* image) {
  const std::string name = DisplayPath(item->row.image_path());
  RETURN_IF_ERROR(DecodeImage(bytes, name, image, options_.max_image_pixels, decode));
  NoteUnusedWindow(item, bytes, *image);
  item->raw.reset();
  if (!options_.raw_images) return absl::OkStatus();
  auto raw = std::make_unique<RawImage>();
  absl::StatusOr<bool> has = DecodeRawImage(bytes, name, decode.page, options_.max_image_pixels, raw.get());
  if (!has.ok()) return has.status();
  if (*has) item->raw = std::move(raw);
  return absl::OkStatus();
}

absl::StatusOr<DecodeOptions> Pipeline::RowOptions(const v1::ManifestRow& row) const {
  const int c = options_.page_column;
  return RowDecodeOptions(c >= 0 && c < row.columns_size() ? row.columns(c) : std::string(), options_.window);
}

void Pipeline::DecodeMask(Item* item, std::unique_ptr<RgbImage> image) {
  std::unique_ptr<LabelMap> mask = TakeMask();
  const v1::ManifestRow& row = item->row;
  if (options_.coco != nullptr && (row.has_coco_image() || row.has_coco_ann_ids())) {
    // The reference comes from the annotation file, at the image's size.
    absl::Status s = CocoReferenceLabels(*options_.coco, row, image->height, image->width, mask.get());
    if (s.ok()) PrepareMask(mask.get(), label_lut_, options_.ignore_index);
    if (!s.ok()) item->error = std::string(s.message());
    item->mask = std::move(mask);
    item->image = std::move(image);
    return;
  }
  absl::StatusOr<DecodeOptions> decode = RowOptions(row);  // A mask's page is its image's.
  FileFacts facts;
  absl::Status s = decode.ok()
                       ? LoadMask(item->row.mask_path(), mask.get(), options_.max_image_pixels, decode->page, &facts)
                       : decode.status();
  if (!facts.xxh128.empty()) {
    item->inputs.set_mask(facts.xxh128);
    item->inputs.set_modified_ns(std::max(item->inputs.modified_ns(), facts.mtime_ns));
  }
  if (s.ok()) PrepareMask(mask.get(), label_lut_, options_.ignore_index);
  if (!s.ok()) {
    item->error = std::string(s.message());
  } else if (mask->height != image->height || mask->width != image->width) {
    item->error = absl::StrCat("image '", DisplayPath(item->row.image_path()), "' is ", image->height, "x", image->width,
                               " (height x width) but mask '", DisplayPath(item->row.mask_path()), "' is ", mask->height, "x",
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
    const std::string path = DisplayPath(item->row.image_path());
    status[i] = ReadImageBytes(item->row.image_path(), &bytes[i], &item->inputs);
    if (status[i].ok()) status[i] = CheckMemory(bytes[i], path);
    if (!status[i].ok()) continue;
    item->jpeg = LooksLikeJpeg(bytes[i]);
    if (!item->jpeg || decoder == nullptr) continue;
    int h = 0, w = 0;
    status[i] = InspectJpeg(bytes[i], path, options_.max_image_pixels, &h, &w);
    if (!status[i].ok()) continue;
    RgbImage* image = images[i].get();
    image->height = h;
    image->width = w;
    image->windowed = false;
    NoteUnusedWindow(item, bytes[i], *image);
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
      ReadTags(item, bytes[i]);
      absl::StatusOr<DecodeOptions> decode = RowOptions(item->row);
      status[i] = decode.ok() ? DecodePixels(item, bytes[i], *decode, images[i].get()) : decode.status();
    }
    if (!status[i].ok()) {
      item->error = std::string(status[i].message());
      item->image = std::move(images[i]);
      continue;
    }
    DecodeMask(item, std::move(images[i]));  // The pixels' buffer stays where the decoder writes.
    if (options_.row_properties && item->error.empty()) MeasureRow(item);  // A JPEG's intensity: FinishGpuItems.
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
  FinishGpuItems(jobs, jpeg_items);
  for (std::string& b : bytes) {
    if (b.capacity() > kKeepBufferBytes) std::string().swap(b);
  }
}

void Pipeline::FinishGpuItems(const std::vector<GpuJpegImage>& jobs, const std::vector<Item*>& items) const {
  for (size_t k = 0; k < jobs.size(); ++k) {
    Item* item = items[k];
    if (!jobs[k].status.ok()) {
      if (item->error.empty()) item->error = std::string(jobs[k].status.message());
      continue;
    }
    item->gpu_pixels = true;
    // Its intensity is of nvJPEG's pixels, decoded now.
    if (options_.row_properties && item->error.empty()) {
      MeasureIntensity(item->image->pixels.data(), item->image->pixels.size(), &item->properties);
    }
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
    // The file was decoded moments ago. Read again, its bytes must be the ones digested then; where
    // the file changed meanwhile (or cannot be read), the CPU's pixels of the bytes digested stay.
    v1::InputDigests again;
    if (!ReadImageBytes(b.row->image_path(), &bytes[i], &again).ok() || !LooksLikeJpeg(bytes[i]) ||
        (b.image_digest != nullptr && again.image() != *b.image_digest)) {
      continue;
    }
    GpuJpegImage job;
    job.bytes = &bytes[i];
    job.name = DisplayPath(b.row->image_path());
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

bool Pipeline::TaskWorkLocked() const { return stopping_ || !copy_tasks_.empty() || !metric_tasks_.empty(); }

bool Pipeline::DecodeWorkLocked() const {
  if (TaskWorkLocked()) return true;
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
    // With nvJPEG, only the first GpuDecodeThreads() threads decode; the rest run tasks.
    const bool tasks_only = gpu_decode_ && slot >= GpuDecodeThreads();
    mu_.Await(absl::Condition(this, tasks_only ? &Pipeline::TaskWorkLocked : &Pipeline::DecodeWorkLocked));
    if (stopping_) return;
    if (gpu_decode_ && slot >= GpuDecodeThreads() && !TaskWorkLocked()) continue;  // Turned GPU meanwhile.
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
    const int cores = UsableCores();
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
  for (int i = 0; i < std::min(threads, static_cast<int>(GpuDecodeThreads())); ++i) {
    starts.emplace_back([this, i] { GpuDecoder(i); });
  }
  for (std::thread& t : starts) t.join();
  absl::MutexLock lock(&mu_);
  gpu_decode_ = true;
  return true;
}

}  // namespace tally
