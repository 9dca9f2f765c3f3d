// Follows (server/follow/follow_manager.h) against a fake trainer writing real files and fake jobs
// whose per-row Dice comes from the checkpoint's bytes: every complete checkpoint is evaluated once,
// a broken one is retried and then failed with the loader's reason, a clearly worse one is stopped
// by the race after a fraction of its rows, the best is kept, and a restarted manager (a new tallyd
// on the same database) goes on where the last one was.
#include "server/follow/follow_manager.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "base/file_util.h"
#include "store_fixture.h"

namespace tally {
namespace {

constexpr int64_t kRows = 400;

// Jobs whose model file holds "quality Q" (each row's Dice Q plus a fixed per-row wobble) or
// anything else (a model that does not load). Each View moves a running job `step` rows on.
class FakeJobs : public FollowJobs {
 public:
  struct Job {
    v1::JobSpec spec;
    std::string content;
    std::vector<int64_t> order;
    int64_t done = 0;
    bool cancelled = false;
  };
  int64_t step = 40;
  std::map<std::string, Job> jobs;
  std::map<std::string, int> submits;  // By the checkpoint's file name.

  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec, const std::string&) override {
    Job j;
    j.spec = spec;
    absl::StatusOr<std::string> bytes = ReadFileToString(spec.model());
    j.content = bytes.ok() ? *bytes : "";
    j.order.resize(kRows);
    std::iota(j.order.begin(), j.order.end(), 0);
    if (spec.random_order()) std::shuffle(j.order.begin(), j.order.end(), std::mt19937_64(spec.order_seed()));
    const std::string id = "j" + std::to_string(jobs.size() + 1);
    const std::string file = spec.model().substr(spec.model().rfind('/') + 1);  // <step>-<name>.
    ++submits[file.substr(file.find('-') + 1)];
    jobs[id] = std::move(j);
    return id;
  }
  static double Value(const Job& j, int64_t row) {
    const double q = std::stod(j.content.substr(8));
    return std::clamp(q + 0.1 * std::sin(static_cast<double>(row) * 1.7), 0.0, 1.0);
  }
  bool Loads(const Job& j) const { return j.content.rfind("quality ", 0) == 0; }
  absl::StatusOr<FollowJobView> View(const std::string& id, const std::string&) override {
    Job& j = jobs.at(id);
    FollowJobView v;
    v.rows_total = kRows;
    if (!Loads(j)) {
      v.state = FollowJobView::State::kFailed;
      v.error = "model '" + j.spec.model() + "' is not TorchScript (the loader: unexpected end of file)";
      return v;
    }
    if (!j.cancelled) j.done = std::min(kRows, j.done + step);
    v.rows_evaluated = j.done;
    // Summed in index order, whatever the evaluation's order (Tally's sums are exact: any order).
    std::vector<int64_t> rows(j.order.begin(), j.order.begin() + j.done);
    std::sort(rows.begin(), rows.end());
    double sum = 0;
    for (int64_t r : rows) sum += Value(j, r);
    v.mean = j.done > 0 ? sum / static_cast<double>(j.done) : 0;
    v.state = j.cancelled ? FollowJobView::State::kCancelled
                          : j.done == kRows ? FollowJobView::State::kSucceeded : FollowJobView::State::kRunning;
    return v;
  }
  absl::StatusOr<std::vector<double>> RowValues(const std::string& id, const std::string&) override {
    const Job& j = jobs.at(id);
    std::vector<double> out(kRows);
    for (int64_t r = 0; r < kRows; ++r) out[r] = Value(j, r);
    return out;
  }
  absl::StatusOr<std::vector<std::pair<int64_t, double>>> OrderedValues(const std::string& id, const std::string&,
                                                                     int64_t first) override {
    const Job& j = jobs.at(id);
    std::vector<std::pair<int64_t, double>> out;
    for (int64_t p = first; p < j.done; ++p) out.emplace_back(j.order[p], Value(j, j.order[p]));
    return out;
  }
  absl::Status Cancel(const std::string& id, const std::string&) override {
    jobs.at(id).cancelled = true;
    return absl::OkStatus();
  }
};

class FollowManagerTest : public StoreFixture {
 protected:
  FollowManagerTest() : StoreFixture("follow_manager") {}
  void SetUp() override {
    StoreFixture::SetUp();
    runs_ = dir_ + "/runs";
    ASSERT_TRUE(MakeDirs(runs_).ok());
  }
  void Write(const std::string& name, const std::string& content) {
    std::ofstream(runs_ + "/" + name, std::ios::binary | std::ios::trunc) << content;
  }
  v1::FollowSpec Spec() {
    v1::FollowSpec s;
    s.set_folder(runs_);
    s.set_settle_seconds(5);
    s.mutable_job()->set_manifest("/data/val.csv");
    return s;
  }
  // Ticks once a second from `from` for `seconds`.
  static double Run(FollowManager* m, double from, double seconds) {
    for (double t = from; t < from + seconds; t += 1) m->Tick(t);
    return from + seconds;
  }
  static std::map<std::string, v1::FollowCheckpoint> ByName(const v1::Follow& f) {
    std::map<std::string, v1::FollowCheckpoint> out;
    for (const v1::FollowCheckpoint& c : f.checkpoints()) out[c.name()] = c;
    return out;
  }

