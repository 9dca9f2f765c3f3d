// Pipeline: completion: a launched batch's results read back, split-and-retry of failed batches,
// per-image results with their metrics (surface distances, thresholds), saved predictions and the
// report thumbnails of the rows among the worst.
#include "worker/pipeline/pipeline.h"
#include "worker/scoring/lesion_scoring.h"

#include "base/status_macros.h"

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
#include "metrics/calibration.h"
#include "metrics/calibration_fine.h"
#include "metrics/label_counts.h"
#include "common/formats/png.h"
namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

int Pipeline::NoteBatchClasses(const InFlight& batch, PendingBatch* pending) {
  absl::MutexLock lock(&mu_);
  if (num_classes_ == 0) num_classes_ = pending->num_classes();
  logit_ties_ += pending->logit_ties();
  if (first_batch_unix_ == 0 && !batch.provisional) {  // Held results: when they are delivered.
    first_batch_unix_ = NowUnix();
    if (profile_enabled_) Log("first batch's results");
  }
  return num_classes_;
}

std::string Pipeline::RowError(const InFlight& batch, PendingBatch* pending, size_t i, size_t j, int job_classes) const {
  const int k = pending->num_classes();
  const BatchImage& it = batch.spec.items[i];
  const uint16_t* mask = reinterpret_cast<const uint16_t*>(batch.slot->masks->data()) + it.mask_offset;
  // Results carry the job's one class count: a model whose class count changes with the input
  // fails those rows rather than sending results the coordinator must reject.
  const int64_t nonfinite = pending->nonfinite(static_cast<int>(j));
  std::string error = pending->error(static_cast<int>(j));
  if (!error.empty()) {
    // This image's output broke the model contract (Python models: shape, dtype, a label >= K).
  } else if (k != job_classes) {
    error = absl::StrCat("the model returned ", k, " classes for this input (", it.height, "x", it.width, ") but ",
                         job_classes, " for earlier ones");
  } else if (nonfinite > 0 && !options_.nonfinite_warn) {
    error = absl::StrCat("model output has ", nonfinite,
                         " non-finite values (NaN or infinity); --nonfinite warn evaluates such rows anyway");
  } else if (batch.max_label[i] >= k) {
    error = DescribeLabelOutOfRange(mask, it.height, it.width, k);
    if (error.empty()) error = absl::StrCat("mask label ", batch.max_label[i], " >= number of classes ", k);
  }
  return error;
}

absl::Status Pipeline::EvaluateInstances(const InFlight& batch, size_t i, const std::vector<CocoInstance>* detections,
                                         v1::ImageResult* r) const {
  const v1::ManifestRow& row = *batch.spec.items[i].row;
  if (options_.coco == nullptr || !row.has_coco_image()) return absl::OkStatus();
  if (detections == nullptr) {
    return absl::InvalidArgumentError(
        "the model returned no detections: a COCO instance job needs a dict with masks, scores and labels per image");
  }
  CocoImageInstances image;
  RETURN_IF_ERROR(options_.coco->Instances(row.coco_image_id(), &image));
  image.detections = *detections;
  r->set_coco_image_id(image.image_id);
  EvaluateCocoInstances(image, r->mutable_instances());
  // The rows of lowest instance F1 get a picture of their matching (common/coco/coco_instances.h).
  ShardThumbnails* st = batch.shard->thumbnails.get();
  if (st != nullptr && st->EnterScore(kInstanceThumbnailClass, RowInstanceF1(*r), r->index())) {
    const uint8_t* rgb = batch.slot->images->data() + batch.spec.items[i].image_offset;
    absl::StatusOr<std::string> jpeg = RenderInstanceThumbnail(image, rgb);
    if (jpeg.ok()) st->Attach(r, kInstanceThumbnailClass, 0, *std::move(jpeg));
  }
  return absl::OkStatus();
}

