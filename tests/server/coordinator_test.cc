#include "server/coordinator/coordinator.h"

#include "metrics/calibration.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator_fixture.h"

namespace tally {
namespace {

// A ListJobs request for one page.
v1::ListJobsRequest Page(int limit, const std::string& token) {
  v1::ListJobsRequest r;
  r.set_limit(limit);
  r.set_page_token(token);
  return r;
}

using ::testing::HasSubstr;

TEST_F(CoordinatorTest, RejectsBadSpecsWithClearErrors) {
  v1::JobSpec spec = Spec(0, 0);
  spec.set_model(dir_ + "/missing.pt");
  auto job = core_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("missing.pt"));
  spec = Spec(0, 0);
  spec.set_manifest(dir_ + "/nope.csv");
  job = core_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("nope.csv"));
  spec = Spec(0, 0);
  spec.add_metrics("dice");
  spec.add_metrics("volume");
  job = core_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("volume"));
}

TEST_F(CoordinatorTest, ShardsCoverTheManifestAndTheJobSucceeds) {
  auto job = core_->SubmitJob(Spec(4, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job->images_total(), 10);
  const std::string w1 = Register("a"), w2 = Register("b");
  std::vector<v1::ShardAssignment> got = {Acquire(w1), Acquire(w2), Acquire(w1)};
  EXPECT_FALSE(Acquire(w2).has_spec());  // Nothing left.
  std::map<int64_t, int> covered;
  for (const auto& a : got) {
    EXPECT_EQ(a.end() - a.begin(), a.rows_size());
    for (const auto& row : a.rows()) covered[row.index()]++;
    EXPECT_EQ(a.rows(0).image_path(), dir_ + "/img" + std::to_string(a.begin()) + ".png");
  }
  ASSERT_EQ(covered.size(), 10u);
  for (auto [i, n] : covered) EXPECT_EQ(n, 1) << i;
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_RUNNING);
  Complete(w1, got[0]);
  Complete(w2, got[1]);
  Complete(w1, got[2]);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
  core_->RunFinalizers();
  auto done = core_->GetJob(job->job_id());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(done->report_ready());
  const std::string json = ReadReport(job->job_id(), "report.json");
  EXPECT_THAT(json, HasSubstr("\"images_evaluated\": 10"));
  EXPECT_THAT(json, HasSubstr("\"images_failed\": 0"));
  // Class 1 over 10 images: TP 10, FP 5 (odd indices) -> dice_global = 20 / 25.
  EXPECT_THAT(json, HasSubstr("\"dice_global\": 0.8"));
  const std::string csv = ReadReport(job->job_id(), "per_image.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 10 * 2);
}

TEST_F(CoordinatorTest, SilentWorkerLosesItsShardAndLateResultsCountOnce) {
  auto job = core_->SubmitJob(Spec(5, 1));
  ASSERT_TRUE(job.ok());
  const std::string a = Register("a");
  v1::ShardAssignment lost = Acquire(a);
  now_ += 5;
  const std::string b = Register("b");
  v1::ShardAssignment other = Acquire(b);
  EXPECT_NE(lost.shard_id(), other.shard_id());
  now_ += 6;  // a has been silent for 11 s > 10 s lease; b for 6 s.
  core_->ExpireLeases();
  // The first worker comes back late: it must register again, and its results count once.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(a);
  EXPECT_TRUE(core_->Heartbeat(hb)->reregister());
  // Its shard was lost with it: the rows come back one at a time, each to a worker holding nothing
  // else (b, once its own shard is in).
  Complete(b, other);
  for (int64_t i = lost.begin(); i < lost.end(); ++i) {
    v1::ShardAssignment row = Acquire(b);
    EXPECT_EQ(row.begin(), i);
    EXPECT_EQ(row.end(), i + 1);
    EXPECT_NE(row.lease_id(), lost.lease_id());
    Complete(b, row);
  }
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, StaleLeaseResultsAreCommittedOnceAndAbandoned) {
  auto job = core_->SubmitJob(Spec(10, 1));
  const std::string a = Register("a");
  v1::ShardAssignment first = Acquire(a);
  now_ += 11;
  core_->ExpireLeases();
  const std::string a2 = Register("a again");
  for (int64_t i = first.begin(); i < first.end(); ++i) {  // Lost with its worker: row by row.
    v1::ShardAssignment row = Acquire(a2);
    ASSERT_EQ(row.begin(), i);
    Complete(a2, row);
  }
  // A zombie sending the same rows under the old lease: told to abandon, nothing double-counted.
  v1::ReportResultsRequest r;
  r.set_worker_id(a2);
  r.set_job_id(first.job_id());
  r.set_shard_id(first.shard_id());
  r.set_lease_id(first.lease_id());
  v1::ImageResult* ir = r.add_results();
  ir->set_index(0);
  ir->set_error("zombie");
  auto resp = core_->ReportResults(r);
  ASSERT_TRUE(resp.ok());
  EXPECT_TRUE(resp->abandon());
  auto j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->images_evaluated(), 10);
  EXPECT_EQ(j->images_failed(), 0);
}

