#include "server/follow/follow_manager.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/number_format.h"
#include "common/process/subprocess.h"
#include "base/status_macros.h"
#include "common/job/job_config.h"
#include "server/follow/follow_curve.h"
#include "server/follow/follow_store.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The spec with its defaults filled in (what the record keeps, so a restart decides alike).
void FillDefaults(v1::FollowSpec* s) {
  if (s->pattern().empty()) s->set_pattern("*.pt");
  if (s->load_retries() <= 0) s->set_load_retries(3);
  if (s->catch_up().empty()) s->set_catch_up("newest");
  if (s->metric().empty()) s->set_metric("dice");
}

CheckpointWatchOptions WatchOptions(const v1::FollowSpec& s) {
  CheckpointWatchOptions o;
  o.folder = s.folder();
  o.pattern = s.pattern();
  o.step_regex = s.step_regex();
  o.settle_seconds = s.settle_seconds();
  o.ready_marker = s.ready_marker();
  return o;
}

bool Waiting(const v1::FollowCheckpoint& c) { return c.state() == "queued" || c.state() == "running"; }

void SortByStep(v1::Follow* f) {
  std::sort(f->mutable_checkpoints()->begin(), f->mutable_checkpoints()->end(),
            [](const v1::FollowCheckpoint& a, const v1::FollowCheckpoint& b) {
              return std::make_pair(a.step(), a.name()) < std::make_pair(b.step(), b.name());
            });
}

v1::FollowCheckpoint* FindByName(v1::Follow* f, const std::string& name) {
  for (v1::FollowCheckpoint& c : *f->mutable_checkpoints()) {
    if (c.name() == name) return &c;
  }
  return nullptr;
}

double MetricMean(const v1::FollowCheckpoint& c, const std::string& metric) {
  for (const v1::FollowMetric& m : c.metrics()) {
    if (m.name() == metric) return m.mean();
  }
  return kNaN;
}

FollowCurve CurveOf(const v1::Follow& f) {
  FollowCurve curve;
  curve.follow = f.follow_id();
  curve.folder = f.spec().folder();
  curve.metric = f.spec().metric();
  for (const v1::FollowCheckpoint& c : f.checkpoints()) {
    if (c.state() == "settling") continue;
    CurvePoint p;
    p.step = c.step();
    p.checkpoint = c.name();
    p.job = c.job_id();
    p.rows = c.rows_evaluated();
    p.rows_total = c.rows_total();
    p.decision = c.state();
    p.reason = c.reason();
    p.best_step = f.best_step();
    p.race_rows = c.race_rows();
    p.race_lo = c.race_rows() > 0 ? c.race_lo() : kNaN;
    p.race_hi = c.race_rows() > 0 ? c.race_hi() : kNaN;
    for (const v1::FollowMetric& m : c.metrics()) p.metrics.push_back({m.name(), m.mean(), m.lo(), m.hi()});
    p.landed_unix = c.landed_unix();
    p.taken_unix = c.taken_unix();
    p.decided_unix = c.decided_unix();
    curve.points.push_back(std::move(p));
  }
  return curve;
}

}  // namespace

struct FollowManager::Live {
  v1::Follow record;
  std::unique_ptr<CheckpointWatch> watch;
  double last_activity = 0;
  // The running checkpoint's race: its job, the next order position to pair, the best's values.
  std::unique_ptr<PairedRace> race;
  std::string race_job;
  int64_t race_position = 0;
  // Reading the running job's rows costs time on big sets: the next read waits 20 times as long as
  // the last took (tallyd ticks every 0.2 s: a read of 10 ms or less keeps that pace).
  double race_read_seconds = 0;
  double race_next_unix = 0;
  std::string best_values_job;
  std::vector<double> best_values;
};

FollowManager::FollowManager(JobStore* store, FollowJobs* jobs, std::string state_root)
    : store_(store), jobs_(jobs), state_root_(std::move(state_root)) {}