void Pipeline::FillCounts(const InFlight& batch, PendingBatch* pending, size_t i, size_t j, v1::ImageResult* r) const {
  const int k = pending->num_classes();
  if (const int64_t* tc = pending->threshold_counts(static_cast<int>(j)); tc != nullptr) {
    for (size_t t = 0; t < options_.num_thresholds; ++t) {
      v1::ThresholdCounts* c = r->add_thresholds();
      c->set_tp(tc[4 * t]);
      c->set_fp(tc[4 * t + 1]);
      c->set_fn(tc[4 * t + 2]);
      c->set_tn(tc[4 * t + 3]);
    }
  }
  r->set_mask_max_label(batch.max_label[i]);
  r->set_mask_ignored_pixels(batch.mask_ignored[i]);
  if (const int64_t* cv = pending->calibration(static_cast<int>(j)); cv != nullptr && options_.calibration) {
    r->mutable_calibration()->Add(cv, cv + CalibrationRowSize(k));
    r->set_calibration_batch(batch.index[i - j]);  // The model batch, by its first row.
  }
  std::vector<ConfusionCounts> counts;
  ClassCountsFromMatrix(pending->confusion(static_cast<int>(j)), k, &counts);
  const double* sv = surface_ ? pending->surface(static_cast<int>(j)) : nullptr;  // From the device.
  for (int c = 0; c < k; ++c) {
    v1::ClassResult* cr = r->add_classes();
    cr->set_tp(counts[c].tp);
    cr->set_fp(counts[c].fp);
    cr->set_fn(counts[c].fn);
    cr->set_tn(counts[c].tn);
    cr->set_hd(sv ? sv[4 * c] : kNaN);
    cr->set_hd95(sv ? sv[4 * c + 1] : kNaN);
    cr->set_assd(sv ? sv[4 * c + 2] : kNaN);
    cr->set_nsd(sv ? sv[4 * c + 3] : kNaN);
  }
}

std::vector<std::vector<int>> Pipeline::ThumbnailClasses(const InFlight& batch,
                                                         const std::vector<std::pair<size_t, v1::ImageResult>>& ok) {
  // Every row is offered in index order first; only the rows still among the shard's worst once the
  // whole batch is in are rendered (a row pushed out by a later row of the same batch never comes
  // back), so a batch renders at most `thumbnails` rows per class.
  std::vector<std::vector<int>> thumbs(ok.size());
  // Instance rows got theirs (EvaluateInstances): their classes get none.
  if (ShardThumbnails* st = batch.shard->thumbnails.get(); st != nullptr && !options_.instance_job) {
    for (size_t n = 0; n < ok.size(); ++n) thumbs[n] = st->Enter(ok[n].second);
    for (size_t n = 0; n < ok.size(); ++n) thumbs[n] = st->StillAmongWorst(ok[n].second, thumbs[n]);
    std::vector<const v1::ImageResult*> rows;
    for (const auto& [i, r] : ok) rows.push_back(&r);
    AmongWorkersWorst(rows, &thumbs);
  }
  return thumbs;
}

