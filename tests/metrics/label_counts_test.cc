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

// Class c's counts, pixel by pixel, ignored reference pixels left out: what CountClasses must give.
ConfusionCounts PixelByPixel(const std::vector<uint16_t>& pred, const std::vector<uint16_t>& ref, int c) {
  ConfusionCounts want{0, 0, 0, 0};
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == kIgnoredPixel) continue;
    const bool r = ref[i] == c, p = pred[i] == c;
    want.tp += r && p;
    want.fp += !r && p;
    want.fn += r && !p;
    want.tn += !r && !p;
  }
  return want;
}

// Long stretches of one pair (background in both, a disagreeing pair, ignored pixels: counted a
// stretch at a time), mixed pixels and a length that is no multiple of the 32-pixel blocks: each
// class's counts against a per-pixel count written here, pixel by pixel.
TEST(LabelCountsTest, CountClassesOnUniformBlocksMixedPixelsAndIgnoredPixelsMatchesPixelByPixel) {
  const int64_t n = 16 * 700 + 13;
  std::vector<uint16_t> ref(n, 0), pred(n, 0);
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int64_t i = 0; i < n; ++i) {
    if ((i / 160) % 3 == 0) continue;  // Background in both.
    ref[i] = static_cast<uint16_t>(next() >> 29);  // 0..7
    pred[i] = (next() >> 28) % 3 == 0 ? static_cast<uint16_t>(next() >> 29) : ref[i];
    if ((next() >> 27) == 0) ref[i] = kIgnoredPixel;
  }
  for (int64_t i = n / 2; i < n / 2 + 200; ++i) {  // Whole blocks of one disagreeing pair...
    pred[i] = 5;
    ref[i] = 3;
  }
  for (int64_t i = n / 2 + 200; i < n / 2 + 400; ++i) {  // ...and of ignored pixels.
    pred[i] = 2;
    ref[i] = kIgnoredPixel;
  }
  ref[n - 1] = 3;  // The tail past the last whole block.
  pred[n - 1] = 0;
  const int classes = 8;
  std::vector<ConfusionCounts> got;
  CountClasses(pred.data(), ref.data(), n, classes, &got);
  ASSERT_EQ(got.size(), static_cast<size_t>(classes));
  for (int c = 0; c < classes; ++c) {
    const ConfusionCounts want = PixelByPixel(pred, ref, c);
    EXPECT_EQ(got[c].tp, want.tp) << c;
    EXPECT_EQ(got[c].fp, want.fp) << c;
    EXPECT_EQ(got[c].fn, want.fn) << c;
    EXPECT_EQ(got[c].tn, want.tn) << c;
  }
}

// Stretches that end exactly at, just before and just after the 32-pixel blocks' edges, on maps of
// every length from 1 to 130 pixels: against a per-pixel count written here.
TEST(LabelCountsTest, CountClassesStretchesAcrossBlockEdgesMatchPixelByPixel) {
  const int classes = 4;
  for (int64_t n = 1; n <= 130; ++n) {
    std::vector<uint16_t> ref(n), pred(n);
    for (int64_t i = 0; i < n; ++i) {
      ref[i] = static_cast<uint16_t>((i / 32) % classes);        // Changes at every block edge.
      pred[i] = static_cast<uint16_t>(((i + 1) / 31) % classes);  // Changes just before or after one.
      if (i % 45 == 44) ref[i] = kIgnoredPixel;
    }
    std::vector<ConfusionCounts> got;
    CountClasses(pred.data(), ref.data(), n, classes, &got);
    for (int c = 0; c < classes; ++c) {
      const ConfusionCounts want = PixelByPixel(pred, ref, c);
      EXPECT_EQ(got[c].tp, want.tp) << n << " " << c;
      EXPECT_EQ(got[c].fp, want.fp) << n << " " << c;
      EXPECT_EQ(got[c].fn, want.fn) << n << " " << c;
      EXPECT_EQ(got[c].tn, want.tn) << n << " " << c;
    }
  }
}

TEST(LabelCountsTest, NarrowedLabelsAreTheClampedValuesForEveryUint16) {
  // Every value, at every alignment of the 16-label blocks (offsets 0-16, so the tails are covered).
  std::vector<uint16_t> all(65536 + 40);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u + 7u);
  for (size_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (int offset : {0, 1, 7, 15, 16}) {
    const uint16_t* in = all.data() + offset;
    const int64_t n = static_cast<int64_t>(all.size()) - offset;
    std::vector<uint8_t> pred(n), ref(n);
    NarrowPrediction(in, n, pred.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(pred[i], in[i] > 255 ? 255 : in[i]) << "value " << in[i];
    for (int ignore : {0, 3, 253, 254, 255, 256, 40000, 65535}) {
      NarrowReference(in, n, static_cast<uint16_t>(ignore), ref.data());
      for (int64_t i = 0; i < n; ++i) {
        const int want = in[i] == ignore ? 255 : in[i] > 254 ? 254 : in[i];
        ASSERT_EQ(ref[i], want) << "value " << in[i] << ", ignore " << ignore;
      }
    }
  }
}

}  // namespace
}  // namespace tally