// A shard lost once is split into single-row shards, each tried alone on its worker: only the row
// that keeps killing workers fails (at --max-shard-attempts losses in all, here 3), naming itself;
// its 9 neighbours are evaluated.
TEST_F(CoordinatorTest, AShardLostIsSplitAndOnlyTheCulpritFails) {
  auto job = core_->SubmitJob(Spec(10, 1));
  {
    const std::string w = Register("crashy");
    v1::ShardAssignment a = Acquire(w);
    ASSERT_TRUE(a.has_spec());
    EXPECT_EQ(a.rows_size(), 10);
    now_ += 11;
    core_->ExpireLeases();
  }
  EXPECT_EQ(core_->GetJob(job->job_id())->images_failed(), 0);
  int culprit_losses = 0;
  while (true) {
    const std::string w = Register("w");
    v1::ShardAssignment a = Acquire(w);
    if (!a.has_spec()) break;
    ASSERT_EQ(a.rows_size(), 1);
    // A suspect row is leased alone: its worker gets nothing more while it holds it.
    EXPECT_FALSE(Acquire(w).has_spec());
    if (a.rows(0).index() == 7) {  // Row 7 kills every worker that touches it.
      ++culprit_losses;
      now_ += 11;
      core_->ExpireLeases();
      continue;
    }
    Complete(w, a);
  }
  EXPECT_EQ(culprit_losses, 2);
  auto j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->images_evaluated(), 9);
  EXPECT_EQ(j->images_failed(), 1);
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
  const std::string report = ReadReport(job->job_id(), "report.json");
  EXPECT_THAT(report, HasSubstr("row 7 (manifest line 9, id 'img7', image 'img7.png')"));
  EXPECT_THAT(report, HasSubstr("3 times"));
  EXPECT_THAT(report, HasSubstr("\"images_failed\": 1"));
}

// A worker that refuses a job (another copy of the model) gives its shard back unbegun, maybe
// several times before its refusal arrives: that is no mark against the rows. Found by CI: a
// stale worker's three releases of one shard failed a row as "in hand each time a worker was lost".
TEST_F(CoordinatorTest, ShardsGivenBackUnbegunAreNeitherSplitNorFailed) {
  auto job = core_->SubmitJob(Spec(10, 1));
  const std::string stale = Register("stale");
  for (int attempt = 0; attempt < 5; ++attempt) {
    v1::ShardAssignment a = Acquire(stale);
    ASSERT_TRUE(a.has_spec()) << attempt;
    EXPECT_EQ(a.rows_size(), 10) << attempt;
    v1::ReleaseShardRequest release;
    release.set_worker_id(stale);
    release.set_job_id(a.job_id());
    release.set_shard_id(a.shard_id());
    release.set_lease_id(a.lease_id());
    release.set_reason("sees another file at the job's model path");
    release.set_not_started(true);
    ASSERT_TRUE(core_->ReleaseShard(release).ok());
  }
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  EXPECT_EQ(a.rows_size(), 10);
  Complete(w, a);
  auto j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->images_evaluated(), 10);
  EXPECT_EQ(j->images_failed(), 0);
}

// The layout trial's hint is the job's rows left, not a worker's share: one GPU and four must make the
// same choice (found on four H200s, where bf16 results then differed).
TEST_F(CoordinatorTest, ExpectedRowsAreTheJobsWhateverTheWorkers) {
  auto job = core_->SubmitJob(Spec(10, 1));
  ASSERT_TRUE(job.ok());
  const std::string a = Register("a");
  for (const char* other : {"b", "c", "d"}) Register(other);
  EXPECT_EQ(Acquire(a).expected_rows(), 10);  // Not 3 (10 over 4 workers).
}

