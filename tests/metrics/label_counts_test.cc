// Counting on the CPU, hand-worked: the confusion matrix of a label map against its reference, and
// the per-class counts the model path takes from a matrix.
#include "metrics/label_counts.h"

#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

// Reference 0 0 1 1 2 I 2 (I ignored), prediction 0 1 1 1 2 0 0.
TEST(LabelCountsTest, ConfusionMatrixHandWorked) {
  const std::vector<uint16_t> ref = {0, 0, 1, 1, 2, kIgnoredPixel, 2};
  const std::vector<uint16_t> pred = {0, 1, 1, 1, 2, 0, 0};
  std::vector<int64_t> m(9, 0);
  CountConfusionMatrix(pred.data(), ref.data(), ref.size(), 3, m.data());
  // Rows: reference 0 -> {0: 1, 1: 1}; 1 -> {1: 2}; 2 -> {2: 1, 0: 1}; the ignored pixel nowhere.
  EXPECT_EQ(m, (std::vector<int64_t>{1, 1, 0, 0, 2, 0, 1, 0, 1}));
  // Counts add up over calls (the runner counts a batch's images into one buffer each).
  CountConfusionMatrix(pred.data(), ref.data(), 1, 3, m.data());
  EXPECT_EQ(m[0], 2);
}

TEST(LabelCountsTest, ClassCountsFromMatrixMatchCountClasses) {
  const std::vector<uint16_t> ref = {0, 0, 1, 1, 2, kIgnoredPixel, 2};
  const std::vector<uint16_t> pred = {0, 1, 1, 1, 2, 0, 0};
  std::vector<int64_t> m(9, 0);
  CountConfusionMatrix(pred.data(), ref.data(), ref.size(), 3, m.data());
  std::vector<ConfusionCounts> from_matrix;
  ClassCountsFromMatrix(m.data(), 3, &from_matrix);
  // Class 1 by hand: TP 2 (pixels 2, 3), FP 1 (pixel 1), FN 0, TN 3 (pixels 0, 4, 6).
  EXPECT_EQ(from_matrix[1].tp, 2);
  EXPECT_EQ(from_matrix[1].fp, 1);
  EXPECT_EQ(from_matrix[1].fn, 0);
  EXPECT_EQ(from_matrix[1].tn, 3);
  std::vector<ConfusionCounts> direct;
  CountClasses(pred.data(), ref.data(), static_cast<int64_t>(ref.size()), 3, &direct);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(from_matrix[c].tp, direct[c].tp) << c;
    EXPECT_EQ(from_matrix[c].fp, direct[c].fp) << c;
    EXPECT_EQ(from_matrix[c].fn, direct[c].fn) << c;
    EXPECT_EQ(from_matrix[c].tn, direct[c].tn) << c;
  }
}

}  // namespace
}  // namespace tally
