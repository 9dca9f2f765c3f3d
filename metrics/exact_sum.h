// ExactSum: the exact sum of finite doubles, rounded once (to nearest, ties to even) when read.
//
// The aggregates of a job are fed as results arrive, in whatever order the workers send them;
// a floating-point running sum (even a compensated one) depends on that order in its last bits.
// This one does not: every double is an integer multiple of 2^-1074, so the sum is kept as one
// long fixed-point integer (a "superaccumulator", Kulisch; the same idea as Neal 2015, "Fast exact
// summation using small and large superaccumulators") in 67 limbs of 32 bits, each in an int64 so
// that carries can wait (they are resolved every 2^30 additions). Adding costs a frexp and three
// limb additions; Value() resolves the carries and rounds the integer to the nearest double.
// Merge() adds another accumulator's limbs: any order and any split of the same values gives the
// same Value(), to the bit. Infinities and NaN must be left out by the caller.
#ifndef TALLY_METRICS_EXACT_SUM_H_
#define TALLY_METRICS_EXACT_SUM_H_

#include <array>
#include <cstdint>

namespace tally {

class ExactSum {
 public:
  void Add(double x);
  void Merge(const ExactSum& other);
  // The exact sum rounded to the nearest double (ties to even); +/-inf past the double range.
  double Value() const;

 private:
  // Bit 0 of limb 0 weighs 2^-1074 (the smallest subnormal); 67 x 32 bits reach 2^1070 with the
  // top limb's headroom for the carries.
  static constexpr int kLimbs = 67;
  void Normalize();
  std::array<int64_t, kLimbs> limb_{};
  int64_t adds_ = 0;     // Additions since the carries were last resolved.
};

}  // namespace tally

#endif  // TALLY_METRICS_EXACT_SUM_H_
