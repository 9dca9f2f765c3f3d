#include "metrics/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

double Sum(const std::vector<double>& v) {
  ExactSum s;
  for (double x : v) s.Add(x);
  return s.Value();
}

TEST(ExactSumTest, CancellationThatARunningSumLoses) {
  EXPECT_EQ(Sum({1e100, 1.0, -1e100}), 1.0);
  EXPECT_EQ(Sum({1.0, 1e-30, -1.0}), 1e-30);
  // The doubles nearest 0.1, 0.2 and 0.3 are 0.1000000000000000055511151231257827,
  // 0.2000000000000000111022302462515654 and 0.2999999999999999888977697537484345: their exact
  // sum is 2^-55 (a running sum gives 2^-54).
  EXPECT_EQ(Sum({0.1, 0.2, -0.3}), std::ldexp(1.0, -55));
  EXPECT_EQ(Sum({}), 0.0);
  EXPECT_EQ(Sum({-2.5, -0.25}), -2.75);
}

TEST(ExactSumTest, SubnormalsAndTheTopOfTheRange) {
  const double tiny = std::ldexp(1.0, -1074);
  EXPECT_EQ(Sum({tiny, tiny}), std::ldexp(1.0, -1073));
  EXPECT_EQ(Sum({tiny, tiny, tiny}), 3 * tiny);
  const double big = std::ldexp(1.0, 1020);
  EXPECT_EQ(Sum({big, big, -big}), big);
  EXPECT_TRUE(std::isinf(Sum({std::ldexp(1.0, 1023), std::ldexp(1.0, 1023)})));
}

TEST(ExactSumTest, RoundsTheExactSumToNearestTiesToEven) {
  // 1 + 2^-53 is a tie between 1 and 1 + 2^-52: even is 1. 1 + 2^-53 + 2^-80 is above the tie.
  EXPECT_EQ(Sum({1.0, std::ldexp(1.0, -53)}), 1.0);
  EXPECT_EQ(Sum({1.0, std::ldexp(1.0, -53), std::ldexp(1.0, -80)}), 1.0 + std::ldexp(1.0, -52));
  EXPECT_EQ(Sum({1.0 + std::ldexp(1.0, -52), std::ldexp(1.0, -53)}), 1.0 + std::ldexp(1.0, -51));
}

// Random doubles whose exact sum fits an __int128 of 2^-40 units: the reference is that integer,
// converted once (GCC's conversion rounds to nearest, ties to even).
TEST(ExactSumTest, EqualsAnIndependentIntegerSumInAnyOrderAndSplit) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> v;
    __int128 exact = 0;
    for (int i = 0; i < 5000; ++i) {
      const int64_t mantissa = static_cast<int64_t>(rng() >> 11) * ((rng() & 1) ? 1 : -1);
      const int e = static_cast<int>(rng() % 60);  // Value = mantissa 2^(e - 40 - 20)...
      const double x = std::ldexp(static_cast<double>(mantissa), e - 60);
      exact += static_cast<__int128>(mantissa) << e;  // ... in units of 2^-60.
      v.push_back(x);
    }
    const double want = std::ldexp(static_cast<double>(exact), -60);
    EXPECT_EQ(Sum(v), want) << "trial " << trial;
    std::shuffle(v.begin(), v.end(), rng);
    ExactSum a, b, c;
    for (size_t i = 0; i < v.size(); ++i) (i % 3 == 0 ? a : i % 3 == 1 ? b : c).Add(v[i]);
    b.Merge(c);
    a.Merge(b);
    EXPECT_EQ(a.Value(), want) << "trial " << trial;
  }
}

TEST(ExactSumTest, MillionsOfEqualValuesSumExactly) {
  ExactSum s;
  const double x = 1.0 - std::ldexp(1.0, -53);  // Every bit of the mantissa set.
  const int64_t n = int64_t{1} << 22;
  for (int rep = 0; rep < 3; ++rep) {
    for (int64_t i = 0; i < n; ++i) s.Add(x);
  }
  // 3n x (1 - 2^-53) = 3n - 3n 2^-53: exact in a double (3n < 2^23).
  EXPECT_EQ(s.Value(), 3.0 * n - std::ldexp(3.0 * n, -53));
}

}  // namespace
}  // namespace tally
