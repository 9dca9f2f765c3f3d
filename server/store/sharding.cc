#include "server/store/sharding.h"

#include <algorithm>

namespace tally {

int64_t DefaultShardSize(int64_t total_rows) {
  const int64_t target_shards = 256;
  int64_t size = (total_rows + target_shards - 1) / target_shards;
  return std::clamp<int64_t>(size, 8, 1024);
}

int64_t EffectiveShardSize(int64_t total_rows, int64_t requested, int64_t batch_alignment) {
  int64_t size = requested > 0 ? requested : DefaultShardSize(total_rows);
  if (batch_alignment > 1) size = (size + batch_alignment - 1) / batch_alignment * batch_alignment;
  return std::max<int64_t>(size, 1);
}

int64_t NumShards(int64_t total_rows, int64_t shard_size) {
  return shard_size > 0 && total_rows > 0 ? (total_rows + shard_size - 1) / shard_size : 0;
}

std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size) {
  std::vector<ShardRange> shards;
  if (shard_size <= 0) shard_size = 1;
  for (int64_t b = 0; b < total_rows; b += shard_size) {
    shards.push_back({b, std::min(total_rows, b + shard_size)});
  }
  return shards;
}

}  // namespace tally
