// Worker: results out: rows buffered per lease and sent every 0.5 s and when a shard is done,
// job errors, timeouts, and the heartbeat that renews leases and carries the gauges.
#include "worker/worker.h"

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "common/security/data_roots.h"
#include "metrics/calibration.h"
#include "metrics/calibration_fine.h"
#include "common/job/job_config.h"
#include "base/backoff.h"
#include "base/log.h"
#include "common/sources/tar_members.h"
#include "metrics/overlap.h"
#include "metrics/parallel_for.h"
#include "common/job/rpc.h"
#include "common/process/sd_notify.h"
#include "base/status_macros.h"
#include "common/process/subprocess.h"
#include "worker/python/python_runner.h"
#include "worker/scoring/scoring.h"
#include "worker/worker_internal.h"

namespace tally {
namespace {

constexpr double kFlushSeconds = 0.5;

// Test hook: a straggler (speculation's tests and benchmark): every row's result waits this long
// before it is sent.
long TestThrottleMs() {
  static const long throttle_ms = [] {
    const char* v = std::getenv("TALLY_TEST_THROTTLE_MS");
    return v != nullptr ? std::max(0L, std::strtol(v, nullptr, 10)) : 0L;
  }();
  return throttle_ms;
}

// How many leases' results go out at once. With one call at a time, a fast evaluator (COCO
// detections on 16 cores: 5000 rows in about a second) waited on tallyd's handling of each call in
// turn. TALLY_REPORT_STREAMS=N (benchmarks): another number; 1 while the test throttle slows every
// send (the tests' stragglers must stay that slow).
int ReportStreams() {
  static const int streams = [] {
    if (TestThrottleMs() > 0) return 1;
    const char* v = std::getenv("TALLY_REPORT_STREAMS");
    int n = 0;
    return v != nullptr && absl::SimpleAtoi(v, &n) && n > 0 ? std::min(n, 64) : 4;
  }();
  return streams;
}

// The class count of a job as these results show it (0 when every row failed).
int32_t ClassesOf(const std::vector<v1::ImageResult>& results) {
  for (const v1::ImageResult& r : results) {
    if (r.error().empty()) return r.classes_size();
  }
  return 0;
}

// Room in a ReportResults message for its own fields besides the results.
constexpr size_t kRequestHeadroom = size_t{1} << 20;
constexpr size_t kResultsPerMessage = static_cast<size_t>(kMaxMessageBytes) - kRequestHeadroom;

// A row whose result alone would not fit one message fails with the reason (it would otherwise be
// refused by gRPC and retried for ever): "results of 75.8 MB exceed the 64 MiB message limit: ...".
void FailOversizeResults(std::vector<v1::ImageResult>* results) {
  for (v1::ImageResult& r : *results) {
    const size_t bytes = r.ByteSizeLong();
    if (bytes <= kResultsPerMessage) continue;
    std::string what = "the row's per-class results";
    if (r.lesions_size() > 0) {
      what = absl::StrCat(r.lesions_size(), " lesions (raise --lesion-min-volume or --lesion-dilation, or leave out "
                          "--metrics lesion)");
    } else if (r.instances_size() > 0) {
      what = absl::StrCat("the records of ", r.instances_size(), " categories");
    }
    v1::ImageResult failed;
    failed.set_index(r.index());
    failed.set_error(absl::StrFormat("results of %.1f MB exceed the %d MiB message limit: %s", bytes / 1e6,
                                     kMaxMessageBytes >> 20, what));
    r = std::move(failed);
  }
}

// Consecutive runs of `results` that each fit one message (a run holds at least one row): the end
// of each.
std::vector<size_t> MessageEnds(const std::vector<v1::ImageResult>& results) {
  std::vector<size_t> ends;
  size_t bytes = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const size_t b = results[i].ByteSizeLong() + 8;  // The field's tag and length.
    if (i > 0 && bytes + b > kResultsPerMessage) {
      ends.push_back(i);
      bytes = 0;
    }
    bytes += b;
  }
  ends.push_back(results.size());
  return ends;
}

// The fine histograms of the whole batches among `rows` (every covered row here and evaluated) as
// one, on the first such head, covering them all, their rows relabelled to its batch: a report
// carries one histogram, not one a model batch (tallyd's storage and checks are per histogram).
// Batches with a failed row stay apart (tallyd refuses their rows alone, not the whole report's).
void MergeWholeBatches(std::vector<v1::ImageResult>* rows) {
  absl::flat_hash_map<int64_t, const v1::ImageResult*> by_index;
  for (const v1::ImageResult& r : *rows) by_index[r.index()] = &r;
  v1::ImageResult* first = nullptr;
  absl::flat_hash_set<int64_t> merged;
  std::vector<int64_t> dense, covers;
  for (v1::ImageResult& r : *rows) {
    if (!r.has_calibration_fine() || r.calibration_size() == 0) continue;
    const v1::CalibrationFine& f = r.calibration_fine();
    const bool whole = std::all_of(f.covers().begin(), f.covers().end(), [&](int64_t i) {
      auto it = by_index.find(i);
      return it != by_index.end() && it->second->error().empty() &&
             it->second->calibration_batch() == r.calibration_batch();
    });
    if (!whole || (first != nullptr && f.classes() != first->calibration_fine().classes()) ||
        covers.size() + f.covers_size() > static_cast<size_t>(kMaxCalibrationCovers)) {
      continue;
    }
    merged.insert(r.calibration_batch());
    AddSparseFine(f, &dense);
    covers.insert(covers.end(), f.covers().begin(), f.covers().end());
    if (first == nullptr) {
      first = &r;
    } else {
      r.clear_calibration_fine();
    }
  }
  if (merged.size() < 2) return;
  const int64_t batch = first->calibration_batch();
  const int classes = first->calibration_fine().classes();
  first->clear_calibration_fine();
  v1::CalibrationFine* f = first->mutable_calibration_fine();
  f->mutable_covers()->Add(covers.begin(), covers.end());
  SetSparseFine(dense.data(), classes, f);
  for (v1::ImageResult& r : *rows) {
    if (r.calibration_size() > 0 && merged.contains(r.calibration_batch())) r.set_calibration_batch(batch);
  }
}

// The rows of `pending` that can go now: all of a complete shard's; else every row but those of a
// calibration batch not all here yet (its fine histogram counts only with all its rows, in one
// message: tallyd refuses the rest, to have them evaluated again). The others stay in `pending`.
std::vector<v1::ImageResult> TakeSendable(std::vector<v1::ImageResult>* pending, bool complete) {
  std::vector<v1::ImageResult> out;
  bool calibration = false;
  for (const v1::ImageResult& r : *pending) calibration |= r.calibration_size() > 0;
  if (complete || !calibration) {
    out.swap(*pending);
    if (calibration) MergeWholeBatches(&out);
    return out;
  }
  absl::flat_hash_set<int64_t> present;
  absl::flat_hash_map<int64_t, const v1::CalibrationFine*> heads;  // By batch.
  for (const v1::ImageResult& r : *pending) {
    present.insert(r.index());
    if (r.has_calibration_fine()) heads[r.calibration_batch()] = &r.calibration_fine();
  }
  absl::flat_hash_set<int64_t> ready;
  for (const auto& [batch, fine] : heads) {
    if (std::all_of(fine->covers().begin(), fine->covers().end(), [&](int64_t i) { return present.contains(i); })) {
      ready.insert(batch);
    }
  }
  std::vector<v1::ImageResult> keep;
  for (v1::ImageResult& r : *pending) {
    const bool held = r.calibration_size() > 0 && !ready.contains(r.calibration_batch());
    (held ? keep : out).push_back(std::move(r));
  }
  pending->swap(keep);
  MergeWholeBatches(&out);
  return out;
}

}  // namespace

