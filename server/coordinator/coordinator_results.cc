// Coordinator: result admission: a worker's report checked against its lease and its job
// (plausible counts, the class count), committed in one transaction keyed by manifest index, and
// accounted to the shard that owns each row now.
#include "server/coordinator/coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <set>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "common/job/job_config.h"
#include "common/formats/decode.h"
#include "base/file_util.h"
#include "base/log.h"
#include "common/sources/manifest.h"
#include "metrics/calibration.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/security/sha256.h"
#include "common/coco/coco_instances.h"
#include "common/formats/thumbnail.h"
#include "server/store/sharding.h"
#include "base/status_macros.h"
#include "common/job/job_spec_validation.h"
#include "server/report/compare.h"
#include "server/report/report_writer.h"

namespace tally {
namespace {

// "fp = -3": the first negative count of four, or "".
std::string NegativeCount(int64_t tp, int64_t fp, int64_t fn, int64_t tn) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"tp", tp}, {"fp", fp}, {"fn", fn}, {"tn", tn}}) {
    if (value < 0) return absl::StrCat(name, " = ", value, " (a count cannot be negative)");
  }
  return "";
}

// Moves the thumbnails out of `results` (stored results carry none), each with its row's Dice (in
// instance jobs, class 0's with the row's instance F1: common/coco/coco_instances.h).
std::vector<StoredThumbnail> TakeThumbnails(std::vector<v1::ImageResult>* results, EmptyScore empty,
                                            bool instance_job) {
  std::vector<StoredThumbnail> out;
  for (v1::ImageResult& r : *results) {
    for (v1::Thumbnail& t : *r.mutable_thumbnails()) {
      StoredThumbnail st;
      st.index = r.index();
      st.class_index = t.class_index();
      st.dice = instance_job && t.class_index() == kInstanceThumbnailClass
                    ? RowInstanceF1(r)
                    : RowDice(r.classes(t.class_index()), empty);  // In range: CheckResults.
      st.slice = t.slice();
      st.jpeg = std::move(*t.mutable_jpeg());
      out.push_back(std::move(st));
    }
    r.clear_thumbnails();
  }
  return out;
}

// A row's calibration values (metrics/calibration.h): K + 1 histograms of 15 bins, each histogram's
// pixels the row's valid pixels, correct pixels at most the bin's, confidence at most 1 a pixel.
std::string CheckRowCalibration(const v1::ImageResult& r, int64_t valid) {
  const int k = r.classes_size();
  if (r.calibration_size() != CalibrationRowSize(k)) {
    return absl::StrCat(r.calibration_size(), " calibration values for ", k, " classes");
  }
  for (int h = 0; h <= k; ++h) {
    int64_t pixels = 0;
    for (int b = 0; b < kCalibrationBins; ++b) {
      const int64_t* cell = r.calibration().data() + CalibrationCell(h, b);
      if (cell[0] < 0 || cell[0] > valid || cell[1] < 0 || cell[1] > cell[0] || cell[2] < 0 ||
          static_cast<uint64_t>(cell[2]) > static_cast<uint64_t>(cell[0]) << 32) {
        return std::string("a calibration bin's pixels, correct pixels or confidence out of range");
      }
      pixels += cell[0];
    }
    if (pixels != valid) return absl::StrCat("a calibration histogram of ", pixels, " pixels; the image has ", valid);
  }
  return std::string();
}