// A report the coordinator rejects ends the lease at once: the shard goes to the next worker
// without waiting for any expiry (the multi-job hang: results carrying the wrong class count).
TEST_F(CoordinatorTest, RejectedReportReleasesTheLeaseAtOnce) {
  auto job = core_->SubmitJob(Spec(5, 1));
  const std::string a_worker = Register("a");
  Complete(a_worker, Acquire(a_worker));  // Shard 0; sets the job's class count to 2.
  v1::ShardAssignment a = Acquire(a_worker);
  v1::ShardAssignment none = Acquire(Register("b"));
  EXPECT_FALSE(none.has_spec());
  v1::ReportResultsRequest r = ReportOf(a_worker, a);
  r.set_shard_complete(true);
  v1::ImageResult* ir = r.add_results();
  ir->set_index(5);
  ir->set_height(2);
  ir->set_width(2);
  for (int c = 0; c < 3; ++c) ir->add_classes()->set_tn(4);  // 3 classes: the job has 2.
  auto resp = core_->ReportResults(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resp.status().message(), HasSubstr("has 3 classes; the job has 2"));
  const std::string b = Register("b2");
  v1::ShardAssignment again = Acquire(b);  // Same clock: no expiry happened.
  ASSERT_TRUE(again.has_spec());
  EXPECT_EQ(again.shard_id(), a.shard_id());
  Complete(b, again);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
}

// Counts that cannot be right (classes partition different pixel sets) are rejected.
TEST_F(CoordinatorTest, ImplausibleCountsAreRejected) {
  core_->SubmitJob(Spec(10, 1)).IgnoreError();
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  v1::ReportResultsRequest r = ReportOf(w, a);
  v1::ImageResult* ir = r.add_results();
  ir->set_index(0);
  ir->set_height(2);
  ir->set_width(2);
  v1::ClassResult* c0 = ir->add_classes();
  c0->set_tp(4);
  v1::ClassResult* c1 = ir->add_classes();
  c1->set_tp(1);  // Sums to 1, class 0 to 4: impossible.
  auto resp = core_->ReportResults(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resp.status().message(), HasSubstr("implausible"));
}

// A lease the worker stops listing in its heartbeats (it could not parse the assignment, or
// dropped it) is taken back after a lease period, although the worker keeps heartbeating.
TEST_F(CoordinatorTest, LeaseNoLongerListedByTheWorkerIsTakenBack) {
  core_->SubmitJob(Spec(10, 1)).IgnoreError();
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w);
  now_ += 5;
  ASSERT_TRUE(core_->Heartbeat(hb).ok());  // Within the grace period: still leased.
  EXPECT_FALSE(Acquire(Register("other")).has_spec());
  now_ += 6;
  ASSERT_TRUE(core_->Heartbeat(hb).ok());
  EXPECT_EQ(Acquire(Register("third")).shard_id(), a.shard_id());
}

// Heartbeats alone do not keep a lease whose worker commits nothing for the batch timeout.
TEST_F(CoordinatorTest, NoProgressPastTheBatchTimeoutReleasesTheLease) {
  v1::JobSpec spec = Spec(10, 1);
  spec.set_batch_timeout_seconds(30);
  core_->SubmitJob(spec).IgnoreError();
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  v1::HeartbeatRequest hb = Beat(w, a);
  for (int t = 0; t < 8; ++t) {  // 32 s of heartbeats: < 30 + 10.
    now_ += 4;
    ASSERT_TRUE(core_->Heartbeat(hb).ok());
    core_->ExpireLeases();
  }
  EXPECT_FALSE(Acquire(Register("other")).has_spec());
  for (int t = 0; t < 3; ++t) {
    now_ += 4;
    ASSERT_TRUE(core_->Heartbeat(hb).ok());
    core_->ExpireLeases();
  }
  // Taken back, and its rows tried one at a time (a hang may be one row's doing).
  const v1::ShardAssignment first_row = Acquire(Register("third"));
  EXPECT_EQ(first_row.begin(), a.begin());
  EXPECT_EQ(first_row.end(), a.begin() + 1);
  EXPECT_EQ(core_->Heartbeat(hb)->revoked_size(), 1);
}

