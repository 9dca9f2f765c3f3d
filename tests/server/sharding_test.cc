#include "server/store/sharding.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(ShardingTest, DefaultSizeIsClamped) {
  EXPECT_EQ(DefaultShardSize(0), 8);
  EXPECT_EQ(DefaultShardSize(1000), 8);        // ceil(1000 / 256) = 4 -> at least 8
  EXPECT_EQ(DefaultShardSize(100000), 391);    // ceil(100000 / 256)
  EXPECT_EQ(DefaultShardSize(10000000), 1024); // at most 1024
}

TEST(ShardingTest, EffectiveSizeRoundsUpToBatchMultiple) {
  EXPECT_EQ(EffectiveShardSize(100, 5, 4), 8);
  EXPECT_EQ(EffectiveShardSize(100, 8, 4), 8);
  EXPECT_EQ(EffectiveShardSize(100, 7, 1), 7);
  EXPECT_EQ(EffectiveShardSize(100000, 0, 32), 416);  // 391 rounded up to a multiple of 32
}

TEST(ShardingTest, ShardsCoverEveryIndexOnce) {
  auto shards = MakeShards(10, 4);
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].begin, 0);
  EXPECT_EQ(shards[0].end, 4);
  EXPECT_EQ(shards[1].begin, 4);
  EXPECT_EQ(shards[1].end, 8);
  EXPECT_EQ(shards[2].begin, 8);
  EXPECT_EQ(shards[2].end, 10);
  for (int64_t n : {1, 7, 64, 1001}) {
    for (int64_t size : {1, 3, 32}) {
      std::vector<int> seen(n, 0);
      for (const ShardRange& s : MakeShards(n, size)) {
        EXPECT_LE(s.end - s.begin, size);
        for (int64_t i = s.begin; i < s.end; ++i) seen[i]++;
      }
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "n=" << n << " size=" << size << " i=" << i;
    }
  }
  EXPECT_TRUE(MakeShards(0, 4).empty());
}

}  // namespace
}  // namespace tally