// A batch's fine histogram: cells in order and in range, within the budget of kMaxCalibrationCovers
// rows; where every row it covers is in this report, its pixels and correct pixels per histogram
// equal theirs.
std::string CheckFineCalibration(const v1::ImageResult& head,
                                 const absl::flat_hash_map<int64_t, const v1::ImageResult*>& here) {
  const v1::CalibrationFine& f = head.calibration_fine();
  const int k = head.classes_size();
  if (f.classes() != k || f.cells_size() != f.pixels_size() || f.cells_size() != f.correct_size() ||
      f.covers_size() < 1 || f.covers_size() > kMaxCalibrationCovers) {
    return "a fine calibration histogram whose sizes do not match";
  }
  std::vector<int64_t> pixels(k + 1, 0), correct(k + 1, 0);
  for (int i = 0; i < f.cells_size(); ++i) {
    if (f.cells(i) < 0 || f.cells(i) >= (k + 1) * int64_t{kCalibrationFineBins} || (i > 0 && f.cells(i) <= f.cells(i - 1)) ||
        f.pixels(i) < 1 || f.correct(i) < 0 || f.correct(i) > f.pixels(i)) {
      return "a fine calibration histogram's cells out of order or range";
    }
    pixels[f.cells(i) / kCalibrationFineBins] += f.pixels(i);
    correct[f.cells(i) / kCalibrationFineBins] += f.correct(i);
  }
  std::vector<int64_t> want_pixels(k + 1, 0), want_correct(k + 1, 0);
  for (int64_t index : f.covers()) {
    auto it = here.find(index);
    if (it == here.end() || !it->second->error().empty() || it->second->calibration_size() != CalibrationRowSize(k)) {
      return "";  // Not whole here: not counted (ScreenCalibration), nothing to compare.
    }
    for (int h = 0; h <= k; ++h) {
      for (int b = 0; b < kCalibrationBins; ++b) {
        const int64_t* cell = it->second->calibration().data() + CalibrationCell(h, b);
        want_pixels[h] += cell[0];
        want_correct[h] += cell[1];
      }
    }
  }
  return pixels == want_pixels && correct == want_correct ? "" : "a fine calibration histogram that disagrees with its rows";
}

}  // namespace

absl::Status Coordinator::CheckResults(const JobEntry& job, const Shard& shard,
                                       const v1::ReportResultsRequest& request, int32_t classes) const {
  for (const v1::ImageResult& r : request.results()) {
    if (const int64_t position = job.order.PositionOf(r.index()); position < shard.begin || position >= shard.end) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " outside shard [", shard.begin,
                                                     ", ", shard.end, ")", job.order.random() ? " of positions" : ""));
    }
    if (!r.error().empty()) {
      if (r.thumbnails_size() > 0) return absl::InvalidArgumentError(absl::StrCat("failed row ", r.index(), " has thumbnails"));
      continue;
    }
    // classes 0: a prediction job whose class count comes from the data (each image up to its own
    // largest label).
    if (classes == 0 ? (r.classes_size() < 1 || r.classes_size() > kMaxClasses) : r.classes_size() != classes) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", r.classes_size(),
                                                     " classes; the job has ", classes));
    }
    // Every class partitions the same valid pixels (those the ignore value leaves): tp + fp + fn + tn
    // is that number for every class, and for every threshold of a sweep.
    const int64_t pixels = static_cast<int64_t>(r.height()) * r.width() * std::max(1, r.depth());
    const int64_t valid = pixels - r.mask_ignored_pixels();
    const auto implausible = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has implausible counts: ", what));
    };
    if (r.height() < 0 || r.width() < 0 || r.mask_ignored_pixels() < 0 || valid < 0) {
      return implausible(absl::StrCat("size ", r.height(), "x", r.width(), " with ", r.mask_ignored_pixels(),
                                      " ignored pixels"));
    }
    for (int k = 0; k < r.classes_size(); ++k) {
      const v1::ClassResult& c = r.classes(k);
      if (std::string negative = NegativeCount(c.tp(), c.fp(), c.fn(), c.tn()); !negative.empty()) {
        return implausible(absl::StrCat("class ", k, " has ", negative));
      }
      if (c.tp() + c.fp() + c.fn() + c.tn() != valid) {
        return implausible(absl::StrCat("class ", k, " has tp+fp+fn+tn = ", c.tp() + c.fp() + c.fn() + c.tn(),
                                        ", the image has ", valid, " valid pixels"));
      }
    }
    if (r.thumbnails_size() > r.classes_size()) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", r.thumbnails_size(),
                                                     " thumbnails for ", r.classes_size(), " classes"));
    }
    for (const v1::Thumbnail& t : r.thumbnails()) {
      // A JPEG (it is put into report.html as one) of a class of this result, and of a sane size.
      if (t.class_index() < 0 || t.class_index() >= r.classes_size() || t.jpeg().size() > kMaxThumbnailBytes ||
          t.jpeg().size() < 4 || static_cast<unsigned char>(t.jpeg()[0]) != 0xFF ||
          static_cast<unsigned char>(t.jpeg()[1]) != 0xD8 || t.slice() < 0 || t.slice() >= std::max(1, r.depth())) {
        return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has a thumbnail that is not a ",
                                                       "JPEG of one of its classes"));
      }
    }
    if (r.thresholds_size() != job.record.job.spec().thresholds_size()) {
      return implausible(absl::StrCat(r.thresholds_size(), " threshold counts for ",
                                      job.record.job.spec().thresholds_size(), " thresholds"));
    }
    for (const v1::ThresholdCounts& t : r.thresholds()) {
      if (std::string negative = NegativeCount(t.tp(), t.fp(), t.fn(), t.tn()); !negative.empty()) {
        return implausible(absl::StrCat("a threshold's counts have ", negative));
      }
      if (t.tp() + t.fp() + t.fn() + t.tn() != valid) {
        return implausible(absl::StrCat("a threshold's tp+fp+fn+tn differs from the image's ", valid, " valid pixels"));
      }
    }
    if (r.calibration_size() > 0) {
      if (std::string why = CheckRowCalibration(r, valid); !why.empty()) return implausible(why);
    }
  }
  absl::flat_hash_map<int64_t, const v1::ImageResult*> here;
  for (const v1::ImageResult& r : request.results()) here[r.index()] = &r;
  for (const v1::ImageResult& r : request.results()) {
    if (!r.has_calibration_fine()) continue;
    if (std::string why = CheckFineCalibration(r, here); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("result for index ", r.index(), " has ", why));
    }
  }
  return absl::OkStatus();
}