void Pipeline::FinishRow(const std::shared_ptr<InFlight>& batch, PendingBatch* pending, size_t i, size_t j,
                         std::vector<int> thumbs, v1::ImageResult r) {
  const int k = pending->num_classes();
  const BatchImage& it = batch->spec.items[i];
  const uint16_t* masks = reinterpret_cast<const uint16_t*>(batch->slot->masks->data());
  const uint16_t* pred = pending->labels(static_cast<int>(j));
  std::vector<uint16_t> pred_copy;  // The row's labels when they stayed on the device.
  if (!thumbs.empty() && pred == nullptr) {
    if (pending->CopyLabels(static_cast<int>(j), static_cast<size_t>(it.height) * it.width, &pred_copy)) {
      pred = pred_copy.data();  // Only for the check below: the task points at its own copy.
    } else {
      thumbs.clear();
    }
  }
  std::vector<uint8_t> rgb;
  // A row scored from a held prediction was never decoded: its thumbnail decodes it now.
  if (!thumbs.empty() && it.held != nullptr && !HeldRowPixels(it, &rgb)) thumbs.clear();
  const bool cpu_surface = surface_ && batch->masks[i] != nullptr;  // Not scored on the device.
  if (!cpu_surface && !saving_ && thumbs.empty()) {
    Deliver(batch->shard, std::move(r), batch->provisional);
    return;
  }
  // The task owns the reference labels and keeps `batch` (hence the predicted labels) alive; it
  // does not hold the staging buffer, which goes back to the batcher at once: a row that gets a
  // thumbnail takes a copy of its image (and reference) along.
  std::shared_ptr<LabelMap> ref(cpu_surface ? std::move(batch->masks[i]) : nullptr);
  std::vector<uint16_t> ref_copy;
  if (!thumbs.empty()) {
    const uint8_t* image = batch->slot->images->data() + it.image_offset;
    if (it.held == nullptr) rgb.assign(image, image + static_cast<size_t>(it.height) * it.width * 3);
    if (!ref) ref_copy.assign(masks + it.mask_offset, masks + it.mask_offset + static_cast<size_t>(it.height) * it.width);
  }
  auto task = [this, batch, pred, ref, k, h = it.height, w = it.width, id = it.row->id(), classes = std::move(thumbs),
               rgb = std::move(rgb), ref_copy = std::move(ref_copy), pred_copy = std::move(pred_copy),
               r = std::move(r)]() mutable {
    if (!pred_copy.empty()) pred = pred_copy.data();  // Fetched from the device for the thumbnails.
    RowTask(*batch, pred, ref.get(), ref_copy, k, h, w, id, classes, rgb, &r);
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

void Pipeline::RowTask(const InFlight& batch, const uint16_t* pred, const LabelMap* ref,
                       const std::vector<uint16_t>& ref_copy, int k, int h, int w, const std::string& id,
                       const std::vector<int>& classes, const std::vector<uint8_t>& rgb, v1::ImageResult* r) {
  if (ref != nullptr && AnySurfaceMetric(options_.metrics)) {  // Surface metrics on the CPU.
    std::vector<SurfaceValues> values;
    ClassSurfaceMetrics(pred, ref->labels.data(), h, w, k, kIgnoredPixel, options_.surface, &values);
    for (int c = 0; c < k; ++c) {
      v1::ClassResult* cr = r->mutable_classes(c);
      cr->set_hd(values[c].hd);
      cr->set_hd95(values[c].hd95);
      cr->set_assd(values[c].assd);
      cr->set_nsd(values[c].nsd);
    }
  }
  if (ref != nullptr && AnyLesionMetric(options_.metrics)) {
    const absl::Status s = ScoreLesions(pred, ref->labels.data(), 1, h, w, {}, options_.all_foreground, options_.lesion, r);
    if (!s.ok()) {
      v1::ImageResult failed;
      failed.set_index(r->index());
      failed.set_error(std::string(s.message()));
      *r = std::move(failed);
      return;
    }
  }
  if (!classes.empty()) {
    AddThumbnails(batch.shard.get(), rgb.data(), pred, ref ? ref->labels.data() : ref_copy.data(), h, w, classes, r);
  }
  if (saving_) {
    if (absl::Status s = SavePrediction(options_.save_predictions, id, r->index(), pred, h, w, k); !s.ok()) {
      v1::ImageResult failed;
      failed.set_index(r->index());
      failed.set_error(std::string(s.message()));
      *r = std::move(failed);
    }
  }
}

void Pipeline::Finish(std::shared_ptr<InFlight> batch, PendingBatch* pending, size_t begin, size_t end) {
  const int job_classes = NoteBatchClasses(*batch, pending);
  std::vector<std::pair<size_t, v1::ImageResult>> ok;  // (item, result) of the rows evaluated.
  for (size_t i = begin; i < end; ++i) {
    const size_t j = i - begin;
    const BatchImage& it = batch->spec.items[i];
    v1::ImageResult r;
    r.set_index(batch->index[i]);
    r.set_height(it.height);
    r.set_width(it.width);
    const std::string error = RowError(*batch, pending, i, j, job_classes);
    const bool surface_on_device = surface_ && pending->surface(static_cast<int>(j)) != nullptr;
    if (!error.empty() || surface_on_device) {
      // The reference labels were kept for the CPU's surface metrics: not needed.
      absl::MutexLock lock(&mu_);
      if (surface_) RecycleLocked(std::move(batch->masks[i]));
    }
    if (!error.empty()) {
      r.set_error(error);
      Deliver(batch->shard, std::move(r), batch->provisional);
      continue;
    }
    r.set_nonfinite(pending->nonfinite(static_cast<int>(j)));
    r.set_from_store(pending->from_store(static_cast<int>(j)));
    FillCounts(*batch, pending, i, j, &r);
    if (absl::Status s = EvaluateInstances(*batch, i, pending->instances(static_cast<int>(j)), &r); !s.ok()) {
      v1::ImageResult failed;
      failed.set_index(r.index());
      failed.set_error(std::string(s.message()));
      Deliver(batch->shard, std::move(failed), batch->provisional);
      continue;
    }
    ok.emplace_back(i, std::move(r));
  }
  if (options_.calibration && !ok.empty()) {
    AttachCalibrationFine(*batch, pending, begin, end, &ok[0].second);
  }
  std::vector<std::vector<int>> thumbs = ThumbnailClasses(*batch, ok);
  for (size_t n = 0; n < ok.size(); ++n) {
    FinishRow(batch, pending, ok[n].first, ok[n].first - begin, std::move(thumbs[n]), std::move(ok[n].second));
  }
}

// The batch's fine histogram, sparse, on its first evaluated row, covering every row launched with it
// (failed ones too: their pixels are in it, so tallyd counts it only with all of them evaluated).
void Pipeline::AttachCalibrationFine(const InFlight& batch, PendingBatch* pending, size_t begin, size_t end,
                                     v1::ImageResult* r) const {
  const int64_t* fine = pending->calibration_fine();
  if (fine == nullptr) return;
  v1::CalibrationFine* f = r->mutable_calibration_fine();
  for (size_t i = begin; i < end; ++i) f->add_covers(batch.index[i]);
  SetSparseFine(fine, pending->num_classes(), f);
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
