// Sizes computed from dimensions that a header or a JSON field gives (an image's height and width,
// a volume's three dimensions, an RLE's size): in checked 64-bit arithmetic, so that a file
// declaring 2^32 x 2^32 pixels is refused as too large instead of wrapping to 0 and passing a limit.
#ifndef TALLY_BASE_CHECKED_MATH_H_
#define TALLY_BASE_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>

namespace tally {

// The product of the factors, or -1 when one is negative or the product passes int64's range.
// Callers compare the result with their limit as "p < 0 || p > limit".
inline int64_t CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(product, f, &product)) return -1;
  }
  return product;
}

// True when the factors' product is at most `limit` (and none is negative).
inline bool ProductWithin(std::initializer_list<int64_t> factors, int64_t limit) {
  const int64_t p = CheckedProduct(factors);
  return p >= 0 && p <= limit;
}

}  // namespace tally

#endif  // TALLY_BASE_CHECKED_MATH_H_