// A reporter's or heartbeat's call, listed for its length so that ~Worker can cancel it; one that
// starts after that is cancelled at once.
class Worker::CallInFlight {
 public:
  CallInFlight(Worker* worker, grpc::ClientContext* ctx) : worker_(worker), ctx_(ctx) {
    absl::MutexLock lock(&worker_->mu_);
    if (worker_->done_) ctx_->TryCancel();
    worker_->calls_.insert(ctx_);
  }
  ~CallInFlight() {
    absl::MutexLock lock(&worker_->mu_);
    worker_->calls_.erase(ctx_);
  }
  CallInFlight(const CallInFlight&) = delete;
  CallInFlight& operator=(const CallInFlight&) = delete;

 private:
  Worker* const worker_;
  grpc::ClientContext* const ctx_;
};

void Worker::OnResult(const LeaseKey& lease, v1::ImageResult result) {
  absl::MutexLock lock(&mu_);
  ++images_total_;
  auto it = leases_.find(lease.lease_id);
  if (it == leases_.end()) return;  // Revoked meanwhile.
  it->second.pending.push_back(std::move(result));
  ++it->second.delivered;
  // The leasing loop waits for room in the backlog; the reporter for complete shards.
  wake_leaser_ = true;
  if (it->second.delivered >= it->second.expected) wake_reporter_ = true;
}

