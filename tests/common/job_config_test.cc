#include "common/job_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

// A spec stored before the coordinator wrote every default reads as those defaults.
TEST(JobConfigTest, OldSpecReadsAsDefaults) {
  v1::JobSpec spec;
  spec.set_model("/m.pt");
  auto c = JobConfigFromSpec(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->precision, Precision::kFp32);
  EXPECT_EQ(c->batch_size, kBatchWorkerDefault);
  EXPECT_EQ(c->batch_alignment, 32);
  EXPECT_EQ(c->spacing_y, 1.0);
  EXPECT_EQ(c->max_image_pixels, int64_t{1} << 28);
  EXPECT_EQ(c->batch_timeout_seconds, 600);
  EXPECT_EQ(c->nonfinite, NonfinitePolicy::kFail);
  ASSERT_EQ(c->metrics.size(), 5u);  // The default selection.
  spec.set_batch_size(12);
  EXPECT_EQ(JobConfigFromSpec(spec)->batch_alignment, 12);
  spec.set_precision("fp8");
  EXPECT_THAT(JobConfigFromSpec(spec).status().message(), HasSubstr("fp8"));
}

TEST(JobConfigTest, WorkerBatchMustDivideTheJobsAlignment) {
  JobConfig c;
  c.batch_alignment = 32;
  EXPECT_EQ(*WorkerBatchSize(c, 8), 8);
  EXPECT_EQ(*WorkerBatchSize(c, 32), 32);
  auto refused = WorkerBatchSize(c, 12);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("batch size 12 does not divide the job's batch alignment 32"));
  c.batch_size = 5;  // The job's own batch size wins, whatever the worker's default.
  c.batch_alignment = 5;
  EXPECT_EQ(*WorkerBatchSize(c, 12), 5);
  c.batch_size = kBatchAuto;
  EXPECT_EQ(*WorkerBatchSize(c, 12), kBatchAuto);
}

}  // namespace
}  // namespace tally
