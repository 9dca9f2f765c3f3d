// Restarts and ended leases: a job resumed from the database, workers and their leases handed
// to the next coordinator, and rows that arrive under a lease that ended or that the restart
// forgot, each counted once and never ending a job before its last shard is in.
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator_fixture.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

TEST_F(CoordinatorTest, ResumesAnUnfinishedJobFromTheDatabase) {
  auto job = core_->SubmitJob(Spec(4, 1));
  const std::string w = Register("w");
  Complete(w, Acquire(w));
  v1::ShardAssignment half = Acquire(w);
  Complete(w, half, /*complete=*/false);  // Results committed, shard not marked complete.
  Restart();                                // The coordinator dies and comes back.
  auto j = core_->GetJob(job->job_id());
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->images_evaluated(), 8);
  const std::string w2 = Register("w2");
  v1::ShardAssignment rest = Acquire(w2);
  EXPECT_EQ(rest.begin(), 8);
  EXPECT_FALSE(Acquire(w2).has_spec());
  Complete(w2, rest);
  core_->RunFinalizers();
  j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(j->images_evaluated(), 10);
}

// A shard queued again after its lease ended (here: its worker stopped listing it) whose rows then
// arrive under the old lease is done, and leaves the queue: leasing it again would count it done a
// second time, and the job would end with a shard never evaluated.
TEST_F(CoordinatorTest, AShardDoneUnderAnEndedLeaseIsNotLeasedAgain) {
  auto job = core_->SubmitJob(Spec(4, 1));  // Shards [0, 4), [4, 8), [8, 10).
  const std::string w = Register("w");
  v1::ShardAssignment first = Acquire(w);
  ASSERT_EQ(first.begin(), 0);
  now_ += 11;
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w);
  ASSERT_TRUE(core_->Heartbeat(hb).ok());  // It no longer lists its lease: queued again.
  EXPECT_TRUE(Complete(w, first).abandon());  // Its rows, under the ended lease: committed.
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 4);
  const std::string w2 = Register("w2");
  v1::ShardAssignment second = Acquire(w2);
  EXPECT_EQ(second.begin(), 4);
  Complete(w2, second);
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_RUNNING);  // [8, 10) is still to come.
  v1::ShardAssignment third = Acquire(w2);
  EXPECT_EQ(third.begin(), 8);
  EXPECT_FALSE(Acquire(w2).has_spec());
  Complete(w2, third);
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
  EXPECT_THAT(ReadReport(job->job_id(), "report.json"), HasSubstr("\"images_evaluated\": 10"));
}

// The same after a restart: a lease granted after the last handoff save is unknown to the next
// coordinator, which queues its shard; the worker's rows for it arrive under that lease. Seen as a
// job that succeeded without its last two shards after tallyd was killed and restarted.
TEST_F(CoordinatorTest, AShardDoneUnderALeaseTheRestartForgotIsNotLeasedAgain) {
  auto job = core_->SubmitJob(Spec(4, 1));
  const std::string w = Register("w");
  ASSERT_TRUE(core_->SaveHandoff(false).ok());  // Saved while serving, before the lease below.
  v1::ShardAssignment first = Acquire(w);
  Restart();
  auto beat = core_->Heartbeat(Beat(w, first));
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->revoked_size(), 1);  // Not a lease this coordinator knows.
  EXPECT_TRUE(Complete(w, first).abandon());
  std::set<int64_t> begins;
  for (int k = 0; k < 2; ++k) {
    v1::ShardAssignment a = Acquire(w);
    begins.insert(a.begin());
    core_->RunFinalizers();
    EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_RUNNING);
    Complete(w, a);
  }
  EXPECT_EQ(begins, (std::set<int64_t>{4, 8}));
  EXPECT_FALSE(Acquire(w).has_spec());
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
}

// A graceful stop hands the workers and their leases to the next coordinator: the worker's results
// for its lease are accepted after the restart, its shard is leased to nobody else meanwhile.
TEST_F(CoordinatorTest, WorkersAndTheirLeasesSurviveARestart) {
  auto job = core_->SubmitJob(Spec(5, 1));
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  core_->BeginDrain();
  EXPECT_FALSE(core_->Serving());
  EXPECT_FALSE(Acquire(w).has_spec());  // Draining: no new lease.
  EXPECT_EQ(core_->LeasesOutstanding(), 1);
  ASSERT_TRUE(core_->SaveHandoff(true).ok());
  Restart();
  v1::HeartbeatRequest hb = Beat(w, a);
  auto beat = core_->Heartbeat(hb);
  ASSERT_TRUE(beat.ok());
  EXPECT_FALSE(beat->reregister());
  EXPECT_EQ(beat->revoked_size(), 0);
  const std::string w2 = Register("w2");
  v1::ShardAssignment other = Acquire(w2);
  EXPECT_NE(other.shard_id(), a.shard_id());
  EXPECT_FALSE(Complete(w, a).abandon());
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 5);
}

// A handed-over worker that does not come back loses its shards after a lease period, with no
// attempt counted: the shard goes to another whole, not split into suspect rows.
TEST_F(CoordinatorTest, AHandedOverWorkerThatDoesNotComeBackLosesItsShardsWhole) {
  ASSERT_TRUE(core_->SubmitJob(Spec(5, 1)).ok());
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  ASSERT_TRUE(core_->SaveHandoff(false).ok());
  Restart();
  const std::string w2 = Register("w2");
  v1::ShardAssignment b = Acquire(w2);
  EXPECT_NE(b.shard_id(), a.shard_id());
  now_ += 11;
  v1::HeartbeatRequest hb = Beat(w2, b);
  ASSERT_TRUE(core_->Heartbeat(hb).ok());
  core_->ExpireLeases();
  Complete(w2, b);
  v1::ShardAssignment again = Acquire(w2);
  EXPECT_EQ(again.shard_id(), a.shard_id());
  EXPECT_EQ(again.rows_size(), 5);  // Whole: not split into single suspect rows.
  EXPECT_GT(again.lease_id(), a.lease_id() + 999'999);  // Past the ids granted after a serving save.
}

}  // namespace
}  // namespace tally