// One worker's model error takes that worker off the job; a second worker reporting the same
// error fails the job. A worker-local error takes the worker out of service, not the job.
TEST_F(CoordinatorTest, ModelErrorsNeedTwoWorkersAndLocalErrorsRetireTheWorker) {
  auto job = core_->SubmitJob(Spec(5, 1));
  const std::string w1 = Register("w1"), w2 = Register("w2"), w3 = Register("w3");
  v1::ShardAssignment a = Acquire(w1);
  v1::ReportJobErrorRequest local;
  local.set_worker_id(w1);
  local.set_job_id(job->job_id());
  local.set_worker_local(true);
  local.set_message("device 'cuda:7' does not exist");
  ASSERT_TRUE(core_->ReportJobError(local).ok());
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_RUNNING);
  v1::ListWorkersResponse workers = core_->ListWorkers();
  bool retired = false;
  for (const auto& wi : workers.workers()) {
    if (wi.worker_id() == w1) {
      retired = wi.state() == "out of service" && wi.reason() == "device 'cuda:7' does not exist";
    }
  }
  EXPECT_TRUE(retired);
  v1::AcquireShardRequest gone;
  gone.set_worker_id(w1);
  EXPECT_EQ(core_->AcquireShard(gone).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Acquire(w2).shard_id(), a.shard_id());  // Released without waiting.

  v1::ReportJobErrorRequest err;
  err.set_worker_id(w2);
  err.set_job_id(job->job_id());
  err.set_message("model 'm.pt' is not a loadable TorchScript file");
  ASSERT_TRUE(core_->ReportJobError(err).ok());
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(Acquire(w2).has_spec());  // w2 is off this job.
  EXPECT_TRUE(Acquire(w3).has_spec());
  err.set_worker_id(w3);
  ASSERT_TRUE(core_->ReportJobError(err).ok());
  auto j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j->error(), HasSubstr("not a loadable TorchScript file"));
}

TEST_F(CoordinatorTest, OversizedNameAndTooManyRowsAreRefused) {
  v1::JobSpec spec = Spec(10, 1);
  spec.set_name(std::string(40 << 20, 'x'));
  auto job = core_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("'name' is 41943040 bytes; the limit is 256"));
  Restart([](CoordinatorOptions* o) { o->max_manifest_rows = 9; });
  auto refused = core_->SubmitJob(Spec(10, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("more than 9 rows"));
  auto listed = core_->ListJobs(Page(10, ""));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->jobs_size(), 0);  // Nothing of the refused submission is left.
}

TEST_F(CoordinatorTest, JobsArePaginatedAndDeletable) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    WriteManifest(0);
    auto job = core_->SubmitJob(Spec(0, 0));
    ASSERT_TRUE(job.ok());
    ids.push_back(job->job_id());
    now_ += 1;
  }
  core_->RunFinalizers();
  auto page1 = core_->ListJobs(Page(2, ""));
  ASSERT_TRUE(page1.ok());
  ASSERT_EQ(page1->jobs_size(), 2);
  EXPECT_EQ(page1->jobs(0).job_id(), ids[4]);  // Newest first.
  EXPECT_EQ(page1->next_page_token(), ids[3]);
  auto page2 = core_->ListJobs(Page(2, page1->next_page_token()));
  EXPECT_EQ(page2->jobs(0).job_id(), ids[2]);
  auto page3 = core_->ListJobs(Page(2, page2->next_page_token()));
  EXPECT_EQ(page3->jobs_size(), 1);
  EXPECT_EQ(page3->next_page_token(), "");
  ASSERT_TRUE(core_->DeleteJob(ids[0]).ok());
  EXPECT_EQ(core_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
  struct stat st;
  EXPECT_NE(stat((dir_ + "/state/reports/" + ids[0]).c_str(), &st), 0);
  Restart();  // Deleted for good, not only from memory.
  EXPECT_EQ(core_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->GetJob(ids[1]).ok());
}

