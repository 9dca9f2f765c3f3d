#include "common/formats/thumbnail.h"
#include "common/job/job_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "common/formats/decode.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(ClassOutcomesTest, EachPixelByReferenceAndPrediction) {
  const uint16_t pred[] = {1, 1, 0, 0, 2, 1};
  const uint16_t ref[] = {1, 0, 1, 0, 1, kIgnoredPixel};
  uint8_t out[6];
  ClassOutcomes(pred, ref, 6, 1, out);
  const uint8_t want[] = {kOutcomeTp, kOutcomeFp, kOutcomeFn, kOutcomeNone, kOutcomeFn, kOutcomeIgnored};
  EXPECT_TRUE(std::equal(out, out + 6, want));
  std::vector<uint8_t> member(65536, 0);
  member[1] = member[2] = 1;  // Region 1+2.
  RegionOutcomes(pred, ref, 6, member.data(), out);
  const uint8_t want_region[] = {kOutcomeTp, kOutcomeFp, kOutcomeFn, kOutcomeNone, kOutcomeTp, kOutcomeIgnored};
  EXPECT_TRUE(std::equal(out, out + 6, want_region));
}

TEST(BusiestSliceTest, TheSliceWithMostOutcomesFirstOfEquals) {
  // 3 slices of 2x2: 1, 3 and 3 pixels of tp/fp/fn; ignored pixels do not count.
  const uint8_t o[] = {kOutcomeTp, 0, kOutcomeIgnored, kOutcomeIgnored, kOutcomeFp, kOutcomeFn, kOutcomeTp, 0,
                       kOutcomeTp, kOutcomeTp, kOutcomeTp, kOutcomeIgnored};
  EXPECT_EQ(BusiestSlice(o, 3, 2, 2), 1);
  EXPECT_EQ(BusiestSlice(o, 1, 2, 2), 0);
}

// The JPEG, decoded with the image decoder, shows the outcome colours where they were drawn.
TEST(RenderThumbnailTest, PanelsShowTheImageAndTheOutcomeColours) {
  const int h = 64, w = 64;
  std::vector<uint8_t> rgb(h * w * 3, 200);  // A light grey image.
  std::vector<uint16_t> ref(h * w, 0), pred(h * w, 0);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      ref[y * w + x] = x < 32 ? 1 : 0;   // Reference: left half.
      pred[y * w + x] = y < 32 ? 1 : 0;  // Prediction: top half.
    }
  }
  int slice = -1;
  absl::StatusOr<std::string> jpeg = RenderClassThumbnail(rgb.data(), pred.data(), ref.data(), 1, h, w, 1, nullptr, &slice);
  ASSERT_TRUE(jpeg.ok()) << jpeg.status();
  EXPECT_EQ(slice, 0);
  RgbImage img;
  ASSERT_TRUE(DecodeImage(*jpeg, "thumbnail", &img).ok());
  // Both panels enlarged to 128x128, 4 white columns between them.
  ASSERT_EQ(img.height, kThumbnailSide);
  ASSERT_EQ(img.width, 2 * kThumbnailSide + 4);
  auto at = [&](int y, int x) {
    const uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
    return std::array<int, 3>{p[0], p[1], p[2]};
  };
  auto near = [](std::array<int, 3> got, std::array<int, 3> want) {
    for (int c = 0; c < 3; ++c) {
      if (std::abs(got[c] - want[c]) > 12) return false;
    }
    return true;
  };
  EXPECT_TRUE(near(at(32, 32), {200, 200, 200}));  // Left panel: the image.
  const int r0 = kThumbnailSide + 4;
  // Right panel: 0.7 * colour + 0.3 * the darkened grey (0.7 * 200) of the image.
  const double grey = 0.7 * 200;
  auto blend = [&](int r, int g, int b) {
    return std::array<int, 3>{static_cast<int>(std::lround(0.7 * r + 0.3 * grey)),
                              static_cast<int>(std::lround(0.7 * g + 0.3 * grey)),
                              static_cast<int>(std::lround(0.7 * b + 0.3 * grey))};
  };
  EXPECT_TRUE(near(at(32, r0 + 32), blend(0, 200, 0)));     // tp: green
  EXPECT_TRUE(near(at(32, r0 + 96), blend(235, 30, 30)));   // fp: red
  EXPECT_TRUE(near(at(96, r0 + 32), blend(30, 110, 255)));  // fn: blue
  EXPECT_TRUE(near(at(96, r0 + 96), {140, 140, 140}));      // neither: the darkened grey
}