void Worker::OnFatal(const JobError& error) {
  std::vector<LeaseKey> drop;
  {
    absl::MutexLock lock(&mu_);
    failed_jobs_[error.job_id] = error.message;
    job_errors_.push_back(error);
    if (error.worker_local) out_of_service_ = error.message;
    for (auto& [id, lb] : leases_) {
      if (error.worker_local || lb.key.job_id == error.job_id) drop.push_back(lb.key);
    }
  }
  // Results already produced are still sent; the rows not yet evaluated go back to the coordinator
  // (it also takes them back when it hears of the error).
  absl::MutexLock lock(&mu_);
  for (const LeaseKey& key : drop) {
    if (evaluator_) evaluator_->pipeline->Drop(key.lease_id);
  }
  wake_leaser_ = wake_reporter_ = true;
}

void Worker::OnTimeout(const LeaseKey& lease, const std::vector<int64_t>& indices, const std::string& what,
                       double seconds) {
  const std::string message = absl::StrFormat("timed out after %.0f s (%s; --batch-timeout)", seconds, what);
  StopLeasing();  // The flush below answers tallyd's waiting for this worker: no new lease then.
  if (indices.size() == 1) {
    v1::ImageResult r;
    r.set_index(indices[0]);
    r.set_error(message);
    OnResult(lease, std::move(r));
  }
  Flush(10);
  // A batch: nobody knows which row hangs, so its rows are retried one by one (by a fresh process).
  if (indices.size() > 1) Release(lease, message, true);
  // The other shards in hand (prefetched, or queued behind the hanging batch) did not hang: given
  // back unbegun, whole and with no attempt counted, rather than lost with this process (which
  // would count a loss against their rows and try them as suspects).
  std::vector<LeaseKey> others;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, lb] : leases_) {
      if (id != lease.lease_id) others.push_back(lb.key);
    }
  }
  for (const LeaseKey& key : others) Release(key, absl::StrCat("the worker restarts (", message, ")"), false, false);
  Log(message, "; restarting (exit code ", kExitRestart, ")");
  std::_Exit(kExitRestart);  // The stuck thread cannot be stopped; the supervisor restarts us.
}

