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
  // Rows [begin, end) of uncompressed tars: cut at global multiples of the size, as a manifest's.
  auto plain = [&](int64_t begin, int64_t end) {
    end = std::min(end, total_rows);
    for (int64_t b = begin; b < end;) {
      const int64_t next = std::min(end, (b / shard_size + 1) * shard_size);
      shards.push_back({b, next});
      b = next;
    }
  };
  int64_t from = 0;  // The first row not yet in a shard.
  for (size_t i = 0; i < starts.size(); ++i) {
    if (i >= whole.size() || !whole[i]) continue;
    const int64_t begin = std::min(starts[i], total_rows);
    const int64_t end = std::min(i + 1 < starts.size() ? starts[i + 1] : total_rows, total_rows);
    if (begin >= end) continue;
    plain(from, begin);
    shards.push_back({begin, end});
    from = end;
  }
  plain(from, total_rows);
  return shards;
}

std::vector<ShardRange> JobShards(const v1::JobSpec& spec, int64_t planned, int64_t shard_size) {
  if (spec.random_order() || spec.tar_starts().empty()) return MakeShards(planned, shard_size);
  const std::vector<int64_t> starts(spec.tar_starts().begin(), spec.tar_starts().end());
  const std::vector<bool> whole(spec.tar_compressed().begin(), spec.tar_compressed().end());
  return MakeShards(planned, shard_size, starts, whole);
}

}  // namespace tally
