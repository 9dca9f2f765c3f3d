// Internal to the pipeline (worker/pipeline/pipeline*.cc): the types its stages share that pipeline.h only
// declares. Not for other code.
#ifndef TALLY_WORKER_PIPELINE_PIPELINE_INTERNAL_H_
#define TALLY_WORKER_PIPELINE_PIPELINE_INTERNAL_H_

#include <pthread.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "worker/pipeline/pipeline.h"

namespace tally {

// Names the calling thread (at most 15 characters are kept): what per-thread CPU figures show.
inline void NameThisThread(const std::string& name) { pthread_setname_np(pthread_self(), name.substr(0, 15).c_str()); }

// A row's mean 8-bit value over `n` interleaved channel values (RowProperties.mean_intensity).
void MeasureIntensity(const uint8_t* pixels, size_t n, v1::RowProperties* p);

inline bool AllCopied(std::atomic<int>* remaining) { return remaining->load() == 0; }

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

}  // namespace tally

#endif  // TALLY_WORKER_PIPELINE_PIPELINE_INTERNAL_H_
