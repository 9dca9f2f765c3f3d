// Lesion-wise metrics (metrics/lesion.h): hand-worked 2D and 3D cases — both empty, only false
// positives, a lesion split in two by the prediction, two lesions merged by it, touching lesions,
// a lesion below the volume threshold — under dilation (BraTS) and IoU matching.
#include "metrics/lesion.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/surface_distance.h"

namespace tally {
namespace {

// A 2D mask from rows of '.' and '#'.
std::vector<uint8_t> Mask(const std::vector<std::string>& rows) {
  std::vector<uint8_t> m;
  for (const std::string& r : rows) {
    for (char c : r) m.push_back(c == '#');
  }
  return m;
}

LesionSummary Run2D(const std::vector<std::string>& pred, const std::vector<std::string>& ref, LesionOptions o,
                    std::vector<LesionRecord>* records = nullptr) {
  const std::vector<uint8_t> p = Mask(pred), r = Mask(ref);
  LesionSummary s;
  const absl::Status st = ComputeLesions(p.data(), r.data(), 1, static_cast<int>(ref.size()),
                                         static_cast<int>(ref[0].size()), o, &s, records);
  EXPECT_TRUE(st.ok()) << st;
  return s;
}

LesionOptions NoThreshold(int dilation) {
  LesionOptions o;
  o.dilation = dilation;
  o.min_volume = 0;
  return o;
}

TEST(LesionTest, BothEmptyScoresOneAndZero) {
  const LesionSummary s = Run2D({"....", "...."}, {"....", "...."}, LesionOptions{});
  EXPECT_EQ(s.lesions + s.tp + s.fn + s.fp + s.small, 0);
  EXPECT_EQ(LesionDice(s), 1.0);
  EXPECT_EQ(LesionHd95(s), 0.0);
}

TEST(LesionTest, OnlyFalsePositivesScoreZeroAndTheMaximum) {
  std::vector<LesionRecord> rec;
  const LesionSummary s = Run2D({"#....", ".....", "...##"}, {".....", ".....", "....."}, LesionOptions{}, &rec);
  EXPECT_EQ(s.fp, 2);
  EXPECT_EQ(s.lesions, 0);
  EXPECT_EQ(LesionDice(s), 0.0);
  EXPECT_EQ(LesionHd95(s), 374.0);
  ASSERT_EQ(rec.size(), 2u);
  EXPECT_EQ(rec[0].kind, LesionKind::kFalsePositive);
  EXPECT_EQ(rec[0].component, 1);
  EXPECT_EQ(rec[1].voxels, 2);
}

// Reference: a bar of 6 pixels. Prediction: its two ends (2 + 2 pixels), two components.
// Dice = 2 * 4 / (6 + 4) = 0.8. Distances: prediction pixels lie on the bar (0); bar pixels to the
// prediction: 0 0 1 1 0 0, whose 95th percentile (linear) is 1.
TEST(LesionTest, LesionSplitInTwoIsOneTruePositive) {
  const std::vector<std::string> ref = {"........", ".######.", "........"};
  const std::vector<std::string> pred = {"........", ".##..##.", "........"};
  std::vector<LesionRecord> rec;
  const LesionSummary s = Run2D(pred, ref, NoThreshold(1), &rec);
  EXPECT_EQ(s.tp, 1);
  EXPECT_EQ(s.fp, 0);
  EXPECT_EQ(s.fn, 0);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].matched, 2);
  EXPECT_EQ(rec[0].matched_voxels, 4);
  EXPECT_DOUBLE_EQ(rec[0].dice, 0.8);
  EXPECT_DOUBLE_EQ(rec[0].hd95, 1.0);
  EXPECT_DOUBLE_EQ(LesionDice(s), 0.8);
  EXPECT_DOUBLE_EQ(LesionHd95(s), 1.0);
  // IoU matching at 0.5: each end covers 2/6 of the bar, so nothing matches: one missed lesion and
  // two false positives, Dice 0 / 3.
  LesionOptions iou = NoThreshold(0);
  iou.iou_threshold = 0.5;
  const LesionSummary t = Run2D(pred, ref, iou);
  EXPECT_EQ(t.fn, 1);
  EXPECT_EQ(t.fp, 2);
  EXPECT_EQ(LesionDice(t), 0.0);
  EXPECT_DOUBLE_EQ(LesionHd95(t), 374.0);
}

