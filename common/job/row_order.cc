#include "common/job/row_order.h"

namespace tally {
namespace {

uint64_t Mix(uint64_t z) {  // SplitMix64's finaliser.
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr int kRounds = 4;

}  // namespace

RowOrder::RowOrder(int64_t rows, bool random, uint64_t seed) : rows_(rows), random_(random && rows > 1), seed_(seed) {
  int bits = 2;
  while (bits < 62 && (int64_t{1} << bits) < rows) ++bits;
  if (bits % 2 != 0) ++bits;
  half_bits_ = bits / 2;
}

uint64_t RowOrder::Round(int r, uint64_t half) const {
  return Mix(seed_ ^ Mix(half * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(r))) & ((uint64_t{1} << half_bits_) - 1);
}

uint64_t RowOrder::Encrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t next = left ^ Round(r, right);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t RowOrder::Decrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int r = kRounds - 1; r >= 0; --r) {
    const uint64_t prev = right ^ Round(r, left);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

int64_t RowOrder::IndexAt(int64_t position) const {
  if (!random_ || position < 0 || position >= rows_) return position;
  uint64_t x = Encrypt(static_cast<uint64_t>(position));
  while (x >= static_cast<uint64_t>(rows_)) x = Encrypt(x);  // Cycle walking: stays a bijection on [0, rows).
  return static_cast<int64_t>(x);
}

int64_t RowOrder::PositionOf(int64_t index) const {
  if (!random_ || index < 0 || index >= rows_) return index;
  uint64_t x = Decrypt(static_cast<uint64_t>(index));
  while (x >= static_cast<uint64_t>(rows_)) x = Decrypt(x);
  return static_cast<int64_t>(x);
}

}  // namespace tally
