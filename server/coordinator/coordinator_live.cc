// Coordinator: answers before the end (docs/metrics.md "Answers before the end"): the order a job's rows are
// evaluated in and how many, the live estimates kept as results are committed, and --until-ci.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "common/job/rpc.h"
#include "metrics/aggregator.h"
#include "metrics/overlap.h"
#include "metrics/statistics.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/live_estimates.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void Welford(double x, int64_t* n, double* mean, double* m2) {
  ++*n;
  const double delta = x - *mean;
  *mean += delta / static_cast<double>(*n);
  *m2 += delta * (x - *mean);
}

// The flags that draw the same rows again: the sample, and the order whose prefix it is.
std::string SampleReason(const v1::JobSpec& spec) {
  const std::string order = absl::StrCat(" --order random:", spec.order_seed());
  if (spec.sample_rows() > 0) return absl::StrCat("--sample ", spec.sample_rows(), order);
  if (spec.sample_percent() > 0) return absl::StrCat("--sample ", spec.sample_percent(), "%", order);
  return absl::StrCat("--until-ci ", spec.until_ci(), " reached;", order);
}

// Does class c count in the foreground (the report's foreground means; --until-ci)?
bool Foreground(const v1::JobSpec& spec, int c) {
  return c != 0 || spec.include_background() || spec.regions_size() > 0;
}

// The class's share of the manifest: rows where its value is defined, estimated from the committed
// rows (a random-order job's rows so far are a uniform random sample without replacement).
double Population(const v1::Job& job, int64_t n, int64_t rows) {
  if (rows <= 0) return 0;
  return std::ceil(static_cast<double>(job.images_total()) * static_cast<double>(n) / static_cast<double>(rows));
}

double HalfWidth(const std::pair<double, double>& ci) { return 0.5 * (ci.second - ci.first); }

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
             ? absl::StrCat("mean over the committed rows with a 95% betting interval for the manifest's mean (a uniform "
                            "random sample without replacement, finite-population corrected; valid at any number of "
                            "rows; none below ", kMinIntervalRows, " rows)")
             : "mean over the committed rows; no interval: rows in manifest order are not a random sample (--order "
               "random gives one)";
}

void Coordinator::PlanJob(JobEntry* entry) const {
  const v1::Job& j = entry->record.job;
  entry->order = RowOrder(j.images_total(), j.spec().random_order(), j.spec().order_seed());
  entry->planned = PlannedRows(j.spec(), j.images_total());
  entry->empty_score = ParseEmptyScore(j.spec().empty_score()).value_or(EmptyScore::kNaN);  // Validated.
}

std::pair<double, double> Coordinator::LiveCi(const JobEntry& job, const JobEntry::LiveMetric& m) {
  if (!job.order.random()) return {kNaN, kNaN};
  const bool ended = IsTerminal(job.record.job.state()) && m.n != m.ci_rows;  // Exact once no row comes.
  if (ended || m.ci_rows < 0 || static_cast<double>(m.n) >= 1.01 * static_cast<double>(m.ci_rows) + 1) {
    m.ci = m.sample.Ci95(Population(job.record.job, m.n, job.live_rows));
    m.ci_rows = m.n;
  }
  return m.ci;
}

void Coordinator::AddLive(JobEntry* job, const v1::ImageResult& r) {
  if (!r.error().empty()) return;
  const EmptyScore empty = job->empty_score;
  if (job->live.size() < static_cast<size_t>(r.classes_size())) job->live.resize(r.classes_size());
  job->live_rows++;
  const bool random = job->order.random();
  const uint64_t position = random ? static_cast<uint64_t>(job->order.PositionOf(r.index())) : 0;
  for (int c = 0; c < r.classes_size(); ++c) {
    JobEntry::LiveClass& l = job->live[c];
    if (r.classes(c).tp() + r.classes(c).fn() > 0) l.in_reference = true;
    for (auto [metric, live] : {std::pair<Metric, JobEntry::LiveMetric*>{Metric::kDice, &l.dice}, {Metric::kIou, &l.iou}}) {
      const double v = Aggregator::ImageMetric(r, c, metric, empty);
      if (!std::isfinite(v)) continue;
      Welford(v, &live->n, &live->mean, &live->m2);
      if (random) live->sample.Add(position, v);
    }
  }
}