TEST_F(CoordinatorTest, RetentionDeletesOnlyJobsFinishedLongEnoughAgo) {
  Restart([](CoordinatorOptions* o) { o->retain_days = 2; });
  WriteManifest(0);
  auto old_job = core_->SubmitJob(Spec(0, 0));  // Empty: finished as soon as its report is built.
  core_->RunFinalizers();
  now_ += 86400;
  auto young_job = core_->SubmitJob(Spec(0, 0));
  core_->RunFinalizers();
  auto running = core_->SubmitJob(Spec(0, 0));
  now_ += 1.5 * 86400;  // The first finished 2.5 days ago, the second 1.5 days ago.
  core_->ApplyRetention();
  EXPECT_EQ(core_->GetJob(old_job->job_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->GetJob(young_job->job_id()).ok());
  EXPECT_TRUE(core_->GetJob(running->job_id()).ok());  // Queued for its report: never deleted.
}

TEST_F(CoordinatorTest, RunningJobCannotBeDeleted) {
  auto job = core_->SubmitJob(Spec(10, 1));
  auto s = core_->DeleteJob(job->job_id());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cancel it first"));
}

TEST_F(CoordinatorTest, IncompleteShardIsQueuedAgain) {
  auto job = core_->SubmitJob(Spec(10, 1));
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  a.mutable_rows()->DeleteSubrange(5, 5);  // Claims completion with only half the rows.
  Complete(w, a);
  v1::ShardAssignment again = Acquire(w);
  EXPECT_EQ(again.shard_id(), a.shard_id());
  Complete(w, again);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
}

TEST_F(CoordinatorTest, ModelErrorFailsTheJobAndRevokesLeases) {
  auto job = core_->SubmitJob(Spec(5, 1));
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  v1::ReportJobErrorRequest err;
  err.set_worker_id(w);
  err.set_job_id(job->job_id());
  err.set_message("model 'm.pt' returned logits of shape [2, 10]");
  ASSERT_TRUE(core_->ReportJobError(err).ok());
  auto j = core_->GetJob(job->job_id());
  EXPECT_EQ(j->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j->error(), HasSubstr("[2, 10]"));
  v1::HeartbeatRequest hb = Beat(w, a);
  EXPECT_EQ(core_->Heartbeat(hb)->revoked_size(), 1);
  EXPECT_FALSE(Acquire(w).has_spec());
  core_->RunFinalizers();
  EXPECT_TRUE(core_->GetJob(job->job_id())->report_ready());
  EXPECT_THAT(ReadReport(job->job_id(), "report.json"), HasSubstr("\"complete\": false"));
}

TEST_F(CoordinatorTest, CancelStopsHandingOutWork) {
  auto job = core_->SubmitJob(Spec(5, 1));
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  EXPECT_EQ(core_->CancelJob(job->job_id())->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(Complete(w, a).abandon());
  EXPECT_FALSE(Acquire(w).has_spec());
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 0);
}




// Fair share (coordinator_schedule.cc): owners share the workers by weight. Three workers,
// alice weighted 2 and bob 1: two go to alice's job, one to bob's, whatever the submission order.
TEST_F(CoordinatorTest, OwnersShareTheWorkersByWeight) {
  Restart([](CoordinatorOptions* o) { o->owner_weights = {{"alice", 2.0}, {"bob", 1.0}}; });
  const std::string bob = core_->SubmitJob(Spec(1, 1), "bob")->job_id();
  const std::string alice = core_->SubmitJob(Spec(1, 1), "alice")->job_id();
  std::map<std::string, int> on;
  for (const char* name : {"w1", "w2", "w3"}) on[Acquire(Register(name)).job_id()]++;
  EXPECT_EQ(on[alice], 2);
  EXPECT_EQ(on[bob], 1);
  EXPECT_NEAR(core_->GetJob(alice)->running_share(), 2.0 / 3, 1e-12);
  EXPECT_EQ(core_->GetJob(bob)->workers_assigned(), 1);
}

// A job submitted behind a long one gets a worker at that worker's next lease; the other worker
// stays where it is (no model reloads), and the long job's rows are unaffected.
TEST_F(CoordinatorTest, ASmallJobGetsAWorkerAtItsNextLease) {
  WriteManifest(10);
  const std::string big = core_->SubmitJob(Spec(1, 1))->job_id();
  const std::string w1 = Register("w1"), w2 = Register("w2");
  v1::ShardAssignment a1 = Acquire(w1), a2 = Acquire(w2);
  EXPECT_EQ(a1.job_id(), big);
  const std::string small = core_->SubmitJob(Spec(1, 1))->job_id();
  EXPECT_EQ(core_->GetJob(small)->queue_position(), 1);
  EXPECT_THAT(core_->GetJob(small)->waiting(), HasSubstr("waiting for a worker (position 1)"));
  Complete(w1, a1);
  EXPECT_EQ(Acquire(w1).job_id(), small);
  Complete(w2, a2);
  EXPECT_EQ(Acquire(w2).job_id(), big);
  EXPECT_EQ(core_->GetJob(small)->queue_position(), 0);
  EXPECT_EQ(core_->GetJob(small)->waiting(), "");
}

// Within one owner, the jobs of the highest priority first.
TEST_F(CoordinatorTest, PriorityOrdersOneOwnersJobs) {
  const std::string first = core_->SubmitJob(Spec(5, 1))->job_id();
  v1::JobSpec urgent = Spec(5, 1);
  urgent.set_priority(5);
  const std::string second = core_->SubmitJob(urgent)->job_id();
  EXPECT_EQ(Acquire(Register("w")).job_id(), second);
  EXPECT_EQ(core_->GetJob(first)->queue_position(), 1);
}



// The answers a long poll (AcquireShardAsync) receives, in order; every `done` call is counted.
class PollAnswers {
 public:
  Coordinator::AcquireDone Done() {
    return [this](absl::StatusOr<v1::AcquireShardResponse> r) {
      absl::MutexLock lock(&mu_);
      got_.push_back(std::move(r));
    };
  }
  // Waits up to `seconds` for the first answer (a bound against a hang, not a timing assertion).
  std::optional<absl::StatusOr<v1::AcquireShardResponse>> First(double seconds = 30) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !got_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(seconds));
    if (got_.empty()) return std::nullopt;
    return got_.front();
  }
  size_t Count() {
    absl::MutexLock lock(&mu_);
    return got_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::StatusOr<v1::AcquireShardResponse>> got_ ABSL_GUARDED_BY(mu_);
};

