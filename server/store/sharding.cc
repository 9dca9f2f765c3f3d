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

std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size, const std::vector<int64_t>& starts,
                                   const std::vector<bool>& whole) {
  if (starts.empty()) return MakeShards(total_rows, shard_size);
  if (shard_size <= 0) shard_size = 1;
  std::vector<ShardRange> shards;
  auto cut = [&](int64_t begin, int64_t end, bool one) {
    end = std::min(end, total_rows);
    if (begin >= end) return;
    if (one) {
      shards.push_back({begin, end});
      return;
    }
    for (int64_t b = begin; b < end;) {
      const int64_t next = std::min(end, (b / shard_size + 1) * shard_size);  // The next global multiple.
      shards.push_back({b, next});
      b = next;
    }
  };
  cut(0, starts[0], false);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t end = i + 1 < starts.size() ? starts[i + 1] : total_rows;
    cut(starts[i], end, i < whole.size() && whole[i]);
  }
  return shards;
}

std::vector<ShardRange> JobShards(const v1::JobSpec& spec, int64_t planned, int64_t shard_size) {
  if (spec.random_order() || spec.tar_starts().empty()) return MakeShards(planned, shard_size);
  const std::vector<int64_t> starts(spec.tar_starts().begin(), spec.tar_starts().end());
  const std::vector<bool> whole(spec.tar_compressed().begin(), spec.tar_compressed().end());
  return MakeShards(planned, shard_size, starts, whole);
}

}  // namespace tally
