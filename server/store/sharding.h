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

// The shards of a job read from tar shards (docs/data.md "Tar shards"): the rows of a tar whose
// `whole[i]` is set (a compressed tar, read front to back) are one shard whatever their number; the
// rows of uncompressed tars are cut at global multiples of `shard_size`, as a manifest's are, tar
// boundaries or not (a member is one pread wherever it lies), so that batches are full and the same
// index-aligned blocks as the same rows' in a manifest. `starts[i]` is the first row of tar i.
// Without starts it is MakeShards; nothing is cut at or after total_rows (a --sample prefix).
std::vector<ShardRange> MakeShards(int64_t total_rows, int64_t shard_size, const std::vector<int64_t>& starts,
                                   const std::vector<bool>& whole);

// A job's shards over its first `planned` positions: compressed tars whole (spec.tar_starts,
// spec.tar_compressed) when it reads tar shards in their order; a random order's positions are scattered over the tars,
// so there they are plain MakeShards (and compressed tars are refused at submission).
std::vector<ShardRange> JobShards(const v1::JobSpec& spec, int64_t planned, int64_t shard_size);

}  // namespace tally

#endif  // TALLY_SERVER_STORE_SHARDING_H_