int32_t Coordinator::ReconcileClassesLocked(JobEntry* job, const v1::ReportResultsRequest& request,
                                            Deferred* deferred) {
  int32_t classes = job->record.job.num_classes();
  const v1::JobSpec& spec = job->record.job.spec();
  if (spec.model().empty() && spec.regions_size() == 0 && spec.num_classes() == 0) {
    // The class count is the largest label in the whole set plus one: the most any result has.
    int32_t most = classes;
    for (const v1::ImageResult& r : request.results()) {
      if (r.error().empty() && r.classes_size() <= kMaxClasses) most = std::max(most, r.classes_size());
    }
    if (most > classes) {
      job->record.job.set_num_classes(most);
      deferred->job_updates.push_back(job->record);
    }
    return 0;
  }
  // The class count comes with the results (older workers may leave the field 0).
  int32_t reported = request.num_classes();
  for (const v1::ImageResult& r : request.results()) {
    if (reported == 0 && r.error().empty()) reported = r.classes_size();
  }
  if (reported > 0 && classes == 0) {
    job->record.job.set_num_classes(reported);
    deferred->job_updates.push_back(job->record);
    return reported;
  }
  if (reported > 0 && reported != classes) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 absl::StrCat("workers disagree on the number of classes of model '", job->record.job.spec().model(),
                              "': ", classes, " and ", reported),
                 deferred);
    return -1;
  }
  return classes;
}

