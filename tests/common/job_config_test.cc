#include "common/job/job_config.h"

#include <string>
#include <utility>

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

// --decode: cpu unless asked; "auto" waits for a worker's trial, then runs what the coordinator kept.
TEST(JobConfigTest, DecodeModes) {
  v1::JobSpec spec;
  spec.set_model("/m.pt");
  auto c = JobConfigFromSpec(spec);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((std::pair<std::string, std::string>(c->decode_mode, c->decode_ran())),
            (std::pair<std::string, std::string>("cpu", "cpu")));
  EXPECT_FALSE(c->decode_gpu);
  spec.set_decode("GPU");
  c = JobConfigFromSpec(spec);
  EXPECT_TRUE(c->decode_gpu);
  EXPECT_EQ(c->decode_ran(), "gpu");
  spec.set_decode("auto");
  c = JobConfigFromSpec(spec);
  EXPECT_TRUE(c->decode_auto);
  EXPECT_FALSE(c->decode_gpu);
  EXPECT_EQ(c->decode_ran(), "auto");
  spec.set_decode_resolved("gpu");
  spec.set_decode_trial("CPU decoders 900 img/s");
  c = JobConfigFromSpec(spec);
  EXPECT_FALSE(c->decode_auto);
  EXPECT_TRUE(c->decode_gpu);
  EXPECT_EQ(c->decode_trial, "CPU decoders 900 img/s");
  spec.set_decode("fpga");
  EXPECT_THAT(JobConfigFromSpec(spec).status().message(), HasSubstr("decode 'fpga' is not one of cpu, gpu, auto"));
}

TEST(JobConfigTest, ModelRefPicksTheBackend) {
  EXPECT_FALSE(ParseModelRef("/m/model.pt").python);
  ModelRef a = ParseModelRef("/m/seg.py");
  EXPECT_TRUE(a.python);
  EXPECT_EQ(a.path, "/m/seg.py");
  EXPECT_EQ(a.class_name, "Model");
  ModelRef b = ParseModelRef("/m/seg.py:Sa2Va");
  EXPECT_TRUE(b.python);
  EXPECT_EQ(b.path, "/m/seg.py");
  EXPECT_EQ(b.class_name, "Sa2Va");
  EXPECT_FALSE(ParseModelRef("/m/x.py:dir/model.pt").python);  // A folder named "x.py:dir".
  v1::JobSpec spec;
  spec.set_model("/m/seg.py");
  spec.add_thresholds(0.7);
  spec.add_thresholds(0.3);
  spec.add_thresholds(0.3);
  spec.set_empty_score("one");
  auto c = JobConfigFromSpec(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->thresholds, (std::vector<double>{0.3, 0.7}));
  EXPECT_EQ(c->empty_score, EmptyScore::kOne);
  spec.add_thresholds(1.0);
  EXPECT_FALSE(JobConfigFromSpec(spec).ok());
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
