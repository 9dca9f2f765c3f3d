// Calibration (metrics/calibration.h): the counts of a hand-worked image, the bins' edges, the ECE and
// the equal-mass bins of hand-built histograms, and one row's ECE and mean confidence.
#include "metrics/calibration.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(CalibrationTest, BinEdgesAndUnits) {
  EXPECT_EQ(CalibrationBin(0.f), 0);
  EXPECT_EQ(CalibrationBin(1.f), 14);  // 1 in the last bin.
  EXPECT_EQ(CalibrationBin(std::nanf("")), 0);
  EXPECT_EQ(CalibrationBin(0.5f), 7);     // 7.5 -> 7.
  EXPECT_EQ(CalibrationBin(0.2f), 3);     // float(0.2) = 0.2000000029..: 3.0000000447 -> 3.
  EXPECT_EQ(CalibrationBin(0.19999999f), 2);
  EXPECT_EQ(CalibrationFineBin(1.f), 65535);
  EXPECT_EQ(CalibrationFineBin(0.5f), 32768);
  EXPECT_EQ(CalibrationFineBin(1.f / 65536), 1);
  EXPECT_EQ(ConfidenceUnits(1.f), uint64_t{1} << 32);
  EXPECT_EQ(ConfidenceUnits(0.25f), uint64_t{1} << 30);
  EXPECT_EQ(ConfidenceUnits(std::nanf("")), 0u);
}

// One image of 4 pixels, 2 classes: probabilities of class 1 are 0.9, 0.6, 0.3, 0.1 (class 0: 1 - p);
// reference 1, 0, 0, 0; the prediction the argmax (1, 1, 0, 0); the third pixel ignored (-1).
TEST(CalibrationTest, HandWorkedImage) {
  const std::vector<float> probs = {0.1f, 0.4f, 0.7f, 0.9f, 0.9f, 0.6f, 0.3f, 0.1f};
  const std::vector<int16_t> ref = {1, 0, -1, 0};
  const std::vector<int16_t> pred = {1, 1, 0, 0};
  std::vector<int64_t> rows(CalibrationRowSize(2), 0), fine(CalibrationFineSize(2), 0);
  CountCalibration(probs.data(), ref.data(), pred.data(), 1, 2, 4, rows.data(), fine.data());
  auto cell = [&](int h, int b, int v) { return rows[(h * kCalibrationBins + b) * kCalibrationValues + v]; };
  // Top label (h = 2): v = 0.9 (right), 0.6 (wrong), 0.9 (right: class 0 for reference 0).
  EXPECT_EQ(cell(2, CalibrationBin(0.9f), 0), 2);
  EXPECT_EQ(cell(2, CalibrationBin(0.9f), 1), 2);
  EXPECT_EQ(cell(2, CalibrationBin(0.6f), 0), 1);
  EXPECT_EQ(cell(2, CalibrationBin(0.6f), 1), 0);
  EXPECT_EQ(cell(2, CalibrationBin(0.6f), 2), static_cast<int64_t>(ConfidenceUnits(0.6f)));
  // Class 1: v = 0.9 (reference 1), 0.6, 0.1 (reference 0).
  EXPECT_EQ(cell(1, CalibrationBin(0.1f), 0), 1);
  EXPECT_EQ(cell(1, CalibrationBin(0.1f), 1), 0);
  EXPECT_EQ(cell(1, CalibrationBin(0.9f), 1), 1);
  EXPECT_EQ(fine[2 * (2 * kCalibrationFineBins + CalibrationFineBin(0.9f))], 2);
  // The top label's ECE by hand: bin of 0.9: |2 - 1.8|; bin of 0.6: |0 - 0.6|; over 3 pixels.
  const double want = (std::fabs(2 - 2 * static_cast<double>(0.9f)) + static_cast<double>(0.6f)) / 3;
  EXPECT_NEAR(RowEce(rows.data(), 2), want, 1e-9);
  EXPECT_NEAR(RowConfidence(rows.data(), 2), (2 * static_cast<double>(0.9f) + 0.6f) / 3, 1e-9);
  CalibrationTotals t;
  ASSERT_TRUE(t.AddRow(rows.data(), static_cast<int64_t>(rows.size()), 2));
  EXPECT_FALSE(t.AddRow(rows.data(), static_cast<int64_t>(rows.size()), 3));  // Another class count.
  const CalibrationSummary s = SummarizeCalibration(t, false);
  EXPECT_NEAR(s.top.ece, want, 1e-9);
  EXPECT_EQ(s.top.pixels, 3);
  EXPECT_TRUE(std::isnan(s.top.ace));
}

// Equal-mass bins from a fine histogram: 30 pixels in 3 fine bins of 10 (15 bins of 2 pixels each
// would split them; whole fine bins make 3 bins), accuracy 1, 0.5, 0 at centres.
TEST(CalibrationTest, EqualMassTakesWholeFineBins) {
  std::vector<int64_t> row(CalibrationRowSize(1), 0);
  row[(1 * kCalibrationBins + 0) * kCalibrationValues] = 30;  // The top label's 30 pixels (values unused here).
  CalibrationTotals t;
  ASSERT_TRUE(t.AddRow(row.data(), static_cast<int64_t>(row.size()), 1));
  const int bins[3] = {6553, 32768, 65535};
  const int64_t right[3] = {10, 5, 0};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.AddFine(1, bins[i], 10, right[i]));
  EXPECT_FALSE(t.AddFine(2, 0, 1, 0));  // No such histogram.
  const CalibrationSummary s = SummarizeCalibration(t, true);
  double want = 0;
  for (int i = 0; i < 3; ++i) want += std::fabs(right[i] / 10.0 - (bins[i] + 0.5) / 65536);
  EXPECT_NEAR(s.top.ace, want / 3, 1e-12);
}

// A store's batch padded with copies of its last row: the copies count in their rows' bins only.
TEST(CalibrationTest, ImagesPastTheFineLimitCountInTheirRowsOnly) {
  const std::vector<float> probs = {0.25f, 0.75f, 0.25f, 0.75f};  // 2 images of 1 pixel, 2 classes.
  const std::vector<int16_t> ref = {1, 1}, pred = {1, 1};
  std::vector<int64_t> rows(2 * CalibrationRowSize(2), 0), fine(CalibrationFineSize(2), 0);
  CountCalibration(probs.data(), ref.data(), pred.data(), 2, 2, 1, rows.data(), fine.data(), 1);
  int64_t pixels = 0;
  for (size_t c = 0; c < fine.size(); c += 2) pixels += fine[c];
  EXPECT_EQ(pixels, 3);  // One image, three histograms.
  EXPECT_EQ(RowConfidence(rows.data() + CalibrationRowSize(2), 2), 0.75);
}

}  // namespace
}  // namespace tally
