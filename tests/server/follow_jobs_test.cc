// The coordinator's jobs as a follow sees them (server/follow/follow_jobs.h), over a real
// coordinator driven by hand (a fake clock, a worker that reports made-up counts): a job's rows in
// its seeded order up to the first not yet done, its per-row Dice, and its mean once finished, each
// against values computed here from the counts.
#include "server/follow/follow_jobs.h"

#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "common/job/row_order.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

class FollowJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/follow_jobs_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    std::ofstream(dir_ + "/model.pt") << "a checkpoint";
    std::ofstream m(dir_ + "/manifest.csv");
    m << "image,mask\n";
    for (int i = 0; i < 10; ++i) m << "img" << i << ".png,mask" << i << ".png\n";
    m.close();
    CoordinatorOptions o;
    o.state_dir = dir_ + "/state";
    o.clock = [this] { return now_; };
    o.background_thread = false;
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = std::move(*c);
    v1::RegisterWorkerRequest r;
    r.set_name("w");
    r.set_device("cpu");
    worker_ = core_->RegisterWorker(r)->worker_id();
  }
  void TearDown() override {
    core_.reset();
    (void)system(("rm -rf '" + dir_ + "'").c_str());
  }
  v1::ShardAssignment Acquire() {
    v1::AcquireShardRequest r;
    r.set_worker_id(worker_);
    return core_->AcquireShard(r)->assignment();
  }
  // Class 1: tp = 1 + index % 3, fp = index % 2, fn = 1 (Dice 2tp / (2tp + fp + fn)); class 0 empty.
  static double Dice1(int64_t index) {
    const double tp = 1 + index % 3, fp = index % 2, fn = 1;
    return 2 * tp / (2 * tp + fp + fn);
  }
  void Complete(const v1::ShardAssignment& a) {
    v1::ReportResultsRequest r;
    r.set_worker_id(worker_);
    r.set_job_id(a.job_id());
    r.set_shard_id(a.shard_id());
    r.set_lease_id(a.lease_id());
    r.set_num_classes(2);
    r.set_shard_complete(true);
    for (const auto& row : a.rows()) {
      v1::ImageResult* ir = r.add_results();
      ir->set_index(row.index());
      ir->set_height(4);
      ir->set_width(4);
      ir->add_classes()->set_tn(16);
      v1::ClassResult* c = ir->add_classes();
      c->set_tp(1 + row.index() % 3);
      c->set_fp(row.index() % 2);
      c->set_fn(1);
      c->set_tn(16 - c->tp() - c->fp() - c->fn());
    }
    ASSERT_TRUE(core_->ReportResults(r).ok());
  }

  std::string dir_, worker_;
  double now_ = 1000;
  std::unique_ptr<Coordinator> core_;
};

TEST_F(FollowJobsTest, OrderedPrefixRowValuesAndTheMean) {
  CoordinatorFollowJobs jobs(core_.get());
  v1::JobSpec spec;
  spec.set_model(dir_ + "/model.pt");
  spec.set_manifest(dir_ + "/manifest.csv");
  spec.set_shard_size(2);
  spec.set_batch_size(2);
  spec.set_random_order(true);
  spec.set_order_seed(77);
  absl::StatusOr<std::string> id = jobs.Submit(spec, "");
  ASSERT_TRUE(id.ok()) << id.status();
  const RowOrder order(10, true, 77);
  std::vector<v1::ShardAssignment> shards;
  for (int i = 0; i < 5; ++i) shards.push_back(Acquire());
  Complete(shards[0]);
  Complete(shards[2]);  // Positions 4, 5: not yet part of the prefix.
  auto prefix = jobs.OrderedValues(*id, "dice", 0);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  ASSERT_EQ(prefix->size(), 2u);
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ((*prefix)[p].first, order.IndexAt(p));
    EXPECT_DOUBLE_EQ((*prefix)[p].second, Dice1(order.IndexAt(p)));
  }
  Complete(shards[1]);
  prefix = jobs.OrderedValues(*id, "dice", 2);
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(prefix->size(), 4u);  // Positions 2..5.
  absl::StatusOr<FollowJobView> view = jobs.View(*id, "dice");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->state, FollowJobView::State::kRunning);
  Complete(shards[3]);
  Complete(shards[4]);
  core_->RunFinalizers();  // The report, then the job's end (the background thread's work).
  view = jobs.View(*id, "dice");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->state, FollowJobView::State::kSucceeded);
  double sum = 0;
  for (int i = 0; i < 10; ++i) sum += Dice1(i);
  EXPECT_NEAR(view->mean, sum / 10, 1e-15);
  ASSERT_EQ(view->metrics.size(), 1u);
  EXPECT_LE(view->metrics[0].lo(), view->mean);  // 10 rows: the betting interval is given.
  EXPECT_GE(view->metrics[0].hi(), view->mean);
  absl::StatusOr<std::vector<double>> values = jobs.RowValues(*id, "dice:1");
  ASSERT_TRUE(values.ok());
  for (int i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ((*values)[i], Dice1(i)) << i;
  // Class 0 is empty everywhere: NaN under --empty-score nan, and "dice:0" has no value.
  values = jobs.RowValues(*id, "dice:0");
  ASSERT_TRUE(values.ok());
  EXPECT_TRUE(std::isnan((*values)[3]));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckFollowMetric("hd95")));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckFollowMetric("dice:x")));
  EXPECT_TRUE(CheckFollowMetric("iou:2").ok());
}

}  // namespace
}  // namespace tally