FollowManager::~FollowManager() {
  stopping_ = true;
  std::vector<std::thread> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks.swap(hooks_);
  }
  for (std::thread& t : hooks) t.join();
}

std::string FollowManager::ReportFolder(const std::string& follow_id) const {
  return absl::StrCat(state_root_, "/", follow_id, "/report");
}

absl::Status FollowManager::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::Follow> follows, LoadFollows(store_));
  absl::MutexLock lock(&mu_);
  for (v1::Follow& f : follows) {
    auto live = std::make_unique<Live>();
    if (f.state() == v1::Follow::FOLLOW_STATE_FOLLOWING) {
      absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(WatchOptions(f.spec()));
      if (!w.ok()) {
        f.set_state(v1::Follow::FOLLOW_STATE_CANCELLED);
        f.set_error(std::string(w.status().message()));
      } else {
        live->watch = std::make_unique<CheckpointWatch>(*std::move(w));
      }
    }
    live->record = std::move(f);
    follows_[live->record.follow_id()] = std::move(live);
    ++next_id_;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Follow> FollowManager::Create(v1::FollowSpec spec, const std::string& owner, double now) {
  FillDefaults(&spec);
  struct stat st;
  if (spec.folder().empty() || spec.folder()[0] != '/' || stat(spec.folder().c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("tally follow: '", spec.folder(), "' is not a folder (an absolute path)"));
  }
  if (spec.catch_up() != "newest" && spec.catch_up() != "all") {
    return absl::InvalidArgumentError(absl::StrCat("--catch-up: expected newest or all, got '", spec.catch_up(), "'"));
  }
  ASSIGN_OR_RETURN(CheckpointWatch watch, CheckpointWatch::Create(WatchOptions(spec)));
  absl::MutexLock lock(&mu_);
  auto live = std::make_unique<Live>();
  v1::Follow& f = live->record;
  const std::string stamp = absl::FormatTime("%Y%m%d-%H%M%S", absl::FromUnixSeconds(static_cast<int64_t>(now)),
                                             absl::UTCTimeZone());
  do {
    f.set_follow_id(absl::StrFormat("f%s-%d", stamp, next_id_++));
  } while (follows_.count(f.follow_id()) > 0);
  *f.mutable_spec() = std::move(spec);
  f.set_state(v1::Follow::FOLLOW_STATE_FOLLOWING);
  f.set_best_step(-1);
  f.set_created_unix(now);
  f.set_owner(owner);
  live->watch = std::make_unique<CheckpointWatch>(std::move(watch));
  live->last_activity = now;
  Save(live.get());
  const v1::Follow out = f;
  follows_[f.follow_id()] = std::move(live);
  return out;
}

absl::StatusOr<v1::Follow> FollowManager::Get(const std::string& follow_id) const {
  absl::MutexLock lock(&mu_);
  auto it = follows_.find(follow_id);
  if (it == follows_.end()) return absl::NotFoundError(absl::StrCat("no follow '", follow_id, "'"));
  return it->second->record;
}

std::vector<v1::Follow> FollowManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Follow> out;
  for (const auto& [id, live] : follows_) out.push_back(live->record);
  return out;
}

absl::StatusOr<v1::Follow> FollowManager::Cancel(const std::string& follow_id) {
  absl::MutexLock lock(&mu_);
  auto it = follows_.find(follow_id);
  if (it == follows_.end()) return absl::NotFoundError(absl::StrCat("no follow '", follow_id, "'"));
  Live* live = it->second.get();
  if (live->record.state() == v1::Follow::FOLLOW_STATE_FOLLOWING) {
    for (v1::FollowCheckpoint& c : *live->record.mutable_checkpoints()) {
      if (c.state() == "running") (void)jobs_->Cancel(c.job_id(), "its follow was cancelled");
      if (Waiting(c)) {
        c.set_state("skipped");
        c.set_reason("the follow was cancelled");
      }
    }
    live->record.set_state(v1::Follow::FOLLOW_STATE_CANCELLED);
    live->watch.reset();
    Save(live);
  }
  return live->record;
}