  std::string runs_;
  FakeJobs jobs_;
};

TEST_F(FollowManagerTest, EveryCheckpointOnceTheWorseStoppedTheBrokenFailedAfterItsRetries) {
  FollowManager m(store_.get(), &jobs_, dir_ + "/follows");
  absl::StatusOr<v1::Follow> f = m.Create(Spec(), "alice", 1000);
  ASSERT_TRUE(f.ok()) << f.status();
  double t = 1000;
  Write("ckpt-100.pt", "quality 0.5");
  t = Run(&m, t, 30);
  Write("ckpt-200.pt", "quality 0.7");
  t = Run(&m, t, 30);
  Write("ckpt-300.pt", "quality 0.3");  // Clearly worse than 200.
  t = Run(&m, t, 30);
  Write("ckpt-400.pt", "truncated");     // Never loads.
  t = Run(&m, t, 60);
  Write("ckpt-500.pt", "quality 0.7");  // As good as 200: not better, and never decided worse.
  t = Run(&m, t, 40);
  absl::StatusOr<v1::Follow> now = m.Get(f->follow_id());
  ASSERT_TRUE(now.ok());
  auto c = ByName(*now);
  EXPECT_EQ(c["ckpt-100.pt"].state(), "best");
  EXPECT_EQ(c["ckpt-200.pt"].state(), "best");
  EXPECT_EQ(c["ckpt-300.pt"].state(), "worse");
  EXPECT_LT(c["ckpt-300.pt"].race_rows(), kRows / 4);
  EXPECT_LT(c["ckpt-300.pt"].race_hi(), 0);
  EXPECT_EQ(c["ckpt-400.pt"].state(), "failed");
  EXPECT_EQ(c["ckpt-400.pt"].load_attempts(), 3);
  EXPECT_NE(c["ckpt-400.pt"].reason().find("is not TorchScript"), std::string::npos);
  EXPECT_EQ(c["ckpt-500.pt"].state(), "not better");
  EXPECT_EQ(now->best_step(), 200);
  EXPECT_EQ(jobs_.submits, (std::map<std::string, int>{
                               {"ckpt-100.pt", 1}, {"ckpt-200.pt", 1}, {"ckpt-300.pt", 1}, {"ckpt-400.pt", 3},
                               {"ckpt-500.pt", 1}}));
  // The curve's numbers are each checkpoint's own.
  absl::StatusOr<std::string> csv = ReadFileToString(m.ReportFolder(f->follow_id()) + "/curve.csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("200,ckpt-200.pt,j2,400,400,best,"), std::string::npos) << *csv;
  EXPECT_NE(csv->find("300,ckpt-300.pt,j3,"), std::string::npos);
}

TEST_F(FollowManagerTest, ARestartedManagerGoesOnWhereTheLastWas) {
  std::string id;
  double t = 2000;
  {
    FollowManager m(store_.get(), &jobs_, dir_ + "/follows");
    absl::StatusOr<v1::Follow> f = m.Create(Spec(), "", t);
    ASSERT_TRUE(f.ok());
    id = f->follow_id();
    Write("a-1.pt", "quality 0.4");
    t = Run(&m, t, 30);
    Write("a-2.pt", "quality 0.6");
    t = Run(&m, t, 8);  // a-2 taken, its job running when tallyd stops.
  }
  Write("a-3.pt", "quality 0.8");  // Lands while tallyd is down.
  FollowManager m(store_.get(), &jobs_, dir_ + "/follows");
  ASSERT_TRUE(m.Load().ok());
  t = Run(&m, t + 60, 60);
  absl::StatusOr<v1::Follow> f = m.Get(id);
  ASSERT_TRUE(f.ok());
  auto c = ByName(*f);
  EXPECT_EQ(c["a-1.pt"].state(), "best");
  EXPECT_EQ(c["a-2.pt"].state(), "best");
  EXPECT_EQ(c["a-3.pt"].state(), "best");
  EXPECT_EQ(f->best_step(), 3);
  EXPECT_EQ(jobs_.submits, (std::map<std::string, int>{{"a-1.pt", 1}, {"a-2.pt", 1}, {"a-3.pt", 1}}));
}

TEST_F(FollowManagerTest, BehindTheTrainerTheNewestGoesFirstAndIdleEndsTheFollow) {
  for (const char* catch_up : {"newest", "all"}) {
    FakeJobs jobs;
    const std::string folder = runs_ + "/" + catch_up;
    ASSERT_TRUE(MakeDirs(folder).ok());
    for (int i = 1; i <= 3; ++i) std::ofstream(folder + "/c-" + std::to_string(i) + ".pt") << "quality 0.5";
    FollowManager m(store_.get(), &jobs, dir_ + "/follows_" + catch_up);
    v1::FollowSpec spec = Spec();
    spec.set_folder(folder);
    spec.set_catch_up(catch_up);
    spec.set_idle_seconds(30);
    ASSERT_TRUE(m.Create(spec, "", 0).ok());
    Run(&m, 0, 120);
    const v1::Follow f = m.List()[0];
    auto c = ByName(f);
    EXPECT_EQ(c["c-3.pt"].job_id(), "j1") << catch_up;  // The newest first.
    if (std::string(catch_up) == "newest") {
      EXPECT_EQ(c["c-1.pt"].state(), "skipped");
      EXPECT_EQ(c["c-1.pt"].reason(), "passed by step 3 (--catch-up newest)");
      EXPECT_EQ(jobs.jobs.size(), 1u);
    } else {
      EXPECT_EQ(c["c-2.pt"].job_id(), "j2");
      EXPECT_EQ(c["c-1.pt"].job_id(), "j3");
    }
    EXPECT_EQ(f.state(), v1::Follow::FOLLOW_STATE_FINISHED) << catch_up;
  }
}

TEST_F(FollowManagerTest, ANewBestRunsTheHookAndTheGaugesSayHowFarBehind) {
  FollowManager m(store_.get(), &jobs_, dir_ + "/follows");
  v1::FollowSpec spec = Spec();
  const std::string out = dir_ + "/hook.txt";
  spec.set_on_new_best("echo \"$TALLY_STEP $TALLY_METRIC $TALLY_METRIC_VALUE ${TALLY_CHECKPOINT##*/}\" >> " + out);
  absl::StatusOr<v1::Follow> f = m.Create(spec, "", 0);
  ASSERT_TRUE(f.ok());
  Write("c-1.pt", "quality 0.5");
  m.Tick(0);
  std::vector<FollowGauges> g = m.Gauges(3);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].last_step, -1);
  EXPECT_EQ(g[0].lag_checkpoints, 1);  // Settling.
  EXPECT_EQ(g[0].lag_seconds, 3);
  Run(&m, 1, 40);
  Write("c-2.pt", "quality 0.3");  // Worse: no hook.
  Run(&m, 41, 40);
  Write("c-3.pt", "quality 0.6");
  Run(&m, 81, 40);
  g = m.Gauges(130);
  EXPECT_EQ(g[0].best_step, 3);
  EXPECT_EQ(g[0].last_step, 3);
  EXPECT_EQ(g[0].lag_checkpoints, 0);
  EXPECT_EQ(g[0].lag_seconds, 0);
  // The hooks run on threads of their own: their lines, and the outcome in the record.
  std::string text;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<v1::Follow> now = m.Get(f->follow_id());
    bool done = now.ok();
    for (const v1::FollowCheckpoint& c : now->checkpoints()) done &= c.state() != "best" || c.hook() != "running";
    absl::StatusOr<std::string> read = ReadFileToString(out);
    if (done && read.ok()) {
      text = *read;
      break;
    }
    usleep(20000);
  }
  // c-1 was the best (0.5 before it), c-2 worse (no hook), c-3 the best (0.6).
  EXPECT_EQ(text.rfind("1 dice 0.49", 0), 0u) << text;  // The fake's mean: a little under its quality.
  EXPECT_EQ(text.find("\n2 dice"), std::string::npos) << text;
  EXPECT_NE(text.find("\n3 dice 0.59"), std::string::npos) << text;
  EXPECT_NE(text.find("c-3.pt"), std::string::npos) << text;
}

}  // namespace
}  // namespace tally