void Coordinator::FillLive(const JobEntry& job, v1::Job* out) const {
  for (size_t c = 0; c < job.live.size(); ++c) {
    const JobEntry::LiveClass& l = job.live[c];
    if (l.dice.n == 0 && l.iou.n == 0) continue;
    v1::LiveEstimate* e = out->add_live();
    e->set_class_id(static_cast<int32_t>(c));
    e->set_rows(l.dice.n);
    const std::pair<double, double> dice = LiveCi(job, l.dice), iou = LiveCi(job, l.iou);
    e->set_dice_mean(l.dice.mean);
    e->set_dice_ci_low(dice.first);
    e->set_dice_ci_high(dice.second);
    e->set_dice_half_width(HalfWidth(dice));
    e->set_iou_mean(l.iou.mean);
    e->set_iou_ci_low(iou.first);
    e->set_iou_ci_high(iou.second);
    e->set_iou_half_width(HalfWidth(iou));
    e->set_foreground(Foreground(job.record.job.spec(), static_cast<int>(c)) && l.in_reference);
  }
  if (out->live_size() > 0) out->set_live_note(LiveNote(job.order.random()));
}

std::optional<double> Coordinator::WidestForegroundHalfWidth(const JobEntry& job, bool exact) {
  std::optional<double> widest;
  for (size_t c = 0; c < job.live.size(); ++c) {
    const JobEntry::LiveClass& l = job.live[c];
    if (!Foreground(job.record.job.spec(), static_cast<int>(c)) || !l.in_reference) continue;
    if (exact && l.dice.ci_rows != l.dice.n) l.dice.ci_rows = -1;  // Recomputed from every row.
    const double half = HalfWidth(LiveCi(job, l.dice));
    widest = std::isnan(half) || (widest && std::isnan(*widest)) ? kNaN : std::max(widest.value_or(0), half);
  }
  return widest;
}

// The rule is checked on the cached intervals as rows come; once it holds, no more shards are leased
// and, when every leased row is in, checked again on the exact intervals of all the rows: those the
// report holds (an interval can widen as rows come, so the rule holding earlier is not enough). It
// stops the job only if it still holds; else leasing goes on.
void Coordinator::MaybeStopEarlyLocked(JobEntry* job, Deferred* deferred) {
  const v1::Job& j = job->record.job;
  const double width = j.spec().until_ci();
  // Done (its last shard committed: MaybeCompleteLocked wrote whether the width was reached).
  if (width <= 0 || job->stopped_early || job->finalize_queued || IsTerminal(j.state())) return;
  const int64_t min_rows = j.spec().min_rows() > 0 ? j.spec().min_rows() : kDefaultMinRows;
  // Where the rule stands, for status and the report: the widest foreground interval so far.
  std::optional<double> widest = WidestForegroundHalfWidth(*job, false);
  auto holds = [&] { return job->live_rows >= min_rows && widest && *widest <= width; };  // NaN does not.
  bool within = holds();
  const bool settled = within && RowsInFlight(*job) == 0;
  if (settled) {
    widest = WidestForegroundHalfWidth(*job, true);
    within = holds();
    if (!within) Log("job ", j.job_id(), ": --until-ci ", width, " held as rows came but not on all ", job->live_rows,
                     " rows in; leasing goes on");
  }
  job->record.job.set_until_ci_note(absl::StrCat(
      "--until-ci ", width, ": widest foreground Dice half-width ",
      widest && !std::isnan(*widest) ? absl::StrFormat("%.4g", *widest) : std::string("none yet"), " after ",
      job->live_rows, " rows (stops once every one is within ", width, ", from --min-rows ", min_rows, " rows on)"));
  job->ci_draining = within && !settled;
  if (!within || !settled) return;
  job->stopped_early = true;
  job->record.job.set_until_ci_note(absl::StrCat("--until-ci ", width, " reached: widest foreground Dice half-width ",
                                                 absl::StrFormat("%.4g", *widest), " after ", job->live_rows, " rows"));
  Log("job ", j.job_id(), ": every foreground class's Dice interval is within +/- ", absl::StrFormat("%.4g", *widest),
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
