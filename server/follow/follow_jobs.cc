#include "server/follow/follow_jobs.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/job/row_order.h"
#include "metrics/bounded_mean.h"
#include "metrics/overlap.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct ParsedMetric {
  Metric metric = Metric::kDice;
  int cls = -1;  // -1: the foreground's mean.
};

absl::StatusOr<ParsedMetric> Parse(const std::string& text) {
  ParsedMetric p;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (name == "dice") {
    p.metric = Metric::kDice;
  } else if (name == "iou") {
    p.metric = Metric::kIou;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--follow-metric '", text, "': expected dice, iou, dice:K or iou:K"));
  }
  if (colon != std::string::npos && (!absl::SimpleAtoi(text.substr(colon + 1), &p.cls) || p.cls < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--follow-metric '", text, "': K is a class number"));
  }
  return p;
}

// The values of a job's committed rows by index (NaN for rows without one), and which are committed.
absl::Status Values(Coordinator* core, const std::string& job_id, const std::string& metric, int64_t rows,
                    std::vector<double>* values, std::vector<bool>* committed) {
  ASSIGN_OR_RETURN(const v1::Job job, core->GetJob(job_id));
  ASSIGN_OR_RETURN(const JobConfig config, JobConfigFromSpec(job.spec()));
  values->assign(static_cast<size_t>(rows), kNaN);
  committed->assign(static_cast<size_t>(rows), false);
  return core->ForEachResult(job_id, [&](const v1::ImageResult& r, const RowNames&) {
    if (r.index() >= 0 && r.index() < rows) {
      (*values)[r.index()] = FollowRowValue(r, metric, config);
      (*committed)[r.index()] = true;
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status CheckFollowMetric(const std::string& metric) { return Parse(metric).status(); }

double FollowRowValue(const v1::ImageResult& row, const std::string& metric, const JobConfig& config) {
  const absl::StatusOr<ParsedMetric> p = Parse(metric);
  if (!p.ok() || !row.error().empty()) return kNaN;
  double sum = 0;
  int n = 0;
  for (int c = 0; c < row.classes_size(); ++c) {
    if (p->cls >= 0 ? c != p->cls : (c == 0 && !config.include_background)) continue;
    const v1::ClassResult& r = row.classes(c);
    ConfusionCounts counts;
    counts.tp = r.tp();
    counts.fp = r.fp();
    counts.fn = r.fn();
    counts.tn = r.tn();
    const double v = CountMetricWithEmpty(p->metric, counts, config.empty_score);
    if (std::isnan(v)) continue;
    sum += v;
    ++n;
  }
  return n > 0 ? sum / n : kNaN;
}

absl::StatusOr<std::string> CoordinatorFollowJobs::Submit(const v1::JobSpec& spec, const std::string& owner) {
  ASSIGN_OR_RETURN(const v1::Job job, core_->SubmitJob(spec, owner));
  return job.job_id();
}

absl::StatusOr<FollowJobView> CoordinatorFollowJobs::View(const std::string& job_id, const std::string& metric) {
  ASSIGN_OR_RETURN(const v1::Job job, core_->GetJob(job_id));
  FollowJobView v;
  v.rows_total = job.images_total();
  v.rows_evaluated = job.images_evaluated();
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED: v.state = FollowJobView::State::kSucceeded; break;
    case v1::JOB_STATE_FAILED: v.state = FollowJobView::State::kFailed; break;
    case v1::JOB_STATE_CANCELLED: v.state = FollowJobView::State::kCancelled; break;
    default: return v;  // Running: the race reads its rows (OrderedValues).
  }
  v.error = job.error();
  if (v.state != FollowJobView::State::kSucceeded) return v;
  std::vector<double> values;
  std::vector<bool> committed;
  RETURN_IF_ERROR(Values(core_, job_id, metric, job.images_total(), &values, &committed));
  // The mean in index order; the interval over the rows in the job's order (random or not).
  const RowOrder order(job.images_total(), job.spec().random_order(), job.spec().order_seed());
  std::vector<double> ordered;
  double sum = 0;
  for (double x : values) {
    if (std::isfinite(x)) sum += x;
  }
  for (int64_t p = 0; p < job.images_total(); ++p) {
    const double x = values[order.IndexAt(p)];
    if (std::isfinite(x)) ordered.push_back(x);
  }
  v.mean = ordered.empty() ? kNaN : sum / static_cast<double>(ordered.size());
  const auto [lo, hi] = BettingMeanCi95(ordered);
  v1::FollowMetric* m = &v.metrics.emplace_back();
  m->set_name(metric);
  m->set_mean(v.mean);
  m->set_lo(lo);
  m->set_hi(hi);
  return v;
}

absl::StatusOr<std::vector<double>> CoordinatorFollowJobs::RowValues(const std::string& job_id, const std::string& metric) {
  ASSIGN_OR_RETURN(const v1::Job job, core_->GetJob(job_id));
  std::vector<double> values;
  std::vector<bool> committed;
  RETURN_IF_ERROR(Values(core_, job_id, metric, job.images_total(), &values, &committed));
  return values;
}

absl::StatusOr<std::vector<std::pair<int64_t, double>>> CoordinatorFollowJobs::OrderedValues(const std::string& job_id,
                                                                                          const std::string& metric,
                                                                                          int64_t first) {
  ASSIGN_OR_RETURN(const v1::Job job, core_->GetJob(job_id));
  std::vector<double> values;
  std::vector<bool> committed;
  RETURN_IF_ERROR(Values(core_, job_id, metric, job.images_total(), &values, &committed));
  const RowOrder order(job.images_total(), job.spec().random_order(), job.spec().order_seed());
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t p = std::max<int64_t>(first, 0); p < job.images_total(); ++p) {
    const int64_t index = order.IndexAt(p);
    if (!committed[index]) break;  // The prefix of the order done so far.
    out.emplace_back(index, values[index]);
  }
  return out;
}

absl::Status CoordinatorFollowJobs::Cancel(const std::string& job_id, const std::string& reason) {
  return core_->CancelJob(job_id).status();
}

}  // namespace tally
