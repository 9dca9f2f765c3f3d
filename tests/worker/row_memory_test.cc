// The scoring rows' memory estimate and gate (worker/scoring/row_memory.h). The estimates' accuracy
// against measured peaks is checked end to end (tests/integration/test_hostile.py); here the
// arithmetic and the gate's admission.
#include "worker/scoring/row_memory.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

TEST(RowMemoryTest, EstimatesFollowTheDocumentedBytesPerVoxel) {
  RowMemoryInputs in;
  in.voxels = 1000;
  in.stored_bytes_per_voxel = 4;  // float32 NIfTI.
  EXPECT_EQ(ScoringRowBytes(in), 1000 * (2 + 2 + 4));
  in.lesions = true;
  EXPECT_EQ(ScoringRowBytes(in), 1000 * 14);
  in.lesion_dilation = 3;
  EXPECT_EQ(ScoringRowBytes(in), 1000 * 20);
  RowMemoryInputs panoptic;
  panoptic.voxels = 100;
  panoptic.panoptic = true;
  panoptic.file_bytes = 50;
  EXPECT_EQ(ScoringRowBytes(panoptic), 100 * 18 + 2 * 50);
  EXPECT_THAT(RowOverBudget(int64_t{4} << 30, int64_t{1} << 30, "a row"),
              HasSubstr("needs about 4.0 GiB for a row; this worker may use 1.0 GiB (--max-worker-memory)"));
  EXPECT_EQ(RowOverBudget(100, 100, "a row"), "");
  EXPECT_EQ(RowOverBudget(100, 0, "a row"), "");  // No budget.
}

TEST(RowMemoryTest, TheGateAdmitsRowsWhileTheyFitAndAlwaysOne) {
  MemoryGate gate(100);
  EXPECT_EQ(gate.Acquire(60), 60);
  std::atomic<bool> second{false};
  std::thread t([&] {
    gate.Acquire(50);  // 60 + 50 > 100: waits for the first.
    second = true;
    gate.Release(50);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second.load());
  gate.Release(60);
  t.join();
  EXPECT_TRUE(second.load());
  // Alone, a row larger than the budget is let in (RowOverBudget fails it before it asks).
  EXPECT_EQ(gate.Acquire(500), 500);
  gate.Release(500);
}

}  // namespace
}  // namespace tally