v1::AcquireShardRequest Poll(const std::string& worker, int wait_ms) {
  v1::AcquireShardRequest r;
  r.set_worker_id(worker);
  r.set_max_wait_ms(wait_ms);
  return r;
}

// An idle worker's long poll is answered with the first shard of a job submitted while it waits
// (its wait is far longer than the test: an empty answer would mean nobody woke it).
TEST_F(CoordinatorTest, LongPollGetsTheShardOfAJobSubmittedWhileItWaits) {
  const std::string w = Register("w");
  PollAnswers answers;
  const int64_t id = core_->AcquireShardAsync(Poll(w, 5000), answers.Done());
  EXPECT_NE(id, 0);
  EXPECT_EQ(answers.Count(), 0u);
  auto job = core_->SubmitJob(Spec(5, 1));
  ASSERT_TRUE(job.ok());
  auto first = answers.First();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->ok()) << first->status();
  EXPECT_EQ((*first)->assignment().job_id(), job->job_id());
  EXPECT_EQ((*first)->assignment().begin(), 0);
  EXPECT_EQ((*first)->assignment().rows_size(), 5);
  core_->CancelAcquire(id);  // Answered already: nothing happens.
  EXPECT_EQ(answers.Count(), 1u);
  EXPECT_EQ(Acquire(w).begin(), 5);  // The lease it got is recorded: the next shard is the second.
}

// A shard given back by one worker goes to another worker waiting for work.
TEST_F(CoordinatorTest, LongPollGetsAShardReleasedWhileItWaits) {
  ASSERT_TRUE(core_->SubmitJob(Spec(10, 1)).ok());
  const std::string a = Register("a"), b = Register("b");
  v1::ShardAssignment only = Acquire(a);
  PollAnswers answers;
  ASSERT_NE(core_->AcquireShardAsync(Poll(b, 5000), answers.Done()), 0);
  v1::ReleaseShardRequest release;
  release.set_worker_id(a);
  release.set_job_id(only.job_id());
  release.set_shard_id(only.shard_id());
  release.set_lease_id(only.lease_id());
  release.set_reason("test");
  ASSERT_TRUE(core_->ReleaseShard(release).ok());
  auto first = answers.First();
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_EQ((*first)->assignment().shard_id(), only.shard_id());
  EXPECT_NE((*first)->assignment().lease_id(), only.lease_id());
}

