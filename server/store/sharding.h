// How a manifest of N rows is cut into shards: contiguous index ranges [begin, end).
#ifndef TALLY_SERVER_STORE_SHARDING_H_
#define TALLY_SERVER_STORE_SHARDING_H_

#include <cstdint>
#include <vector>

namespace tally {

struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Default shard size: about 256 shards per job, between 8 and 1024 rows each, so that every
// worker of a box takes many shards and fast workers take more.
int64_t DefaultShardSize(int64_t total_rows);

// The shard size a job uses: `requested` (or the default when <= 0), rounded up to a multiple of
// `batch_alignment` (> 0) so that the batches a worker forms are the same whichever worker
// evaluates a shard (see README "Exact results").
int64_t EffectiveShardSize(int64_t total_rows, int64_t requested, int64_t batch_alignment);

// Shards of a manifest of `total_rows` rows cut at `shard_size` rows (0 when either is 0).
int64_t NumShards(int64_t total_rows, int64_t shard_size);

// Cuts [0, total_rows) into consecutive shards of `shard_size` rows (the last may be shorter).
std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size);

}  // namespace tally

#endif  // TALLY_SERVER_STORE_SHARDING_H_