absl::Status FollowManager::Delete(const std::string& follow_id) {
  absl::MutexLock lock(&mu_);
  auto it = follows_.find(follow_id);
  if (it == follows_.end()) return absl::NotFoundError(absl::StrCat("no follow '", follow_id, "'"));
  if (it->second->record.state() == v1::Follow::FOLLOW_STATE_FOLLOWING) {
    return absl::FailedPreconditionError(absl::StrCat("follow ", follow_id, " is following: cancel it first"));
  }
  for (const v1::FollowCheckpoint& c : it->second->record.checkpoints()) {
    if (c.hook() == "running") return absl::FailedPreconditionError("its --on-new-best command still runs");
  }
  RETURN_IF_ERROR(DeleteFollow(store_, follow_id));
  follows_.erase(it);
  return RemoveTree(absl::StrCat(state_root_, "/", follow_id));
}

void FollowManager::Tick(double now) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, live] : follows_) {
    if (live->record.state() == v1::Follow::FOLLOW_STATE_FOLLOWING && live->watch) TickFollow(live.get(), now);
  }
}

void FollowManager::TickFollow(Live* live, double now) {
  if (live->last_activity == 0) live->last_activity = now;  // Loaded: idle from the restart on.
  bool changed = TakeReady(live, now);
  changed |= CheckRunning(live, now);
  changed |= StartNext(live, now);
  changed |= Finished(live, now);
  if (changed) {
    live->last_activity = now;
    Save(live);
  }
}

bool FollowManager::TakeReady(Live* live, double now) {
  v1::Follow& f = live->record;
  std::set<std::string> done;
  for (const v1::FollowCheckpoint& c : f.checkpoints()) {
    if (c.state() != "settling") done.insert(c.name());
  }
  bool changed = false;
  for (const CheckpointEvent& e : live->watch->Poll(now, done)) {
    v1::FollowCheckpoint* c = FindByName(&f, e.name);
    if (c == nullptr) {
      c = f.add_checkpoints();
      c->set_name(e.name);
      c->set_step(e.step);
      c->set_state("settling");
      c->set_landed_unix(static_cast<double>(e.mtime_ns) / 1e9);
    }
    if (e.kind == CheckpointEvent::Kind::kGone) {
      c->set_state("gone");
      c->set_reason("deleted before it was taken");
      changed = true;
      continue;
    }
    absl::StatusOr<TakenCheckpoint> t = live->watch->Take(e, absl::StrCat(state_root_, "/", f.follow_id(), "/checkpoints"), now);
    if (!t.ok() && absl::IsUnavailable(t.status())) continue;  // Changed or gone meanwhile: it settles again.
    c->set_size(e.size);
    c->set_taken_unix(now);
    if (!t.ok()) {
      c->set_state("failed");
      c->set_reason(std::string(t.status().message()));
    } else {
      c->set_state("queued");
      c->set_taken_path(t->path);
    }
    changed = true;
  }
  if (changed) SortByStep(&f);
  return changed;
}