absl::StatusOr<Coordinator::Admission> Coordinator::AdmitReportLocked(const v1::ReportResultsRequest& request,
                                                                      Deferred* deferred) {
  Admission a;
  auto wit = workers_.find(request.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker '", request.worker_id(), "'; register again"));
  }
  const double now = Now();
  wit->second.last_seen = now;
  wit->second.restored = false;
  auto jit = jobs_.find(request.job_id());
  if (jit == jobs_.end() || IsTerminal(jit->second->record.job.state())) {
    a.abandon = true;  // Ended or deleted meanwhile.
    return a;
  }
  JobEntry& job = *jit->second;
  if (request.shard_id() == kCanaryShard) {  // Compared across workers, never committed.
    const int32_t classes = ReconcileClassesLocked(&job, request, deferred);
    a.canary = true;
    a.abandon = classes < 0;
    if (classes >= 0) a.rejected = AdmitCanaryLocked(&job, request, classes, deferred);
    if (!a.rejected.ok()) job.canaries.erase(request.worker_id());
    return a;
  }
  if (request.shard_id() < 0 || request.shard_id() >= static_cast<int64_t>(job.shards.size())) {
    return absl::InvalidArgumentError(absl::StrCat("job ", request.job_id(), " has no shard ", request.shard_id()));
  }
  const Shard& shard = job.shards[request.shard_id()];
  a.lease_valid = shard.Holds(request.worker_id(), request.lease_id());
  const int32_t classes = ReconcileClassesLocked(&job, request, deferred);
  if (classes < 0) {
    a.abandon = true;
    return a;
  }
  a.rejected = CheckResults(job, shard, request, classes);
  if (!a.rejected.ok()) {
    // A rejected report must not orphan the shard: the lease ends here.
    Log("rejected results from worker ", request.worker_id(), " (", wit->second.info.name(), ") for shard ",
        request.shard_id(), " of job ", request.job_id(), ": ", a.rejected.message());
    if (a.lease_valid) {
      ReleaseShardLocked(&job, request.shard_id(), absl::StrCat("results rejected: ", a.rejected.message()), true,
                         deferred, &request.worker_id());
    }
    return a;
  }
  if (request.has_stats()) {
    WorkerRecord wr;
    wr.worker_id = request.worker_id();
    wr.name = wit->second.info.name();
    wr.device = wit->second.info.device();
    wr.last_result_unix = now;
    wr.stats = request.stats();
    a.worker_record = std::move(wr);
  }
  if (!request.results().empty()) wit->second.last_progress = now;
  const v1::JobSpec& spec = job.record.job.spec();
  a.keep_thumbnails = spec.has_thumbnails() ? spec.thumbnails() : kDefaultThumbnails;
  a.empty_score = ParseEmptyScore(spec.empty_score()).value_or(EmptyScore::kNaN);  // Validated at submission.
  a.instance_job = !spec.coco().empty() && spec.manifest().empty();
  return a;
}

absl::StatusOr<v1::ReportResultsResponse> Coordinator::ReportResults(const v1::ReportResultsRequest& request) {
  Deferred deferred;
  absl::StatusOr<Admission> admitted;
  {
    absl::MutexLock lock(&mu_);
    admitted = AdmitReportLocked(request, &deferred);
    // Evaluated rows from a worker that held rows of this job: it holds none now (while it holds
    // any, every row it evaluates is held; rows that failed to decode may still come), so progress
    // does not count them twice until its next heartbeat.
    auto w = workers_.find(request.worker_id());
    if (w != workers_.end() && w->second.gauges.images_held() > 0 && w->second.gauges.job_id() == request.job_id() &&
        std::any_of(request.results().begin(), request.results().end(),
                    [](const v1::ImageResult& r) { return r.error().empty(); })) {
      w->second.gauges.set_images_held(0);
    }
  }
  Apply(deferred);
  if (!admitted.ok()) return admitted.status();
  if (!admitted->rejected.ok()) return admitted->rejected;
  v1::ReportResultsResponse response;
  if (admitted->canary && !admitted->abandon) return response;  // Kept for the vote; the worker goes on.
  if (admitted->abandon) {
    response.set_abandon(true);
    return response;
  }
  std::vector<v1::ImageResult> results(request.results().begin(), request.results().end());
  const std::vector<StoredThumbnail> thumbnails = TakeThumbnails(&results, admitted->empty_score, admitted->instance_job);
  const bool calibration = std::any_of(results.begin(), results.end(),
                                       [](const v1::ImageResult& r) { return r.calibration_size() > 0; });
  std::vector<int64_t> refused;
  const auto commit = [&] {
    return CommitAndAccount(request.job_id(), request.shard_id(), request.worker_id(), results,
                            request.shard_complete() && admitted->lease_valid && refused.empty(), thumbnails,
                            admitted->keep_thumbnails);
  };
  absl::StatusOr<bool> committed = false;
  if (calibration) {
    absl::MutexLock screened(&calibration_mu_);
    refused = ScreenCalibration(request.job_id(), &results);
    committed = commit();
  } else {
    committed = commit();
  }
  ASSIGN_OR_RETURN(const bool shard_done, committed);
  if (!refused.empty()) SplitRefused(request.job_id(), refused);
  if (admitted->worker_record) {
    absl::Status s = store_->UpsertWorker(request.job_id(), *admitted->worker_record);
    if (!s.ok()) Log("recording statistics of worker ", request.worker_id(), " failed: ", s.ToString());
  }
  response.set_abandon(!admitted->lease_valid || (shard_done && !request.shard_complete()));
  return response;
}

