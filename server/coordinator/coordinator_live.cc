// Coordinator: answers before the end (README "Answers before the end"): the order a job's rows are
// evaluated in and how many, the live estimates kept as results are committed, and --until-ci.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/job/rpc.h"
#include "metrics/aggregator.h"
#include "metrics/overlap.h"
#include "metrics/statistics.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/live_estimates.h"

namespace tally {
namespace {

void Welford(double x, int64_t* n, double* mean, double* m2) {
  ++*n;
  const double delta = x - *mean;
  *mean += delta / static_cast<double>(*n);
  *m2 += delta * (x - *mean);
}

std::string SampleReason(const v1::JobSpec& spec) {
  if (spec.sample_rows() > 0) return absl::StrCat("--sample ", spec.sample_rows());
  if (spec.sample_percent() > 0) return absl::StrCat("--sample ", spec.sample_percent(), "%");
  return absl::StrCat("--until-ci ", spec.until_ci(), " reached");
}

// Does class c count in the foreground (the report's foreground means; --until-ci)?
bool Foreground(const v1::JobSpec& spec, int c) {
  return c != 0 || spec.include_background() || spec.regions_size() > 0;
}

// The class's share of the population: rows of the manifest where its value is defined, estimated
// from the committed rows (0 = no correction: rows in manifest order are no random sample).
double Population(const v1::Job& job, bool random, int64_t n, int64_t rows) {
  if (!random || rows <= 0) return 0;
  return static_cast<double>(job.images_total()) * static_cast<double>(n) / static_cast<double>(rows);
}

}  // namespace

int64_t PlannedRows(const v1::JobSpec& spec, int64_t total) {
  if (spec.sample_rows() > 0) return std::min(total, spec.sample_rows());
  if (spec.sample_percent() > 0) {
    return std::min(total, static_cast<int64_t>(std::ceil(static_cast<double>(total) * spec.sample_percent() / 100)));
  }
  return total;
}

std::string SampledNote(const v1::Job& job, int64_t planned) {
  const v1::JobSpec& spec = job.spec();
  if (spec.sample_rows() == 0 && spec.sample_percent() == 0 && spec.until_ci() == 0) return "";
  const int64_t done = job.images_evaluated() + job.images_failed();
  if (IsTerminal(job.state())) {
    if (done >= job.images_total() || job.state() != v1::JOB_STATE_SUCCEEDED) return "";
    return absl::StrCat("sampled: ", done, " of ", job.images_total(), " rows (", SampleReason(spec), ")");
  }
  if (planned < job.images_total()) {
    return absl::StrCat("sampling ", planned, " of ", job.images_total(), " rows (", SampleReason(spec), ")");
  }
  return "";
}

std::string LiveNote(bool random_order) {
  return random_order
             ? "mean over the committed rows +/- 95% normal interval for a uniform random sample without replacement "
               "(finite-population corrected; --order random)"
             : "rows in manifest order are not a random sample: the 95% normal interval assumes they are, without the "
               "finite-population correction (use --order random for a valid interval)";
}

void Coordinator::PlanJob(JobEntry* entry) const {
  const v1::Job& j = entry->record.job;
  entry->order = RowOrder(j.images_total(), j.spec().random_order(), j.spec().order_seed());
  entry->planned = PlannedRows(j.spec(), j.images_total());
  entry->empty_score = ParseEmptyScore(j.spec().empty_score()).value_or(EmptyScore::kNaN);  // Validated.
}

void Coordinator::AddLive(JobEntry* job, const v1::ImageResult& r) {
  if (!r.error().empty()) return;
  const EmptyScore empty = job->empty_score;
  if (job->live.size() < static_cast<size_t>(r.classes_size())) job->live.resize(r.classes_size());
  job->live_rows++;
  for (int c = 0; c < r.classes_size(); ++c) {
    JobEntry::LiveClass& l = job->live[c];
    if (r.classes(c).tp() + r.classes(c).fn() > 0) l.in_reference = true;
    const double dice = Aggregator::ImageMetric(r, c, Metric::kDice, empty);
    const double iou = Aggregator::ImageMetric(r, c, Metric::kIou, empty);
    if (std::isfinite(dice)) Welford(dice, &l.n, &l.dice_mean, &l.dice_m2);
    if (std::isfinite(iou)) Welford(iou, &l.n_iou, &l.iou_mean, &l.iou_m2);
  }
}

void Coordinator::FillLive(const JobEntry& job, v1::Job* out) const {
  const bool random = job.order.random();
  for (size_t c = 0; c < job.live.size(); ++c) {
    const JobEntry::LiveClass& l = job.live[c];
    if (l.n == 0 && l.n_iou == 0) continue;
    v1::LiveEstimate* e = out->add_live();
    e->set_class_id(static_cast<int32_t>(c));
    e->set_rows(l.n);
    e->set_dice_mean(l.dice_mean);
    e->set_dice_half_width(SamplingHalfWidth95(l.n, l.dice_m2, Population(job.record.job, random, l.n, job.live_rows)));
    e->set_iou_mean(l.iou_mean);
    e->set_iou_half_width(
        SamplingHalfWidth95(l.n_iou, l.iou_m2, Population(job.record.job, random, l.n_iou, job.live_rows)));
    e->set_foreground(Foreground(job.record.job.spec(), static_cast<int>(c)) && l.in_reference);
  }
  if (out->live_size() > 0) out->set_live_note(LiveNote(random));
}

void Coordinator::MaybeStopEarlyLocked(JobEntry* job, Deferred* deferred) {
  const v1::Job& j = job->record.job;
  const double width = j.spec().until_ci();
  if (width <= 0 || job->stopped_early || IsTerminal(j.state())) return;
  const int64_t min_rows = j.spec().min_rows() > 0 ? j.spec().min_rows() : kDefaultMinRows;
  if (job->live_rows < min_rows) return;
  bool any = false;
  double widest = 0;
  for (size_t c = 0; c < job->live.size(); ++c) {
    const JobEntry::LiveClass& l = job->live[c];
    if (!Foreground(j.spec(), static_cast<int>(c)) || !l.in_reference) continue;
    const double half = SamplingHalfWidth95(l.n, l.dice_m2, Population(j, job->order.random(), l.n, job->live_rows));
    if (!(half <= width)) return;
    widest = std::max(widest, half);
    any = true;
  }
  if (!any) return;
  job->stopped_early = true;
  Log("job ", j.job_id(), ": every foreground class's Dice interval is within +/- ", absl::StrFormat("%.4g", widest),
      " after ", job->live_rows, " rows (--until-ci ", width, "); dropping the ", job->pending.size(),
      " shards not yet leased");
  while (!job->pending.empty()) {
    const int64_t sid = job->pending.front();
    job->pending.pop_front();
    DropShardLocked(job, sid, deferred);
  }
  MaybeCompleteLocked(job);
}

void Coordinator::DropShardLocked(JobEntry* job, int64_t shard_id, Deferred* deferred) {
  Shard& s = job->shards[shard_id];
  if (s.phase == ShardPhase::kDone) return;
  s.phase = ShardPhase::kDone;
  s.worker_id.clear();
  job->shards_done++;
  if (shard_id < job->base_shards) deferred->shard_done.emplace_back(job->record.job.job_id(), shard_id, s.attempts);
}

}  // namespace tally
