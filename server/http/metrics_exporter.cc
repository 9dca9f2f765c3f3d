#include "server/http/metrics_exporter.h"

#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/build_info.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "base/clock.h"

namespace tally {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddValue(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

MetricFamily Single(const char* name, const char* help, MetricType type, double value) {
  MetricFamily f = Family(name, help, type);
  AddValue(&f, value);
  return f;
}

// The commit-latency histogram (cumulative buckets, as Prometheus wants them).
MetricFamily CommitLatency(const CoordinatorMetrics& m) {
  MetricFamily commit = Family("tally_commit_latency_seconds",
                               "Time to commit one batch of results to the database (one SQLite transaction).",
                               MetricType::Histogram);
  ClientMetric h;
  h.histogram.sample_count = m.commit_count;
  h.histogram.sample_sum = m.commit_seconds_sum;
  for (size_t i = 0; i < m.commit_bounds.size(); ++i) {
    h.histogram.bucket.push_back({m.commit_counts[i], m.commit_bounds[i]});
  }
  h.histogram.bucket.push_back({m.commit_count, std::numeric_limits<double>::infinity()});
  commit.metric.push_back(std::move(h));
  return commit;
}

// Per worker in service: its rows, rate, lease and GPUs' memory, from its latest heartbeat.
void AddWorkerFamilies(const CoordinatorMetrics& m, std::vector<MetricFamily>* out) {
  MetricFamily w_images = Family("tally_worker_images_total",
                                 "Rows a worker produced results for since it started (its latest heartbeat).",
                                 MetricType::Counter);
  MetricFamily w_rate = Family("tally_worker_images_per_second",
                               "Rows per second a worker produced over its last 10 s (its latest heartbeat).",
                               MetricType::Gauge);
  MetricFamily w_busy = Family("tally_worker_busy", "1 while the worker holds a shard lease.", MetricType::Gauge);
  MetricFamily g_used = Family("tally_worker_gpu_memory_used_bytes",
                               "Memory in use on a worker's GPU, the whole device's (total - free).", MetricType::Gauge);
  MetricFamily g_total = Family("tally_worker_gpu_memory_total_bytes", "A worker's GPU memory.", MetricType::Gauge);
  MetricFamily g_peak = Family("tally_worker_gpu_memory_peak_bytes",
                               "The most the worker's allocator (or its Python stub's) reserved on the GPU.",
                               MetricType::Gauge);
  for (const CoordinatorMetrics::Worker& w : m.workers) {
    const std::vector<ClientMetric::Label> who = {{"worker", w.name}, {"worker_id", w.worker_id}};
    AddValue(&w_images, static_cast<double>(w.gauges.images_total()), who);
    AddValue(&w_rate, w.gauges.images_per_second(), who);
    AddValue(&w_busy, w.busy ? 1 : 0, who);
    for (const v1::GpuStats& g : w.gauges.gpus()) {
      std::vector<ClientMetric::Label> labels = who;
      labels.push_back({"device", g.device()});
      labels.push_back({"gpu", g.name()});
      AddValue(&g_used, static_cast<double>(g.memory_used_bytes()), labels);
      AddValue(&g_total, static_cast<double>(g.memory_total_bytes()), labels);
      AddValue(&g_peak, static_cast<double>(g.peak_memory_bytes()), labels);
    }
  }
  for (MetricFamily* f : {&w_images, &w_rate, &w_busy, &g_used, &g_total, &g_peak}) out->push_back(std::move(*f));
}

// Per running job and class: the live mean Dice over the committed rows and its 95% half-width.
void AddLiveFamilies(const CoordinatorMetrics& m, std::vector<MetricFamily>* out) {
  MetricFamily mean = Family("tally_job_dice_estimate",
                             "A running job's mean Dice of a class over the rows committed so far.", MetricType::Gauge);
  MetricFamily half = Family("tally_job_dice_half_width",
                             "The 95% interval half-width of tally_job_dice_estimate (docs/metrics.md: Answers before the end).",
                             MetricType::Gauge);
  MetricFamily rows = Family("tally_job_dice_rows", "Rows behind tally_job_dice_estimate.", MetricType::Gauge);
  for (const auto& [job_id, estimates] : m.live) {
    for (const v1::LiveEstimate& e : estimates) {
      const std::vector<ClientMetric::Label> labels = {{"job", job_id}, {"class", std::to_string(e.class_id())}};
      AddValue(&mean, e.dice_mean(), labels);
      AddValue(&half, e.dice_half_width(), labels);
      AddValue(&rows, static_cast<double>(e.rows()), labels);
    }
  }
  for (MetricFamily* f : {&mean, &half, &rows}) out->push_back(std::move(*f));
}

void AddFollowFamilies(const std::vector<FollowGauges>& follows, std::vector<MetricFamily>* out) {
  MetricFamily last = Family("tally_follow_last_step", "A follow's largest checkpoint step evaluated (-1: none yet).",
                             MetricType::Gauge);
  MetricFamily best = Family("tally_follow_best_step", "A follow's best checkpoint's step (-1: none yet).",
                             MetricType::Gauge);
  MetricFamily lag = Family("tally_follow_lag_checkpoints",
                            "Checkpoints of a follow's trainer not decided yet (settling, queued or running).",
                            MetricType::Gauge);
  MetricFamily lag_s = Family("tally_follow_lag_seconds",
                              "Seconds since the oldest checkpoint not decided yet landed (0: none).", MetricType::Gauge);
  for (const FollowGauges& g : follows) {
    AddValue(&last, static_cast<double>(g.last_step), {{"follow", g.follow_id}});
    AddValue(&best, static_cast<double>(g.best_step), {{"follow", g.follow_id}});
    AddValue(&lag, static_cast<double>(g.lag_checkpoints), {{"follow", g.follow_id}});
    AddValue(&lag_s, g.lag_seconds, {{"follow", g.follow_id}});
  }
  for (MetricFamily* f : {&last, &best, &lag, &lag_s}) out->push_back(std::move(*f));
}

}  // namespace

std::vector<MetricFamily> BuildMetricFamilies(const CoordinatorMetrics& m, const std::vector<FollowGauges>& follows) {
  std::vector<MetricFamily> out;
  MetricFamily info = Family("tally_build_info", "Tally's version and revision (value 1).", MetricType::Gauge);
  AddValue(&info, 1, {{"version", kTallyVersion}, {"revision", kGitRevision}});
  out.push_back(std::move(info));

  MetricFamily jobs = Family("tally_jobs", "Jobs in tallyd's database, by state.", MetricType::Gauge);
  for (const auto& [state, n] : m.jobs_by_state) AddValue(&jobs, static_cast<double>(n), {{"state", state}});
  out.push_back(std::move(jobs));

  MetricFamily images = Family("tally_images_total",
                               "Manifest rows committed since tallyd started, by outcome (evaluated, or failed with a reason).",
                               MetricType::Counter);
  AddValue(&images, static_cast<double>(m.images_evaluated), {{"outcome", "evaluated"}});
  AddValue(&images, static_cast<double>(m.images_failed), {{"outcome", "failed"}});
  out.push_back(std::move(images));
  out.push_back(Single("tally_images_remaining", "Rows of unfinished jobs without a committed result.",
                       MetricType::Gauge, static_cast<double>(m.images_remaining)));

  out.push_back(Single("tally_shards_leased_total", "Shard leases granted to workers.", MetricType::Counter,
                       static_cast<double>(m.shards_leased)));
  out.push_back(Single("tally_shards_expired_total",
                       "Shard leases taken back from workers that went silent or made no progress.",
                       MetricType::Counter, static_cast<double>(m.shards_expired)));
  out.push_back(Single("tally_shards_speculated_total",
                       "Speculative copies of straggling shards granted to idle workers (--speculate-after).",
                       MetricType::Counter, static_cast<double>(m.shards_speculated)));
  out.push_back(Single("tally_shards_retried_total",
                       "Shards queued again: leases that ended without a commit, or the single rows a lost shard was split into.",
                       MetricType::Counter, static_cast<double>(m.shards_retried)));

  out.push_back(Single("tally_workers_registered", "Workers in service.", MetricType::Gauge,
                       static_cast<double>(m.workers_registered)));
  out.push_back(Single("tally_workers_busy", "Workers in service holding a shard lease.", MetricType::Gauge,
                       static_cast<double>(m.workers_busy)));
  out.push_back(Single("tally_workers_out_of_service", "Workers taken out of service (device or model problems).",
                       MetricType::Gauge, static_cast<double>(m.workers_out_of_service)));

  out.push_back(CommitLatency(m));

  out.push_back(Single("tally_database_bytes", "Size of tally.db and its write-ahead log.", MetricType::Gauge,
                       static_cast<double>(m.database_bytes)));

  AddWorkerFamilies(m, &out);
  AddLiveFamilies(m, &out);
  AddFollowFamilies(follows, &out);
  return out;
}

class MetricsExporter::Collector : public prometheus::Collectable {
 public:
  Collector(Coordinator* core, const FollowManager* follows) : core_(core), follows_(follows) {}
  std::vector<MetricFamily> Collect() const override {
    return BuildMetricFamilies(core_->Metrics(),
                               follows_ != nullptr ? follows_->Gauges(NowUnix()) : std::vector<FollowGauges>());
  }

 private:
  Coordinator* const core_;
  const FollowManager* const follows_;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const std::string& listen, Coordinator* core,
                                                                       const FollowManager* follows) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ = std::make_shared<Collector>(core, follows);
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on '", listen, "': ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->collector_, "/metrics");
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  return e;
}

MetricsExporter::~MetricsExporter() {
  // Stop serving before the collector (and the coordinator behind it) go away.
  exposer_.reset();
}

}  // namespace tally