std::vector<int64_t> Coordinator::ScreenCalibration(const std::string& job_id, std::vector<v1::ImageResult>* results) {
  absl::flat_hash_map<int64_t, const v1::ImageResult*> here;
  for (const v1::ImageResult& r : *results) here[r.index()] = &r;
  absl::flat_hash_set<int64_t> counted;  // Batches whose fine histogram counts now.
  std::vector<int64_t> refused;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) return refused;
    const std::vector<bool>& committed = jit->second->committed_rows;
    const auto is_committed = [&](int64_t i) { return i >= 0 && i < static_cast<int64_t>(committed.size()) && committed[i]; };
    for (const v1::ImageResult& r : *results) {
      if (!r.has_calibration_fine() || r.calibration_size() == 0) continue;
      const auto& covers = r.calibration_fine().covers();
      const bool whole = std::all_of(covers.begin(), covers.end(), [&](int64_t i) {
        auto it = here.find(i);
        return it != here.end() && it->second->error().empty() && it->second->calibration_batch() == r.calibration_batch() &&
               !is_committed(i);
      });
      if (whole) counted.insert(r.calibration_batch());
    }
    std::vector<v1::ImageResult> kept;
    for (v1::ImageResult& r : *results) {
      const bool counts = r.calibration_size() == 0 || counted.contains(r.calibration_batch());
      if (!counts && r.error().empty() && !is_committed(r.index())) {
        refused.push_back(r.index());
        continue;
      }
      if (!counts) r.clear_calibration_fine();
      kept.push_back(std::move(r));
    }
    results->swap(kept);
  }
  if (!refused.empty()) {
    Log("job ", job_id, ": ", refused.size(), " rows sent without the whole of their batch's calibration histogram "
        "(their batch's rows came apart, failed or were committed by another copy); each is evaluated again alone");
  }
  return refused;
}

void Coordinator::SplitRefused(const std::string& job_id, const std::vector<int64_t>& refused) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end() || IsTerminal(jit->second->record.job.state())) return;
    JobEntry& job = *jit->second;
    std::set<int64_t> shards;
    for (int64_t index : refused) shards.insert(OwnerShard(job, index));
    for (int64_t sid : shards) {
      Shard& s = job.shards[sid];
      if (s.split || s.end - s.begin <= 1) continue;  // Single rows: their batches are whole.
      if (s.phase == ShardPhase::kLeased) ForgetShardLeasesLocked(job_id, sid, s);
      counters_.shards_retried += SplitShardLocked(&job, sid);
    }
  }
  Apply(deferred);
}

std::shared_ptr<LiveReport> Coordinator::LiveReportLocked(JobEntry* job, bool replay) {
  if (job->live_report != nullptr || job->live_report_off) return job->live_report;
  const v1::Job& j = job->record.job;
  // Rows already committed without it (failed rows before the class count was known; unless the
  // caller feeds them from the database), or a job whose report needs its rows in index order: the
  // batch path.
  job->live_report_off = true;
  const bool missed = !replay && j.images_evaluated() + j.images_failed() > 0;
  if (missed || IsTerminal(j.state()) || !LiveReport::Eligible(j)) return nullptr;
  absl::StatusOr<std::unique_ptr<LiveReport>> live = LiveReport::Create(job->record, SpoolPath(j.job_id()));
  if (!live.ok()) {
    Log("job ", j.job_id(), ": its report will be built at the end (", live.status().message(), ")");
    return nullptr;
  }
  job->live_report = std::move(*live);
  job->live_report_off = false;
  return job->live_report;
}

