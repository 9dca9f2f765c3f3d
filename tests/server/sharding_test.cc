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

namespace tally {
namespace {

std::vector<std::pair<int64_t, int64_t>> Pairs(const std::vector<ShardRange>& shards) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ShardRange& s : shards) out.emplace_back(s.begin, s.end);
  return out;
}

// Tar shards: uncompressed tars cut as a manifest is (global multiples of the size, across tar
// boundaries: full index-aligned batches); a compressed tar is one shard of its own.
TEST(TarShardsTest, CompressedTarsWholeTheRestAsAManifest) {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(Pairs(MakeShards(20, 8, {0, 5, 13}, {false, false, false})), Pairs(MakeShards(20, 8)));
  EXPECT_EQ(Pairs(MakeShards(20, 8, {0, 5, 13}, {false, true, false})), (P{{0, 5}, {5, 13}, {13, 16}, {16, 20}}));
  // Empty tars (two starts at one row) add nothing; a --sample prefix ends where it ends.
  EXPECT_EQ(Pairs(MakeShards(11, 4, {0, 3, 3, 9}, {false, false, true, true})), (P{{0, 3}, {3, 9}, {9, 11}}));
  EXPECT_EQ(Pairs(MakeShards(11, 4, {0, 3, 3, 9}, {false, false, false, true})), (P{{0, 4}, {4, 8}, {8, 9}, {9, 11}}));
  EXPECT_EQ(Pairs(MakeShards(7, 4, {0, 3, 3, 9}, {false, false, true, true})), (P{{0, 3}, {3, 7}}));
  // 64 uncompressed tars of 50 rows, shards of 32: every shard but the last full.
  std::vector<int64_t> starts;
  for (int64_t t = 0; t < 64; ++t) starts.push_back(50 * t);
  const std::vector<ShardRange> many = MakeShards(3200, 32, starts, std::vector<bool>(64, false));
  EXPECT_EQ(many.size(), 100u);
  for (const ShardRange& r : many) EXPECT_EQ(r.end - r.begin, 32);
  // Without starts: the manifest's shards.
  EXPECT_EQ(Pairs(MakeShards(10, 4, {}, {})), Pairs(MakeShards(10, 4)));
  // Every row in exactly one shard, in order; no shard holds rows of a compressed tar and others.
  const std::vector<int64_t> s5 = {0, 37, 400, 401, 999};
  const std::vector<bool> w5 = {false, true, false, true, false};
  const std::vector<ShardRange> s = MakeShards(1000, 64, s5, w5);
  int64_t next = 0;
  for (const ShardRange& r : s) {
    EXPECT_EQ(r.begin, next);
    EXPECT_LT(r.begin, r.end);
    for (size_t i = 0; i < s5.size(); ++i) {
      const int64_t tb = s5[i], te = i + 1 < s5.size() ? s5[i + 1] : 1000;
      if (w5[i] && r.begin < te && tb < r.end) EXPECT_TRUE(r.begin == tb && r.end == te);
    }
    next = r.end;
  }
  EXPECT_EQ(next, 1000);
}

TEST(TarShardsTest, JobShardsCutOnlyInTheManifestOrder) {
  v1::JobSpec spec;
  for (int64_t v : {0, 5}) spec.add_tar_starts(v);
  for (bool v : {false, true}) spec.add_tar_compressed(v);
  EXPECT_EQ(Pairs(JobShards(spec, 12, 4)), (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 5}, {5, 12}}));
  spec.set_tar_compressed(1, false);  // Uncompressed tars: a manifest's shards.
  EXPECT_EQ(Pairs(JobShards(spec, 12, 4)), Pairs(MakeShards(12, 4)));
  spec.set_random_order(true);  // Positions scattered over the tars: plain shards.
  EXPECT_EQ(Pairs(JobShards(spec, 12, 4)), Pairs(MakeShards(12, 4)));
}

}  // namespace
}  // namespace tally
