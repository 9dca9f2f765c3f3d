#include "metrics/exact_sum.h"

#include <cmath>

namespace tally {
namespace {
constexpr int64_t kMask = (int64_t{1} << 32) - 1;
constexpr int64_t kResolveEvery = int64_t{1} << 30;
}  // namespace

void ExactSum::Add(double x) {
  if (x == 0 || !std::isfinite(x)) return;
  int e = 0;
  const double m = std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1).
  uint64_t mantissa = static_cast<uint64_t>(std::ldexp(m, 53));  // Exact: |x| = mantissa 2^(e - 53).
  int p = e - 53 + 1074;                                         // Bit of limb 0 that mantissa's bit 0 lands on.
  if (p < 0) {  // A subnormal: its low bits are zero.
    mantissa >>= -p;
    p = 0;
  }
  const unsigned __int128 v = static_cast<unsigned __int128>(mantissa) << (p % 32);
  const int i = p / 32;
  const int64_t sign = x < 0 ? -1 : 1;
  limb_[i] += sign * static_cast<int64_t>(v & kMask);
  limb_[i + 1] += sign * static_cast<int64_t>((v >> 32) & kMask);
  limb_[i + 2] += sign * static_cast<int64_t>(v >> 64);
  if (++adds_ >= kResolveEvery) Normalize();
}

void ExactSum::Merge(const ExactSum& other) {
  if (adds_ + other.adds_ >= kResolveEvery) Normalize();
  for (int i = 0; i < kLimbs; ++i) limb_[i] += other.limb_[i];
  adds_ += other.adds_ + 1;
  if (adds_ >= kResolveEvery) Normalize();
}

void ExactSum::Normalize() {
  for (int i = 0; i + 1 < kLimbs; ++i) {
    const int64_t carry = limb_[i] >> 32;  // Floor: leaves the limb in [0, 2^32).
    limb_[i] -= carry * (int64_t{1} << 32);
    limb_[i + 1] += carry;
  }
  adds_ = 0;
}

double ExactSum::Value() const {
  ExactSum s = *this;
  s.Normalize();
  const bool negative = s.limb_[kLimbs - 1] < 0;
  if (negative) {
    for (int64_t& l : s.limb_) l = -l;
    s.Normalize();
  }
  int h = kLimbs - 1;
  while (h >= 0 && s.limb_[h] == 0) --h;
  if (h < 0) return 0.0;
  // The top three limbs (up to 98 bits, bit 0 weighing 2^(32 lo - 1074)) and whether any bit below them is set.
  const int lo = h >= 2 ? h - 2 : 0;
  unsigned __int128 top = 0;
  for (int i = h; i >= lo; --i) top = (top << 32) | static_cast<uint64_t>(s.limb_[i]);
  bool sticky = false;
  for (int i = 0; i < lo; ++i) sticky |= s.limb_[i] != 0;
  int bits = 0;
  for (unsigned __int128 t = top; t != 0; t >>= 1) ++bits;
  int exponent = 32 * lo - 1074;
  uint64_t mantissa;
  if (bits <= 53) {
    mantissa = static_cast<uint64_t>(top);  // Exact (and then no sticky bit can be set).
  } else {
    const int shift = bits - 53;
    mantissa = static_cast<uint64_t>(top >> shift);
    const unsigned __int128 rest = top & ((static_cast<unsigned __int128>(1) << shift) - 1);
    const unsigned __int128 half = static_cast<unsigned __int128>(1) << (shift - 1);
    if (rest > half || (rest == half && (sticky || (mantissa & 1)))) ++mantissa;  // To nearest, ties to even.
    exponent += shift;
  }
  const double value = std::ldexp(static_cast<double>(mantissa), exponent);
  return negative ? -value : value;
}

}  // namespace tally