bool FollowManager::StartNext(Live* live, double now) {
  v1::Follow& f = live->record;
  v1::FollowCheckpoint* next = nullptr;
  for (v1::FollowCheckpoint& c : *f.mutable_checkpoints()) {
    if (c.state() == "running") return false;
    if (c.state() == "queued") next = &c;  // By step: the last is the newest.
  }
  if (next == nullptr) return false;
  if (f.spec().catch_up() == "newest") {
    for (v1::FollowCheckpoint& c : *f.mutable_checkpoints()) {
      if (c.state() == "queued" && &c != next) {
        c.set_state("skipped");
        c.set_reason(absl::StrCat("passed by step ", next->step(), " (--catch-up newest)"));
        c.set_decided_unix(now);
      }
    }
  }
  v1::JobSpec spec = f.spec().job();
  if (ParseModelRef(spec.model()).python) {
    // A Python model's class takes the checkpoint's path as --model-option checkpoint=PATH.
    (*spec.mutable_model_options())["checkpoint"] = next->taken_path();
  } else {
    spec.set_model(next->taken_path());
  }
  spec.clear_model_sha256();
  spec.clear_model_option_sha256();
  spec.set_name(absl::StrCat("follow ", f.follow_id(), " step ", next->step()));
  (*spec.mutable_labels())["follow"] = f.follow_id();
  (*spec.mutable_labels())["step"] = absl::StrCat(next->step());
  if (!f.spec().no_race()) {
    // A seeded random order, fixed before any value is seen: what the race's prefix may use. One
    // order for every checkpoint of the follow, so that their batches are alike and a checkpoint with
    // the same weights as another gives the same bits (a GPU's kernels may change with a batch).
    spec.set_random_order(true);
    spec.set_order_seed(std::hash<std::string>()(f.follow_id()) | 1);
  }
  absl::StatusOr<std::string> job = jobs_->Submit(spec, f.owner());
  if (!job.ok()) {
    next->set_state("failed");
    next->set_reason(absl::StrCat("its job was refused: ", job.status().message()));
    next->set_decided_unix(now);
    return true;
  }
  next->set_state("running");
  next->set_job_id(*job);
  return true;
}

bool FollowManager::CheckRunning(Live* live, double now) {
  v1::Follow& f = live->record;
  v1::FollowCheckpoint* c = nullptr;
  for (v1::FollowCheckpoint& x : *f.mutable_checkpoints()) {
    if (x.state() == "running") c = &x;
  }
  if (c == nullptr) return false;
  absl::StatusOr<FollowJobView> view = jobs_->View(c->job_id(), f.spec().metric());
  if (!view.ok()) {
    c->set_state("failed");
    c->set_reason(absl::StrCat("its job ", c->job_id(), ": ", view.status().message()));
    c->set_decided_unix(now);
    return true;
  }
  c->set_rows_evaluated(view->rows_evaluated);
  c->set_rows_total(view->rows_total);
  switch (view->state) {
    case FollowJobView::State::kRunning: {
      if (f.spec().no_race() || f.best_job().empty() || now < live->race_next_unix) return false;
      const bool decided = Race(live, c, now);
      live->race_next_unix = now + 20 * live->race_read_seconds;
      return decided;
    }
    case FollowJobView::State::kSucceeded:
      if (!f.spec().no_race() && !f.best_job().empty() && Race(live, c, now)) return true;  // Its last rows decided it.
      Decide(live, c, *view, now);
      return true;
    case FollowJobView::State::kCancelled:
      c->set_state("failed");
      c->set_reason("its job was cancelled");
      c->set_decided_unix(now);
      return true;
    case FollowJobView::State::kFailed:
      break;
  }
  // Failed as a whole: the checkpoint did not load (incomplete, or not a model). Again after another
  // settle, up to --load-retries times.
  c->set_load_attempts(c->load_attempts() + 1);
  c->set_reason(view->error);
  if (c->load_attempts() < f.spec().load_retries()) {
    unlink(c->taken_path().c_str());
    c->set_state("settling");
    live->watch->Settle(c->name(), now);
  } else {
    c->set_state("failed");
    c->set_decided_unix(now);
  }
  return true;
}