// A suspect row's worker takes nothing more while it holds the row, so its long poll waits; the
// commit of that row answers it with the next row at once (it used to wait out the poll, up to 5 s,
// for every row of a shard lost with a worker).
TEST_F(CoordinatorTest, ASuspectRowsCommitAnswersItsWorkersLongPoll) {
  auto job = core_->SubmitJob(Spec(10, 1));
  {
    const std::string w = Register("crashy");
    ASSERT_EQ(Acquire(w).rows_size(), 10);
    now_ += 11;
    core_->ExpireLeases();
  }
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  ASSERT_EQ(a.rows_size(), 1);
  PollAnswers answers;
  ASSERT_NE(core_->AcquireShardAsync(Poll(w, 5000), answers.Done()), 0);
  EXPECT_EQ(answers.Count(), 0u);  // Waiting: it holds a suspect row.
  Complete(w, a);
  auto next = answers.First(3);  // Well inside the poll's 5 s: answered by the commit, not its deadline.
  ASSERT_TRUE(next.has_value());
  ASSERT_TRUE(next->ok()) << next->status();
  ASSERT_TRUE((*next)->has_assignment());
  EXPECT_EQ((*next)->assignment().rows_size(), 1);
  EXPECT_NE((*next)->assignment().begin(), a.begin());
}

TEST_F(CoordinatorTest, LongPollEndsEmptyAtItsDeadlineAndAsksForTheNextAtOnce) {
  const std::string w = Register("w");
  PollAnswers answers;
  ASSERT_NE(core_->AcquireShardAsync(Poll(w, 20), answers.Done()), 0);
  auto first = answers.First();
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_FALSE((*first)->has_assignment());
  EXPECT_EQ((*first)->retry_after_ms(), 0);
  // No wait asked for: answered at once, to be asked again after a pause.
  PollAnswers now;
  EXPECT_EQ(core_->AcquireShardAsync(Poll(w, 0), now.Done()), 0);
  ASSERT_EQ(now.Count(), 1u);
  EXPECT_EQ((*now.First())->retry_after_ms(), 100);
}