void Worker::Flush(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      bool pending = !job_errors_.empty() || reporter_sending_;
      for (const auto& [id, lb] : leases_) pending |= !lb.pending.empty() || lb.delivered >= lb.expected;
      if (!pending) return;
      wake_reporter_ = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Worker::TrimMemoryWhenIdle() {
  RowEvaluator* pipeline = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (trimmed_ || !leases_.empty() || (evaluator_ && evaluator_->pipeline->Backlog() > 0)) return;
    trimmed_ = true;
    if (evaluator_) pipeline = evaluator_->pipeline.get();  // Replaced only by this thread.
  }
  if (pipeline) pipeline->ReleaseIdleBuffers();
  CloseShards();  // Idle: no tar shard stays open, and no scratch copy holds the disk.
  malloc_trim(0);
}

void Worker::DropLease(int64_t lease_id) {
  absl::MutexLock lock(&mu_);
  leases_.erase(lease_id);
  if (evaluator_) evaluator_->pipeline->Drop(lease_id);
}

bool Worker::Send(const LeaseKey& key, std::vector<v1::ImageResult>* results, bool complete) {
  if (const long throttle_ms = TestThrottleMs(); throttle_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(throttle_ms * static_cast<long>(results->size())));
  }
  // Test hook: a faulty GPU (the canary's tests): one pixel of class 1 per row counted as missed.
  static const bool faulty = std::getenv("TALLY_TEST_FAULTY") != nullptr;
  for (v1::ImageResult& r : *results) {
    if (!faulty || r.classes_size() < 2 || r.classes(1).tp() == 0) continue;
    r.mutable_classes(1)->set_tp(r.classes(1).tp() - 1);
    r.mutable_classes(1)->set_fn(r.classes(1).fn() + 1);
  }
  FailOversizeResults(results);
  // Several messages where one would pass the limit; the shard is complete with the last.
  const std::vector<size_t> ends = MessageEnds(*results);
  size_t begin = 0;
  for (size_t m = 0; m < ends.size(); ++m) {
    std::vector<v1::ImageResult> part(std::make_move_iterator(results->begin() + begin),
                                      std::make_move_iterator(results->begin() + ends[m]));
    const SendOutcome outcome = SendMessage(key, &part, complete && m + 1 == ends.size());
    if (outcome == SendOutcome::kRetry) {
      // Keep the rows not yet taken and try again: they are not lost while this process lives.
      std::vector<v1::ImageResult> rest = std::move(part);
      for (size_t i = ends[m]; i < results->size(); ++i) rest.push_back(std::move((*results)[i]));
      *results = std::move(rest);
      return false;
    }
    if (outcome == SendOutcome::kLeaseGone) break;
    begin = ends[m];
  }
  results->clear();
  return true;
}

Worker::SendOutcome Worker::SendMessage(const LeaseKey& key, std::vector<v1::ImageResult>* results, bool complete) {
  v1::ReportResultsRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
    if (evaluator_ && evaluator_->job_id == key.job_id) *request.mutable_stats() = evaluator_->pipeline->Stats();
  }
  // The class count of the job these results belong to, whatever model this worker runs now.
  request.set_num_classes(ClassesOf(*results));
  request.set_job_id(key.job_id);
  request.set_shard_id(key.shard_id);
  request.set_lease_id(key.lease_id);
  request.set_shard_complete(complete);
  for (v1::ImageResult& r : *results) *request.add_results() = std::move(r);
  v1::ReportResultsResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(60));
  grpc::Status s;
  {
    CallInFlight listed(this, &ctx);
    s = stub_->ReportResults(&ctx, request, &response);
  }
  if (s.ok()) {
    if (response.abandon()) DropLease(key.lease_id);
    return SendOutcome::kSent;
  }
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    Log("the coordinator no longer knows this worker (", s.error_message(), "); dropping shard ", key.shard_id);
    absl::MutexLock lock(&mu_);
    need_register_ = true;
    return SendOutcome::kLeaseGone;  // Nothing to retry: the lease is gone with the coordinator's memory of us.
  }
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    // The coordinator ended the lease when it rejected the results; say so explicitly too, so the
    // shard cannot stay orphaned whichever side saw what.
    Log("the coordinator rejected results for shard ", key.shard_id, " of job ", key.job_id, ": ", s.error_message());
    Release(key, absl::StrCat("results rejected: ", s.error_message()), false);
    return SendOutcome::kLeaseGone;
  }
  results->clear();
  for (v1::ImageResult& r : *request.mutable_results()) results->push_back(std::move(r));
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    done = done_;
  }
  if (done) {
    // The flush is over and the process ends: the coordinator takes the lease back when it expires
    // and has the rows evaluated again.
    Log("left unsent at exit: ", results->size(), " results of shard ", key.shard_id, " of job ", key.job_id,
        " (the coordinator did not take them: ", s.error_message(), "); their lease expires and they are redone");
    return SendOutcome::kRetry;
  }
  Log("sending results to ", options_.coordinator, " failed (", s.error_message(), "); will retry");
  return SendOutcome::kRetry;
}

