// How a manifest of N rows is cut into shards: contiguous index ranges [begin, end).
#ifndef TALLY_SERVER_STORE_SHARDING_H_
#define TALLY_SERVER_STORE_SHARDING_H_

#include <cstdint>
#include <vector>

#include "proto/tally.pb.h"

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
// evaluates a shard (see docs/how-it-works.md "Exact results").
int64_t EffectiveShardSize(int64_t total_rows, int64_t requested, int64_t batch_alignment);

// Shards of a manifest of `total_rows` rows cut at `shard_size` rows (0 when either is 0).
int64_t NumShards(int64_t total_rows, int64_t shard_size);

// Cuts [0, total_rows) into consecutive shards of `shard_size` rows (the last may be shorter).
std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size);

// The shards of a job read from tar shards (docs/data.md "Where your data can be"): [0, total_rows) cut
// at multiples of `shard_size` and also at every `starts[i]` (the first row of tar i), so that no
// shard spans two tars; the rows of a tar whose `whole[i]` is set (a compressed tar, read front to
// back) are one shard whatever their number. Without starts it is MakeShards. Rows before
// starts[0] or at and after total_rows are not cut (a --sample prefix ends where it ends).
std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size, const std::vector<int64_t>& starts,
                                   const std::vector<bool>& whole);

// A job's shards over its first `planned` positions: cut at the tars' first rows (spec.tar_starts)
// when it reads tar shards in their order; a random order's positions are scattered over the tars,
// so there they are plain MakeShards (and compressed tars are refused at submission).
std::vector<ShardRange> JobShards(const v1::JobSpec& spec, int64_t planned, int64_t shard_size);

}  // namespace tally

#endif  // TALLY_SERVER_STORE_SHARDING_H_