void Coordinator::MarkShardDoneLocked(JobEntry* job, int64_t shard_id, const std::string& worker_id, double now,
                                      Deferred* deferred) {
  Shard& shard = job->shards[shard_id];
  if (shard.split || shard.committed < shard.end - shard.begin || shard.phase == ShardPhase::kDone) return;
  const std::string& job_id = job->record.job.job_id();
  ForgetShardLeasesLocked(job_id, shard_id, shard);
  if (shard.phase == ShardPhase::kLeased && shard.lease_unix > 0) job->shard_seconds.push_back(now - shard.lease_unix);
  if (!shard.spec_worker_id.empty()) {
    Log("shard ", shard_id, " of job ", job_id, " done (", shard.worker_id == worker_id ? "its lease" : "its speculative copy",
        " first); the other copy is dropped");
  }
  // A shard queued again (its lease ended, or a restart forgot it) whose rows came in under the old
  // lease: out of the queue too, else leasing it again would count it done twice.
  if (shard.phase == ShardPhase::kPending) {
    job->pending.erase(std::remove(job->pending.begin(), job->pending.end(), shard_id), job->pending.end());
  }
  shard.phase = ShardPhase::kDone;
  shard.worker_id.clear();
  shard.spec_worker_id.clear();
  job->shards_done++;
  if (shard_id < job->base_shards) deferred->shard_done.emplace_back(job_id, shard_id, shard.attempts);
  MaybeCompleteLocked(job);
}

absl::StatusOr<bool> Coordinator::CommitAndAccount(const std::string& job_id, int64_t shard_id,
                                                   const std::string& worker_id,
                                                   const std::vector<v1::ImageResult>& results, bool shard_complete,
                                                   const std::vector<StoredThumbnail>& thumbnails,
                                                   int keep_thumbnails) {
  std::vector<bool> new_rows;
  std::shared_ptr<LiveReport> live;
  {
    absl::MutexLock lock(&mu_);
    auto jit = jobs_.find(job_id);
    if (jit != jobs_.end()) live = LiveReportLocked(jit->second.get());
  }
  std::vector<RowNames> names;
  const double now = Now();
  const auto commit_start = std::chrono::steady_clock::now();
  absl::Status committed = store_->CommitResults(job_id, worker_id, results, now, &new_rows, thumbnails,
                                                 keep_thumbnails, live != nullptr ? &names : nullptr);
  const double commit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - commit_start).count();
  NoteStorage(committed);
  RETURN_IF_ERROR(committed);
  // Into the report before the rows count as done, so that the finalizer finds every row there.
  if (live != nullptr) live->Add(results, new_rows, names, shard_id);
  Deferred deferred;
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    NoteCommitLocked(commit_seconds);
    auto jit = jobs_.find(job_id);
    if (jit == jobs_.end()) return false;
    JobEntry& job = *jit->second;
    v1::Job& j = job.record.job;
    std::set<int64_t> touched = {shard_id};
    for (size_t i = 0; i < results.size(); ++i) {
      if (!new_rows[i]) continue;
      if (results[i].error().empty()) {
        j.set_images_evaluated(j.images_evaluated() + 1);
        counters_.images_evaluated++;
        AddLive(&job, results[i]);
      } else {
        j.set_images_failed(j.images_failed() + 1);
        counters_.images_failed++;
      }
      if (results[i].index() >= 0 && results[i].index() < static_cast<int64_t>(job.committed_rows.size())) {
        job.committed_rows[results[i].index()] = true;
      }
      // Credited to the shard that owns the row now (a single-row shard after a split).
      const int64_t owner = OwnerShard(job, results[i].index());
      job.shards[owner].committed++;
      touched.insert(owner);
    }
    if (!results.empty()) job.record.last_result_unix = now;
    for (int64_t sid : touched) MarkShardDoneLocked(&job, sid, worker_id, now, &deferred);
    MaybeStopEarlyLocked(&job, &deferred);
    if (job.record.job.spec().until_ci() > 0) NoteWorkLocked();  // Paced leases (MayLeaseMoreLocked) may go on.
    Shard& shard = job.shards[shard_id];
    if (shard.phase == ShardPhase::kDone && !shard.split) {
      done = true;
    } else if (shard_complete && shard.phase == ShardPhase::kLeased) {
      Log("worker ", worker_id, " finished shard ", shard_id, " of job ", job_id, " with only ", shard.committed, "/",
          shard.end - shard.begin, " rows; queueing it again");
      ReleaseShardLocked(&job, shard_id, "incomplete results", true, &deferred, &worker_id);
    }
  }
  Apply(deferred);
  return done;
}

}  // namespace tally