// A cancelled poll is answered once, with CANCELLED, and no shard is leased to it afterwards.
TEST_F(CoordinatorTest, CancelledLongPollIsAnsweredOnceAndLeasesNothing) {
  const std::string w = Register("w");
  PollAnswers answers;
  const int64_t id = core_->AcquireShardAsync(Poll(w, 5000), answers.Done());
  ASSERT_NE(id, 0);
  core_->CancelAcquire(id);
  core_->CancelAcquire(id);
  ASSERT_EQ(answers.Count(), 1u);
  EXPECT_EQ(answers.First()->status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(core_->SubmitJob(Spec(5, 1)).ok());
  EXPECT_EQ(Acquire(w).begin(), 0);
  EXPECT_EQ(answers.Count(), 1u);
}

TEST_F(CoordinatorTest, UnknownWorkerIsToldAtOnceToRegister) {
  PollAnswers answers;
  EXPECT_EQ(core_->AcquireShardAsync(Poll("nobody", 5000), answers.Done()), 0);
  ASSERT_EQ(answers.Count(), 1u);
  EXPECT_EQ(answers.First()->status().code(), absl::StatusCode::kNotFound);
}

// Shutdown: StopWaiting answers every poll now and later ones at once; so does the destructor.
TEST_F(CoordinatorTest, StopWaitingAndShutdownAnswerEveryPoll) {
  const std::string w = Register("w");
  PollAnswers waiting, later, at_exit;
  ASSERT_NE(core_->AcquireShardAsync(Poll(w, 5000), waiting.Done()), 0);
  core_->StopWaiting();
  auto first = waiting.First();
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_EQ((*first)->retry_after_ms(), 100);
  EXPECT_EQ(core_->AcquireShardAsync(Poll(w, 5000), later.Done()), 0);
  EXPECT_EQ(later.Count(), 1u);
  Restart();
  const std::string w2 = Register("w2");
  ASSERT_NE(core_->AcquireShardAsync(Poll(w2, 5000), at_exit.Done()), 0);
  core_.reset();
  EXPECT_EQ(at_exit.Count(), 1u);
  Restart();
}

TEST_F(CoordinatorTest, EmptyManifestSucceedsAtOnce) {
  WriteManifest(0);
  auto job = core_->SubmitJob(Spec(0, 0));
  ASSERT_TRUE(job.ok());
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
}

// --metrics calibration: a model batch's fine histogram counts with all the rows it covers or not at
// all. A report whose batch mixes rows already committed and new ones has its new rows refused; they
// come back alone, and every row's pixels are in the fine histogram exactly once.
class CalibrationCoordinatorTest : public CoordinatorTest {
 protected:
  // One pixel, reference and prediction class 1 with probability 0.9.
  static void Row(int64_t index, int64_t batch, v1::ImageResult* r) {
    r->set_index(index);
    r->set_height(1);
    r->set_width(1);
    for (int c = 0; c < 2; ++c) {
      v1::ClassResult* cr = r->add_classes();
      cr->set_tp(c == 1);
      cr->set_tn(c == 0);
    }
    std::vector<int64_t> v(CalibrationRowSize(2), 0);
    auto set = [&](int h, float p, bool ok) {
      int64_t* cell = v.data() + (h * kCalibrationBins + CalibrationBin(p)) * kCalibrationValues;
      cell[0] = 1;
      cell[1] = ok;
      cell[2] = static_cast<int64_t>(ConfidenceUnits(p));
    };
    set(0, 0.1f, false);
    set(1, 0.9f, true);
    set(2, 0.9f, true);
    r->mutable_calibration()->Add(v.begin(), v.end());
    r->set_calibration_batch(batch);
  }

  v1::ReportResultsResponse Report(const std::string& worker, const v1::ShardAssignment& a,
                                   const std::vector<int64_t>& rows, bool complete) {
    v1::ReportResultsRequest r = ReportOf(worker, a);
    r.set_shard_complete(complete);
    for (int64_t i : rows) Row(i, rows[0], r.add_results());
    v1::CalibrationFine* f = r.mutable_results(0)->mutable_calibration_fine();
    f->set_classes(2);
    for (int64_t i : rows) f->add_covers(i);
    const int64_t n = static_cast<int64_t>(rows.size());
    for (auto [cell, correct] : {std::pair<int, int64_t>{CalibrationFineBin(0.1f), 0},
                                 {kCalibrationFineBins + CalibrationFineBin(0.9f), n},
                                 {2 * kCalibrationFineBins + CalibrationFineBin(0.9f), n}}) {
      f->add_cells(cell);
      f->add_pixels(n);
      f->add_correct(correct);
    }
    auto resp = core_->ReportResults(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::ReportResultsResponse();
  }
};

TEST_F(CalibrationCoordinatorTest, ABatchThatCameApartIsRefusedAndItsRowsComeBackAlone) {
  v1::JobSpec spec = Spec(10, 2);
  spec.add_metrics("calibration");
  auto job = core_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  ASSERT_EQ(a.end() - a.begin(), 10);
  Report(w, a, {0, 1}, false);
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 2);
  Report(w, a, {0, 1, 2, 3}, false);  // 0 and 1 committed already: 2 and 3 refused.
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 2);
  for (int64_t i = 2; i < 10; ++i) {
    v1::ShardAssignment one = Acquire(w);
    ASSERT_EQ(one.end() - one.begin(), 1) << i;
    Report(w, one, {one.rows(0).index()}, true);
  }
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 10);
  core_->RunFinalizers();
  EXPECT_EQ(core_->GetJob(job->job_id())->state(), v1::JOB_STATE_SUCCEEDED);
  const std::string report = ReadReport(job->job_id(), "report.json");
  EXPECT_THAT(report, ::testing::HasSubstr("\"calibration\": {\n    \"rows\": 10,"));
  EXPECT_THAT(report, ::testing::HasSubstr("\"fine_rows\": 10,"));
}

TEST_F(CalibrationCoordinatorTest, AFineHistogramThatDisagreesWithItsRowsIsRejected) {
  v1::JobSpec spec = Spec(10, 2);
  spec.add_metrics("calibration");
  auto job = core_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string w = Register("w");
  v1::ShardAssignment a = Acquire(w);
  v1::ReportResultsRequest r = ReportOf(w, a);
  Row(0, 0, r.add_results());
  v1::CalibrationFine* f = r.mutable_results(0)->mutable_calibration_fine();
  f->set_classes(2);
  f->add_covers(0);
  f->add_cells(7);
  f->add_pixels(5);  // The row has one pixel.
  f->add_correct(0);
  auto resp = core_->ReportResults(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_THAT(std::string(resp.status().message()), ::testing::HasSubstr("disagrees with its rows"));
  EXPECT_EQ(core_->GetJob(job->job_id())->images_evaluated(), 0);
}

}  // namespace
}  // namespace tally