TEST(RenderThumbnailTest, LongerSideIsTheThumbnailSideAndSmallErrorsStayVisible) {
  const int h = 300, w = 1200;
  std::vector<uint16_t> ref(h * w, 0), pred(h * w, 0);
  pred[150 * w + 600] = 1;  // One false-positive pixel in a 4x4 box of the thumbnail.
  int slice = 0;
  absl::StatusOr<std::string> jpeg = RenderClassThumbnail(nullptr, pred.data(), ref.data(), 1, h, w, 1, nullptr, &slice);
  ASSERT_TRUE(jpeg.ok());
  RgbImage img;
  ASSERT_TRUE(DecodeImage(*jpeg, "thumbnail", &img).ok());
  EXPECT_EQ(img.width, 2 * kThumbnailSide + 4);
  EXPECT_EQ(img.height, kThumbnailSide / 4);
  int red = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = kThumbnailSide + 4; x < img.width; ++x) {
      const uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
      red += p[0] > 150 && p[1] < 90 && p[2] < 90;
    }
  }
  EXPECT_GE(red, 1);
}

TEST(RenderThumbnailTest, VolumesShowTheBusiestSlice) {
  const int d = 4, h = 8, w = 8;
  std::vector<uint16_t> ref(d * h * w, 0), pred(d * h * w, 0);
  for (int i = 0; i < 10; ++i) ref[2 * h * w + i] = 1;
  for (int i = 0; i < 3; ++i) pred[1 * h * w + i] = 1;
  int slice = -1;
  ASSERT_TRUE(RenderClassThumbnail(nullptr, pred.data(), ref.data(), d, h, w, 1, nullptr, &slice).ok());
  EXPECT_EQ(slice, 2);
}

// Offered in any order, the rows that entered when offered include the final worst of every class.
TEST(RunningWorstTest, EveryFinalWorstRowEnteredWhateverTheOrder) {
  std::mt19937 rng(7);
  std::vector<std::pair<double, int64_t>> rows;
  for (int64_t i = 0; i < 200; ++i) rows.emplace_back(std::uniform_int_distribution<int>(0, 20)(rng) / 20.0, i);
  rows.emplace_back(std::numeric_limits<double>::quiet_NaN(), 500);
  std::vector<std::pair<double, int64_t>> sorted(rows.begin(), rows.end() - 1);
  std::sort(sorted.begin(), sorted.end());
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(rows.begin(), rows.end(), rng);
    RunningWorst worst(5);
    std::set<int64_t> entered;
    for (const auto& [score, index] : rows) {
      if (worst.Offer(1, score, index)) entered.insert(index);
    }
    for (int k = 0; k < 5; ++k) EXPECT_EQ(entered.count(sorted[k].second), 1u) << "trial " << trial;
    EXPECT_EQ(entered.count(500), 0u);  // NaN never enters.
  }
  RunningWorst none(0);
  EXPECT_FALSE(none.Offer(1, 0.0, 1));
}

TEST(ShardThumbnailsTest, ClassesByDiceAndBackgroundOnlyWhenForeground) {
  v1::ImageResult r;
  r.set_index(3);
  for (int c = 0; c < 3; ++c) {
    v1::ClassResult* cr = r.add_classes();
    cr->set_tp(c == 2 ? 0 : 5);
    cr->set_fp(1);
    cr->set_tn(10);
  }
  ShardThumbnails shard(2, EmptyScore::kNaN, false);
  EXPECT_EQ(shard.Enter(r), (std::vector<int>{1, 2}));
  ShardThumbnails all(2, EmptyScore::kNaN, true);
  EXPECT_EQ(all.Enter(r), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(shard.Attach(&r, 1, 0, "jpeg"));
  ASSERT_EQ(r.thumbnails_size(), 1);
  EXPECT_EQ(r.thumbnails(0).class_index(), 1);
  EXPECT_FALSE(shard.Attach(&r, 2, 0, std::string(kMaxShardThumbnailBytes, 'x')));  // Past the budget.
  r.set_error("failed");
  EXPECT_TRUE(shard.Enter(r).empty());
}

TEST(PredictionFileNameTest, PlainIdsOrTheRowIndex) {
  EXPECT_EQ(PredictionFileName("case_001", 4), "case_001.png");
  EXPECT_EQ(PredictionFileName("a/b", 4), "row4.png");
  EXPECT_EQ(PredictionFileName("..", 4), "row4.png");
  EXPECT_EQ(PredictionFileName("", 9), "row9.png");
  EXPECT_EQ(PredictionFileName("tab\tid", 2), "row2.png");
}

}  // namespace
}  // namespace tally