bool FollowManager::Race(Live* live, v1::FollowCheckpoint* c, double now) {
  const v1::Follow& f = live->record;
  const std::string& metric = f.spec().metric();
  if (live->best_values_job != f.best_job()) {
    absl::StatusOr<std::vector<double>> values = jobs_->RowValues(f.best_job(), metric);
    if (!values.ok()) return false;  // No race this round.
    live->best_values = *std::move(values);
    live->best_values_job = f.best_job();
    live->race_job.clear();
  }
  if (live->race_job != c->job_id()) {
    live->race = std::make_unique<PairedRace>(c->rows_total(), f.spec().race_margin());
    live->race_job = c->job_id();
    live->race_position = 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::pair<int64_t, double>>> rows = jobs_->OrderedValues(c->job_id(), metric, live->race_position);
  live->race_read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!rows.ok()) return false;
  PairedRace& race = *live->race;
  for (const auto& [index, value] : *rows) {
    ++live->race_position;
    const double best = index >= 0 && index < static_cast<int64_t>(live->best_values.size()) ? live->best_values[index] : kNaN;
    if (std::isfinite(value) && std::isfinite(best)) race.Add(value - best);
    if (race.decided_worse()) break;
  }
  c->set_race_rows(race.rows_added());
  const auto [lo, hi] = race.Interval();
  c->set_race_lo(lo);
  c->set_race_hi(hi);
  if (!race.decided_worse()) return false;
  const std::string why = absl::StrFormat("decided worse than step %d after %d of %d rows (mean %s difference in [%.4f, %.4f])",
                                          f.best_step(), race.rows_added(), c->rows_total(), metric, lo, hi);
  (void)jobs_->Cancel(c->job_id(), why);
  c->set_state("worse");
  c->set_reason(why);
  c->set_decided_unix(now);
  return true;
}

void FollowManager::Decide(Live* live, v1::FollowCheckpoint* c, const FollowJobView& view, double now) {
  v1::Follow& f = live->record;
  const std::string& metric = f.spec().metric();
  c->clear_metrics();
  bool named = false;
  for (const v1::FollowMetric& m : view.metrics) named |= m.name() == metric;
  if (!named) {
    v1::FollowMetric* m = c->add_metrics();
    m->set_name(metric);
    m->set_mean(view.mean);
    m->set_lo(kNaN);
    m->set_hi(kNaN);
  }
  for (const v1::FollowMetric& m : view.metrics) *c->add_metrics() = m;
  c->set_decided_unix(now);
  double best = kNaN;
  for (const v1::FollowCheckpoint& b : f.checkpoints()) {
    if (!f.best_job().empty() && b.job_id() == f.best_job()) best = MetricMean(b, metric);
  }
  if (f.best_job().empty() || view.mean > best || (std::isnan(best) && !std::isnan(view.mean))) {
    c->set_state("best");
    f.set_best_step(c->step());
    f.set_best_job(c->job_id());
    StartHook(live, c);
  } else {
    c->set_state("not better");
  }
}

bool FollowManager::Finished(Live* live, double now) {
  v1::Follow& f = live->record;
  bool waiting = false, past = false;
  for (const v1::FollowCheckpoint& c : f.checkpoints()) {
    waiting |= Waiting(c) || c.state() == "settling";
    past |= f.spec().until_step() > 0 && c.step() >= f.spec().until_step() && !Waiting(c) && c.state() != "settling";
  }
  const bool idle = f.spec().idle_seconds() > 0 && now - live->last_activity >= f.spec().idle_seconds();
  if (waiting || !(past || idle)) return false;
  f.set_state(v1::Follow::FOLLOW_STATE_FINISHED);
  live->watch.reset();
  return true;
}

