// --order random's permutation: a bijection of [0, rows) both ways for any row count, fixed by its
// seed, and uniform enough that each row is equally likely to come first.
#include "common/job/row_order.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(RowOrderTest, IsABijectionWithItsInverseForAnyRowCount) {
  for (int64_t rows : {0, 1, 2, 3, 5, 7, 16, 17, 100, 1000, 4097, 65537}) {
    const RowOrder order(rows, true, 12345);
    std::vector<bool> seen(rows, false);
    int64_t moved = 0;
    for (int64_t p = 0; p < rows; ++p) {
      const int64_t i = order.IndexAt(p);
      ASSERT_GE(i, 0);
      ASSERT_LT(i, rows);
      ASSERT_FALSE(seen[i]) << "rows " << rows << ": index " << i << " twice";
      seen[i] = true;
      ASSERT_EQ(order.PositionOf(i), p);
      moved += i != p;
    }
    if (rows >= 16) EXPECT_GT(moved, rows / 2) << rows;  // Not (nearly) the identity.
  }
}

TEST(RowOrderTest, TheManifestOrderIsTheIdentityAndSeedsDiffer) {
  const RowOrder manifest(100, false, 7);
  for (int64_t p = 0; p < 100; ++p) EXPECT_EQ(manifest.IndexAt(p), p);
  const RowOrder a(1000, true, 1), b(1000, true, 1), c(1000, true, 2);
  int64_t same = 0;
  for (int64_t p = 0; p < 1000; ++p) {
    EXPECT_EQ(a.IndexAt(p), b.IndexAt(p));
    same += a.IndexAt(p) == c.IndexAt(p);
  }
  EXPECT_LT(same, 20);
}

// Over 20 000 seeds, each of 10 rows comes first about 2 000 times (+/- 4.5 standard deviations
// of a Binomial(20000, 0.1): 190), and the first 3 positions of 1000 rows hold a sample whose mean
// index is about 499.5.
TEST(RowOrderTest, EveryRowIsEquallyLikelyToComeFirst) {
  std::vector<int> first(10, 0);
  double mean_sum = 0;
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    first[RowOrder(10, true, seed).IndexAt(0)]++;
    const RowOrder big(1000, true, seed);
    mean_sum += (big.IndexAt(0) + big.IndexAt(1) + big.IndexAt(2)) / 3.0;
  }
  for (int c : first) EXPECT_NEAR(c, 2000, 190);
  // Mean of 3 uniform indices: sd 288.7 / sqrt(3); over 20000 seeds the mean's sd is 1.18.
  EXPECT_NEAR(mean_sum / 20000, 499.5, 6);
}

}  // namespace
}  // namespace tally
