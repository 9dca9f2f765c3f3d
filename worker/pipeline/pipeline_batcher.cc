// Pipeline: the batcher: its next step as one function of the state, index-aligned batches
// launched on the model, the warm-up, and the layout trial run beside the evaluation (provisional
// batches held, then delivered or queued again).
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

void Pipeline::NoteEarlyBatch(size_t rows, size_t failed, const std::string& message) {
  bool give_up = false;
  {
    absl::MutexLock lock(&mu_);
    if (early_batches_ >= 2) return;
    if (++early_batches_ == 1 && warmup_start_unix_ > 0) first_batch_seconds_ = NowUnix() - warmup_start_unix_;
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
  // Aligned to multiples of b of the rows' positions in the job's order (ManifestRow.position; the
  // index where it is not set, as in manifest order): a random-order shard's rows are consecutive positions, scattered
  // indices, and aligned to indices its batches were a row or two (a third of the GPU's rate).
  const auto position = [&](size_t i) {
    const v1::ManifestRow& r = shard.items[i].row;
    return r.has_position() ? r.position() : r.index();
  };
  const int64_t pos0 = position(i0);
  const int64_t block_end = (pos0 / b + 1) * b;
  // A leased shard's rows are consecutive; rows queued again after a layout trial may have gaps
  // (rows that failed to decode were not held), so the block ends at the first position past it.
  size_t i1 = std::min(shard.items.size(), i0 + static_cast<size_t>(block_end - pos0));
  while (i1 > i0 + 1 && position(i1 - 1) >= block_end) --i1;
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
  const std::string choice = LayoutTrialChoice(&trial);
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
  // common/formats/thumbnail.h holds for it).
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

bool Pipeline::SkipLayoutTrial() {
  double first_batch_seconds = -1;
  {
    absl::MutexLock lock(&mu_);
    first_batch_seconds = first_batch_seconds_;
  }
  layout_skip_ = runner_->SkipLayoutTrial(options_.expected_rows, first_batch_seconds);
  if (layout_skip_.empty()) return false;
  Log("layout trial skipped: ", layout_skip_, "; the ", runner_->ChannelsLast() ? "channels-last" : "contiguous",
      " layout stays (--channels-last on|off sets it)");
  return true;
}

std::string Pipeline::LayoutTrialChoice(std::string* trial) {
  if (layout_skip_.empty()) return runner_->FinishLayoutTrial(trial);
  // Skipped: the layout rows ran in stays (the job's, unless another worker's trial says otherwise).
  *trial = absl::StrCat("skipped: ", layout_skip_);
  return runner_->ChannelsLast() ? "on" : "off";
}

void Pipeline::StartLayoutTrial() {
  // After the first batch, whose passes show what the evaluation needs of the device's memory.
  const bool start = !SkipLayoutTrial();
  const bool beside = start && runner_->StartLayoutTrial([this] {
    absl::MutexLock lock(&mu_);
    if (layout_trial_ == LayoutTrial::kRunning) layout_trial_ = LayoutTrial::kReady;
  });
  if (!beside) {
    // Skipped (ResolveLayoutTrial agrees the current layout), or the whole trial on this thread, now.
    absl::MutexLock lock(&mu_);
    layout_trial_ = LayoutTrial::kReady;
  }
}

bool Pipeline::WarmUp(const BatchSpec& spec) {
  const double t0 = NowUnix();
  {
    absl::MutexLock lock(&mu_);
    warmup_start_unix_ = t0;
  }
  bool beside = false;
  if (options_.resolve_layout) {
    const bool prepared = runner_->PrepareLayoutTrial(spec);
    if (prepared && !saving_) {
      // The trial starts after this batch and runs beside the evaluation; results wait for it.
      beside = true;
      absl::MutexLock lock(&mu_);
      layout_trial_ = LayoutTrial::kAfterFirstBatch;
      layout_provisional_ = true;
    } else if (prepared) {  // Saving predictions: the whole trial now, before the first batch.
      SkipLayoutTrial();
      std::string trial;
      const std::string choice = LayoutTrialChoice(&trial);
      if (!AgreeLayout(choice, trial)) return false;
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
  if (options_.memory_budget > 0) MeasureMemory();
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
      StartLayoutTrial();
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
    std::vector<std::vector<Item*>> launches;
    for (const std::vector<Item*>& group : GroupBlock(shard, i0, i1)) {
      for (std::vector<Item*>& launch : SplitByBudget(group)) launches.push_back(std::move(launch));
    }
    for (const std::vector<Item*>& group : launches) {
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

}  // namespace tally