std::vector<FollowGauges> FollowManager::Gauges(double now) const {
  absl::MutexLock lock(&mu_);
  std::vector<FollowGauges> out;
  for (const auto& [id, live] : follows_) {
    const v1::Follow& f = live->record;
    if (f.state() != v1::Follow::FOLLOW_STATE_FOLLOWING) continue;
    FollowGauges g;
    g.follow_id = id;
    g.best_step = f.best_step();
    double oldest = now;
    for (const v1::FollowCheckpoint& c : f.checkpoints()) {
      if (c.state() == "best" || c.state() == "not better" || c.state() == "worse") g.last_step = std::max(g.last_step, c.step());
      if (Waiting(c) || c.state() == "settling") {
        ++g.lag_checkpoints;
        oldest = std::min(oldest, c.landed_unix() > 0 ? c.landed_unix() : now);
      }
    }
    double settling_since = now;  // Checkpoints the watcher sees settling are not in the record yet.
    const int64_t settling = live->watch ? live->watch->Settling(&settling_since) : 0;
    for (const v1::FollowCheckpoint& c : f.checkpoints()) {
      if (c.state() == "settling") --g.lag_checkpoints;  // Sent back to settle: the watcher counts it.
    }
    g.lag_checkpoints += settling;
    if (settling > 0) oldest = std::min(oldest, settling_since);
    g.lag_seconds = std::max(0.0, now - oldest);
    out.push_back(g);
  }
  return out;
}

void FollowManager::StartHook(Live* live, v1::FollowCheckpoint* c) {
  const v1::Follow& f = live->record;
  if (f.spec().on_new_best().empty()) return;
  const std::string dir = absl::StrCat(state_root_, "/", f.follow_id(), "/hooks");
  if (!MakeDirs(dir).ok()) return;
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", f.spec().on_new_best()};
  o.log_path = absl::StrCat(dir, "/", c->step(), "-", c->name(), ".log");
  const v1::FollowMetric m = c->metrics_size() > 0 ? c->metrics(0) : v1::FollowMetric();
  o.env = {{"TALLY_FOLLOW", f.follow_id()},      {"TALLY_STEP", absl::StrCat(c->step())},
           {"TALLY_CHECKPOINT", absl::StrCat(f.spec().folder(), "/", c->name())},
           {"TALLY_TAKEN", c->taken_path()},     {"TALLY_JOB", c->job_id()},
           {"TALLY_METRIC", f.spec().metric()},  {"TALLY_METRIC_VALUE", FormatDouble(m.mean())},
           {"TALLY_METRIC_LO", FormatDouble(m.lo())}, {"TALLY_METRIC_HI", FormatDouble(m.hi())}};
  c->set_hook("running");
  hooks_.emplace_back([this, o, id = f.follow_id(), name = c->name()] {
    std::string outcome;
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(o);
    if (!p.ok()) {
      outcome = absl::StrCat("did not start: ", p.status().message());
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
      while ((*p)->Running() && !stopping_ && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if ((*p)->Running()) (*p)->Terminate(2.0);
      outcome = absl::StrCat((*p)->ExitDescription(), ": ", TailOfFile(o.log_path, 1000));
    }
    HookDone(id, name, outcome);
  });
}

void FollowManager::HookDone(const std::string& follow_id, const std::string& name, const std::string& outcome) {
  absl::MutexLock lock(&mu_);
  auto it = follows_.find(follow_id);
  if (it == follows_.end()) return;
  v1::FollowCheckpoint* c = FindByName(&it->second->record, name);
  if (c == nullptr) return;
  c->set_hook(outcome);
  Save(it->second.get());
}

void FollowManager::Save(Live* live) {
  // A decided checkpoint that never became the best needs its copy no more: checkpoints are big, and a
  // follow may see hundreds. The best ones' stay (the hook's TALLY_TAKEN; what a user would re-run).
  for (const v1::FollowCheckpoint& c : live->record.checkpoints()) {
    const std::string& st = c.state();
    if (!c.taken_path().empty() && (st == "worse" || st == "not better" || st == "failed")) unlink(c.taken_path().c_str());
  }
  if (absl::Status s = SaveFollow(store_, live->record); !s.ok()) Log("follow ", live->record.follow_id(), ": ", s.message());
  if (absl::Status s = WriteCurveFiles(CurveOf(live->record), ReportFolder(live->record.follow_id())); !s.ok()) {
    Log("follow ", live->record.follow_id(), ": ", s.message());
  }
}

}  // namespace tally
