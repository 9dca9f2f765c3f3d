// The worker's memory budget, hand-worked: what a row and a launch cost, the fit of the model's
// measured bytes, the split of a batch group, the refusal's words, the cgroup's limit.
#include "worker/pipeline/memory_budget.h"

#include "base/flag_util.h"
#include "common/formats/decode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(MemoryBudgetTest, FitsTheModelsBytesFromTwoProbes) {
  MemoryModel m;
  // 65536 px -> 10 MB, 262144 px -> 40 MB: 152.6 bytes a pixel and a fixed 0, but with 2 MB of
  // fixed cost on top of 150 a pixel the line recovers both.
  FitModelBytes(65536, 2000000 + 150 * 65536, 262144, 2000000 + 150 * 262144, &m);
  EXPECT_DOUBLE_EQ(m.model_bytes_per_pixel, 150);
  EXPECT_DOUBLE_EQ(m.model_fixed_bytes, 2000000);
  // Noise that makes the line fall: never negative.
  FitModelBytes(65536, 9000000, 262144, 8000000, &m);
  EXPECT_EQ(m.model_bytes_per_pixel, 0);
  EXPECT_EQ(m.model_fixed_bytes, 9000000);
  // One size (--input-size): a fixed cost, the larger measurement.
  FitModelBytes(4096, 7000000, 0, 7100000, &m);
  EXPECT_EQ(m.model_bytes_per_pixel, 0);
  EXPECT_EQ(m.model_fixed_bytes, 7100000);
}

TEST(MemoryBudgetTest, LaunchBytesCountTheHostAndTheModel) {
  MemoryModel m;
  m.host_bytes_per_pixel = 16;
  m.model_fixed_bytes = 1000;
  m.model_bytes_per_pixel = 100;
  EXPECT_EQ(m.LaunchBytes({}), 0);
  EXPECT_EQ(m.LaunchBytes({10}), 1000 + 10 * 116);
  EXPECT_EQ(m.LaunchBytes({10, 20}), 1000 + 30 * 116);
  m.model_input_pixels = 50;  // --input-size: the model sees 50 pixels of every row.
  EXPECT_EQ(m.LaunchBytes({10, 20}), 1000 + 30 * 16 + 2 * 50 * 100);
}

TEST(MemoryBudgetTest, ARowThatCannotFitSaysWhatItNeedsAndWhatToDo) {
  MemoryModel m;
  m.model_bytes_per_pixel = 150;  // 4000x4000 x 166 bytes = 2.47 GiB.
  EXPECT_EQ(RowTooLarge(m, 4000, 4000, int64_t{1} << 30),
            "needs about 2.5 GiB for 4000x4000; this worker may use 1.0 GiB (--max-worker-memory); try --input-size, "
            "or a worker with more memory");
  EXPECT_EQ(RowTooLarge(m, 512, 512, int64_t{1} << 30), "");
  EXPECT_EQ(RowTooLarge(m, 4000, 4000, 0), "");  // No budget.
}

TEST(MemoryBudgetTest, GroupsSplitIntoLaunchesThatFitInOrder) {
  MemoryModel m;
  m.host_bytes_per_pixel = 0;
  m.model_bytes_per_pixel = 1;
  // Rows of 40, 40, 40, 70, 10 bytes in a budget of 100: [40 40] [40] [70 10]; a row alone always runs.
  EXPECT_EQ(SplitByMemory(m, {40, 40, 40, 70, 10}, 100), (std::vector<size_t>{2, 3, 5}));
  EXPECT_EQ(SplitByMemory(m, {150, 10}, 100), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(SplitByMemory(m, {40, 40}, 0), (std::vector<size_t>{2}));  // No budget: one launch.
  EXPECT_TRUE(SplitByMemory(m, {}, 100).empty());
}

TEST(MemoryBudgetTest, CgroupLimitsAndSizes) {
  EXPECT_EQ(ParseCgroupLimit("max\n"), -1);
  EXPECT_EQ(ParseCgroupLimit("1073741824\n"), 1073741824);
  EXPECT_EQ(ParseCgroupLimit(""), -1);
  EXPECT_GT(MemoryLimitBytes(), int64_t{1} << 26);
  EXPECT_GT(ResidentBytes(), 0);
  EXPECT_EQ(*ParseByteSize("m", "1GiB"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("m", "512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("m", "1.5g"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("m", "2GB"), 2000000000);
  EXPECT_EQ(*ParseByteSize("m", "4096"), 4096);
  EXPECT_FALSE(ParseByteSize("m", "lots").ok());
  EXPECT_FALSE(ParseByteSize("m", "-1GiB").ok());
  EXPECT_EQ(FormatBytes(int64_t{5} << 29), "2.5 GiB");
  EXPECT_EQ(FormatBytes(int64_t{300} << 20), "300 MiB");
}

TEST(MemoryBudgetTest, ImageDimensionsFromTheHeaderAlone) {
  // A PNG's signature and IHDR: 4000 wide, 3000 high, and nothing after (no pixels to decode).
  std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x0f\xa0\0\0\x0b\xb8\x08\x02\0\0\0", 29);
  int h = 0, w = 0;
  ASSERT_TRUE(ImageDimensions(png, "x.png", &h, &w).ok());
  EXPECT_EQ(h, 3000);
  EXPECT_EQ(w, 4000);
  EXPECT_FALSE(ImageDimensions("not an image", "x", &h, &w).ok());
  EXPECT_FALSE(ImageDimensions(png.substr(0, 20), "x.png", &h, &w).ok());
}

}  // namespace
}  // namespace tally