// Two 2x2 reference squares three columns apart; the prediction is one bar over both (2 x 7).
// Dilation 1: the squares stay apart, each gets the bar: Dice 2*4/(4+14) each. Dilation 3: their
// dilations meet, one lesion of 8 pixels: Dice 2*8/(8+14).
TEST(LesionTest, TwoLesionsMergedByThePrediction) {
  const std::vector<std::string> ref = {"...........", "..##...##..", "..##...##..", "..........."};
  const std::vector<std::string> pred = {"...........", "..#######..", "..#######..", "..........."};
  const LesionSummary apart = Run2D(pred, ref, NoThreshold(1));
  EXPECT_EQ(apart.lesions, 2);
  EXPECT_EQ(apart.tp, 2);
  EXPECT_EQ(apart.fp, 0);
  EXPECT_DOUBLE_EQ(LesionDice(apart), 8.0 / 18.0);
  const LesionSummary merged = Run2D(pred, ref, NoThreshold(3));
  EXPECT_EQ(merged.lesions, 1);
  EXPECT_EQ(merged.tp, 1);
  EXPECT_DOUBLE_EQ(LesionDice(merged), 16.0 / 22.0);
}

// Diagonal neighbours: one lesion with the full (8) neighbourhood, two with 4.
TEST(LesionTest, TouchingLesionsFollowTheConnectivity) {
  const std::vector<std::string> ref = {"##...", "##...", "..##.", "..##."};
  const std::vector<std::string> pred = {".....", ".....", ".....", "....."};
  EXPECT_EQ(Run2D(pred, ref, NoThreshold(0)).fn, 1);
  LesionOptions four = NoThreshold(0);
  four.connectivity = 4;
  EXPECT_EQ(Run2D(pred, ref, four).fn, 2);
  four.connectivity = 6;
  const std::vector<uint8_t> m = Mask(ref);
  LesionSummary s;
  EXPECT_FALSE(ComputeLesions(m.data(), m.data(), 1, 4, 5, four, &s, nullptr).ok());
}

// A 3-pixel reference lesion under the default 50 threshold is left out, and the component that
// touches it is no false positive.
TEST(LesionTest, SmallLesionIsLeftOutWithItsComponent) {
  std::vector<LesionRecord> rec;
  const LesionSummary s = Run2D({"##....", "......"}, {"###...", "......"}, LesionOptions{}, &rec);
  EXPECT_EQ(s.small, 1);
  EXPECT_EQ(s.lesions, 0);
  EXPECT_EQ(s.fp, 0);
  EXPECT_EQ(LesionDice(s), 1.0);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].kind, LesionKind::kSmall);
  EXPECT_DOUBLE_EQ(rec[0].volume, 3.0);
}

// 3D: a 4x4x4 reference cube (64 voxels > 50), the prediction the same cube moved one voxel along
// x (overlap 48: Dice 96/128) and a lone voxel far away (a false positive). lesion_dice =
// 0.75 / 2; the lesion's HD95 is that of the two cubes alone.
TEST(LesionTest, VolumeWithShiftedCubeAndAFalsePositive) {
  const int d = 10, h = 10, w = 12;
  std::vector<uint8_t> ref(d * h * w, 0), pred(ref.size(), 0), cube(ref.size(), 0);
  auto at = [&](std::vector<uint8_t>& m, int z, int y, int x) -> uint8_t& { return m[(z * h + y) * w + x]; };
  for (int z = 2; z < 6; ++z) {
    for (int y = 2; y < 6; ++y) {
      for (int x = 2; x < 6; ++x) {
        at(ref, z, y, x) = 1;
        at(pred, z, y, x + 1) = 1;
        at(cube, z, y, x + 1) = 1;
      }
    }
  }
  at(pred, 9, 9, 11) = 1;
  LesionOptions o;
  o.spacing_x = 1.0;
  LesionSummary s;
  std::vector<LesionRecord> rec;
  ASSERT_TRUE(ComputeLesions(pred.data(), ref.data(), d, h, w, o, &s, &rec).ok());
  EXPECT_EQ(s.tp, 1);
  EXPECT_EQ(s.fp, 1);
  EXPECT_DOUBLE_EQ(LesionDice(s), 0.375);
  const double hd95 = BinarySurfaceMetrics3D(cube.data(), ref.data(), d, h, w, SurfaceOptions3D{}).hd95;
  EXPECT_DOUBLE_EQ(rec[0].hd95, hd95);
  EXPECT_DOUBLE_EQ(LesionHd95(s), (hd95 + 374) / 2);
  // Anisotropic spacing: volume 64 * 0.5 * 1 * 1 = 32 <= 50: the cube is left out.
  o.spacing_x = 0.5;
  ASSERT_TRUE(ComputeLesions(pred.data(), ref.data(), d, h, w, o, &s, nullptr).ok());
  EXPECT_EQ(s.small, 1);
  EXPECT_EQ(s.fp, 1);
}

}  // namespace
}  // namespace tally