bool Worker::SendJobError(const JobError& error) {
  v1::ReportJobErrorRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  request.set_job_id(error.job_id);
  request.set_message(error.message);
  request.set_definitive(error.definitive);
  request.set_worker_local(error.worker_local);
  request.set_model_mismatch(error.model_mismatch);
  v1::ReportJobErrorResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10));
  CallInFlight listed(this, &ctx);
  grpc::Status s = stub_->ReportJobError(&ctx, request, &response);
  return s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND;
}

void Worker::ReporterLoop() {
  Backoff backoff(0.25, 2.0);
  while (true) {
    std::vector<JobError> errors;
    struct Batch {
      LeaseKey key;
      std::vector<v1::ImageResult> results;
      bool complete;
    };
    std::vector<Batch> batches;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&wake_reporter_), absl::Milliseconds(100));
      wake_reporter_ = false;
      if (done_) return;
      const double now = NowUnix();
      for (auto& [id, lb] : leases_) {
        const bool complete = lb.delivered >= lb.expected;
        if (lb.pending.empty() && !complete) continue;
        if (!complete && now - lb.last_flush < kFlushSeconds) continue;
        Batch b{lb.key, TakeSendable(&lb.pending, complete), complete};
        lb.last_flush = now;
        if (b.results.empty() && !complete) continue;
        batches.push_back(std::move(b));
      }
      // Results first: rows evaluated before a model error still count.
      if (batches.empty()) errors.swap(job_errors_);
      reporter_sending_ = !batches.empty() || !errors.empty();
    }
    // Each lease's batch is its own call, several at once (at most one per lease: a shard's
    // results arrive in order, its completion last): tallyd receives, checks and files them on
    // several threads, and only its database commit is one at a time.
    std::atomic<bool> failed{false};
    ParallelFor(batches.size(), ReportStreams(), [&](size_t k) {
      Batch& b = batches[k];
      if (failed.load() || !Send(b.key, &b.results, b.complete)) {
        // Put the results back in front, to be sent again.
        failed.store(true);
        absl::MutexLock lock(&mu_);
        auto it = leases_.find(b.key.lease_id);
        if (it != leases_.end()) {
          it->second.pending.insert(it->second.pending.begin(), std::make_move_iterator(b.results.begin()),
                                    std::make_move_iterator(b.results.end()));
        }
        return;
      }
      if (b.complete) {
        absl::MutexLock lock(&mu_);
        auto it = leases_.find(b.key.lease_id);
        if (it != leases_.end() && it->second.pending.empty()) leases_.erase(it);
      }
    });
    for (const JobError& e : errors) {
      if (!SendJobError(e)) {
        failed = true;
        absl::MutexLock lock(&mu_);
        job_errors_.push_back(e);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      reporter_sending_ = false;
    }
    if (failed) {
      const double delay = backoff.Next();
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(delay));
    } else {
      backoff.Reset();
    }
  }
}

