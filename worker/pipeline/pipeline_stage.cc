// Pipeline: staging: decoded rows copied into a slot's pinned buffers (a queue of copies served
// before any other work), batch sizes chosen and index-aligned groups staged, slots given back.
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
    spec->decoded_on_gpu = gpu_decode_;
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
    b.image_digest = &it->inputs.image();
    b.held = it->held.get();
    b.raw = it->raw.get();
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
  if (any_redo) {
    RedecodeStaged(batch->spec, redo);
    // Their intensity is the staged pixels' (the decoder every row of the job comes from).
    for (size_t i = 0; options_.row_properties && i < group.size(); ++i) {
      const BatchImage& b = batch->spec.items[i];
      if (redo[i]) MeasureIntensity(slot->images->data() + b.image_offset, static_cast<size_t>(b.height) * b.width * 3,
                                    &group[i]->properties);
    }
  }
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

}  // namespace tally
