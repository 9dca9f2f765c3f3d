// The order a job evaluates its manifest's rows in (JobSpec.random_order): the manifest's, or a
// pseudo-random permutation fixed by a seed, so that every prefix of the evaluated rows is a
// uniform random sample of the manifest (docs/metrics.md "Answers before the end"). The coordinator works in
// positions: shards are ranges [begin, end) of positions, the row at position p is IndexAt(p), and
// results, which name their manifest index, are placed back with PositionOf.
//
// The permutation is a 4-round Feistel network keyed by the seed over the smallest even-bit power
// of two holding the rows, restricted to [0, rows) by cycle walking (Black & Rogaway 2002): a
// bijection computed in O(1) memory both ways, so nothing is stored per row and a restarted
// coordinator finds the same order from the spec.
#ifndef TALLY_COMMON_JOB_ROW_ORDER_H_
#define TALLY_COMMON_JOB_ROW_ORDER_H_

#include <cstdint>

namespace tally {

class RowOrder {
 public:
  RowOrder() = default;  // The manifest's order.
  RowOrder(int64_t rows, bool random, uint64_t seed);

  bool random() const { return random_; }
  int64_t IndexAt(int64_t position) const;  // Position -> manifest index.
  int64_t PositionOf(int64_t index) const;  // Manifest index -> position.

 private:
  uint64_t Round(int r, uint64_t half) const;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t x) const;

  int64_t rows_ = 0;
  bool random_ = false;
  uint64_t seed_ = 0;
  int half_bits_ = 1;
};

}  // namespace tally

#endif  // TALLY_COMMON_JOB_ROW_ORDER_H_