v1::WorkerGauges Worker::Gauges(std::deque<std::pair<double, int64_t>>* samples) {
  constexpr double kRateWindowSeconds = 10;
  v1::WorkerGauges g;
  const double now = NowUnix();
  g.set_images_total(images_total_);
  samples->emplace_back(now, images_total_);
  // Keep one sample at least the window old (the rate's start), and nothing older than that.
  while (samples->size() > 2 && now - (*samples)[1].first >= kRateWindowSeconds) samples->pop_front();
  const auto& [t0, n0] = samples->front();
  if (now > t0) g.set_images_per_second(static_cast<double>(images_total_ - n0) / (now - t0));
  if (evaluator_ != nullptr) {
    g.set_job_id(evaluator_->job_id);
    g.set_images_held(evaluator_->pipeline->HeldRows());
  }
  if (evaluator_ != nullptr && evaluator_->runner != nullptr) {
    for (const GpuUsage& u : evaluator_->runner->Stats().gpus) {
      v1::GpuStats* gs = g.add_gpus();
      gs->set_device(u.device);
      gs->set_name(u.name);
      gs->set_peak_memory_bytes(u.peak_memory_bytes);
      gs->set_memory_used_bytes(u.memory_used_bytes);
      gs->set_memory_total_bytes(u.memory_total_bytes);
    }
  }
  return g;
}

void Worker::HeartbeatLoop() {
  SdWatchdog watchdog;  // WatchdogSec= of the unit: this loop (it takes mu_) proves the worker alive.
  std::deque<std::pair<double, int64_t>> rate_samples;
  {
    absl::MutexLock lock(&mu_);
    rate_samples.emplace_back(NowUnix(), images_total_);  // The rate's start before the first heartbeat.
  }
  bool sent_held = false;  // The last heartbeat said rows were held (Job.images_held).
  while (true) {
    v1::HeartbeatRequest request;
    double period = 1.0;
    {
      absl::MutexLock lock(&mu_);
      // One period, or less when rows start or stop being held: progress shows them at once.
      const absl::Time until = absl::Now() + absl::Seconds(heartbeat_seconds_);
      while (!done_ && absl::Now() < until) {
        mu_.AwaitWithTimeout(absl::Condition(&done_), std::min(absl::Milliseconds(100), until - absl::Now()));
        if (evaluator_ != nullptr && (evaluator_->pipeline->HeldRows() > 0) != sent_held) break;
      }
      if (done_) return;
      watchdog.Kick();
      period = heartbeat_seconds_;
      request.set_worker_id(worker_id_);
      for (auto& [id, lb] : leases_) {
        v1::HeldLease* h = request.add_leases();
        h->set_job_id(lb.key.job_id);
        h->set_shard_id(lb.key.shard_id);
        h->set_lease_id(lb.key.lease_id);
      }
      *request.mutable_gauges() = Gauges(&rate_samples);
      sent_held = request.gauges().images_held() > 0;
    }
    v1::HeartbeatResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(std::max(2.0, period * 2)));
    grpc::Status s;
    {
      CallInFlight listed(this, &ctx);
      s = stub_->Heartbeat(&ctx, request, &response);
    }
    if (!s.ok()) {
      Log("heartbeat to ", options_.coordinator, " failed: ", s.error_message());
      continue;
    }
    if (response.reregister()) {
      absl::MutexLock lock(&mu_);
      need_register_ = true;
    }
    for (const v1::HeldLease& r : response.revoked()) {
      // A shard whose every row this worker has evaluated is revoked when its results reach the
      // coordinator between this heartbeat's list and its answer: nothing is lost, nothing to say.
      bool evaluated = true;
      {
        absl::MutexLock lock(&mu_);
        auto it = leases_.find(r.lease_id());
        evaluated = it == leases_.end() || it->second.delivered >= it->second.expected;
      }
      if (!evaluated) Log("lease of shard ", r.shard_id(), " of job ", r.job_id(), " was revoked; dropping it");
      DropLease(r.lease_id());
    }
  }
}

}  // namespace tally
