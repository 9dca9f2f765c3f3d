// COCOeval's numbers: a hand-made set whose 12 numbers pycocotools 2.0 computed (built from its
// source for these literals), hand-worked matching rules, and numpy's summation order.
#include "metrics/coco_eval.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/coco_rle.h"

namespace tally {
namespace {

constexpr int kSize = 40;

Rle Rect(int x0, int x1, int y0, int y1) {
  std::vector<uint8_t> m(kSize * kSize, 0);
  for (int y = y0; y <= y1; ++y) {
    for (int x = x0; x <= x1; ++x) m[y * kSize + x] = 1;
  }
  return RleFromMask(m.data(), kSize, kSize);
}

struct Instance {
  int64_t id, image, category;
  Rle mask;
  double area_or_score;
  bool crowd = false;
};

// Evaluates every (image, category) of the references and detections given.
CocoAccumulated Evaluate(const std::vector<Instance>& refs, const std::vector<Instance>& dets,
                         std::vector<std::unique_ptr<CocoImageEval>>* keep) {
  std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<const Instance*>, std::vector<const Instance*>>> groups;
  for (const Instance& r : refs) groups[{r.image, r.category}].first.push_back(&r);
  for (const Instance& d : dets) groups[{d.image, d.category}].second.push_back(&d);
  std::vector<const CocoImageEval*> evals;
  for (const auto& [key, g] : groups) {
    std::vector<CocoReference> rs;
    for (const Instance* r : g.first) rs.push_back({r->id, r->area_or_score, r->crowd});
    std::vector<CocoDetection> ds;
    for (const Instance* d : g.second) ds.push_back({d->id, d->area_or_score, static_cast<double>(RleArea(d->mask))});
    keep->push_back(std::make_unique<CocoImageEval>(EvaluateCocoImage(
        key.first, key.second, rs, ds,
        [&](size_t d, size_t r) { return RleIou(g.second[d]->mask, g.first[r]->mask, g.first[r]->crowd); })));
    evals.push_back(keep->back().get());
  }
  return AccumulateCoco(evals, {1, 2});
}

TEST(CocoEvalTest, AHandMadeSetGivesPycocotoolsNumbers) {
  // Image 1, category 1: two references and a crowd region; a tie in scores, a duplicate, a
  // detection inside the crowd region (ignored), a small false positive. Image 2: category 2's
  // reference with an `area` field (1500, medium) unlike its 100 pixels, and a category-1
  // detection with no reference. Image 4: a reference with no detection.
  const std::vector<Instance> refs = {
      {1, 1, 1, Rect(0, 9, 0, 9), 100},        {2, 1, 1, Rect(20, 39, 20, 39), 400},
      {3, 1, 1, Rect(0, 39, 30, 39), 400, true}, {4, 2, 2, Rect(5, 14, 5, 14), 1500},
      {5, 4, 1, Rect(10, 19, 10, 19), 100}};
  const std::vector<Instance> dets = {
      {1, 1, 1, Rect(0, 9, 0, 8), 0.9},    {2, 1, 1, Rect(20, 39, 22, 39), 0.9}, {3, 1, 1, Rect(0, 9, 0, 9), 0.5},
      {4, 1, 1, Rect(5, 15, 32, 38), 0.7}, {5, 1, 1, Rect(30, 35, 0, 5), 0.6},   {6, 2, 2, Rect(5, 14, 5, 13), 0.8},
      {7, 2, 1, Rect(0, 4, 0, 4), 0.95}};
  std::vector<std::unique_ptr<CocoImageEval>> keep;
  const CocoAccumulated acc = Evaluate(refs, dets, &keep);
  const std::array<double, 12> stats = SummarizeCoco(acc);
  const std::array<double, 12> want = {0.6523762376237624, 0.721122112211221,  0.721122112211221,
                                       0.40475247524752483, 0.8999999999999999, -1.0,
                                       0.6,                0.7666666666666666, 0.7666666666666666,
                                       0.6333333333333333, 0.9,                -1.0};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(stats[i], want[i]) << kCocoStatNames[i];
  EXPECT_EQ(CocoCategoryAp(acc, 0), 0.40475247524752483);
  EXPECT_EQ(CocoCategoryAp(acc, 1), 0.8999999999999999);
}

TEST(CocoEvalTest, MatchingFollowsScoreOrderCrowdAndIgnoreRules) {
  // One reference (area 2000), detections at IoU 0.8 (score 0.9) and 0.6 (0.8): the first takes
  // it at thresholds 0.5..0.8, the second is then a false positive there, and both are false
  // positives above. A detection scoring higher but listed later goes first.
  const std::vector<CocoReference> refs = {{1, 2000, false}};
  const std::vector<CocoDetection> dets = {{1, 0.8, 2000}, {2, 0.9, 2000}};
  const double ious[2] = {0.6, 0.8};
  const CocoImageEval e = EvaluateCocoImage(7, 1, refs, dets, [&](size_t d, size_t) { return ious[d]; });
  ASSERT_EQ(e.scores, (std::vector<double>{0.9, 0.8}));
  const size_t D = 2;
  for (size_t t = 0; t < 10; ++t) {
    const bool taken = t <= 6;  // 0.8 >= thresholds 0.5 ... 0.8.
    EXPECT_EQ(e.outcome[t * D + 0], taken ? CocoOutcome::kTruePositive : CocoOutcome::kFalsePositive) << t;
    EXPECT_EQ(e.outcome[t * D + 1], CocoOutcome::kFalsePositive) << t;
  }
  EXPECT_EQ(e.positives, (std::vector<int64_t>{1, 0, 1, 0}));  // all, small, medium, large.
  // Small range: the reference is ignored there, and a detection matched to it is ignored too;
  // an unmatched detection of area 2000 is outside the range: ignored.
  EXPECT_EQ(e.outcome[(1 * 10 + 0) * D + 0], CocoOutcome::kIgnored);
  EXPECT_EQ(e.outcome[(1 * 10 + 0) * D + 1], CocoOutcome::kIgnored);

  // A crowd region absorbs any number of detections, and is looked at only after regular
  // references: a detection with IoU 0.9 on the crowd and 0.6 on a regular reference takes the
  // regular one at 0.5..0.6 and the crowd (ignored) above.
  const std::vector<CocoReference> crowd_refs = {{1, 500, true}, {2, 500, false}};
  const std::vector<CocoDetection> two = {{1, 0.9, 500}, {2, 0.5, 500}};
  const double m[2][2] = {{0.9, 0.6}, {0.95, 0.1}};
  const CocoImageEval c = EvaluateCocoImage(1, 1, crowd_refs, two, [&](size_t d, size_t g) { return m[d][g]; });
  EXPECT_EQ(c.outcome[0 * 2 + 0], CocoOutcome::kTruePositive);  // t = 0.5
  EXPECT_EQ(c.outcome[2 * 2 + 0], CocoOutcome::kTruePositive);  // t = 0.6
  EXPECT_EQ(c.outcome[3 * 2 + 0], CocoOutcome::kIgnored);       // t = 0.65: only the crowd is >= t.
  EXPECT_EQ(c.outcome[0 * 2 + 1], CocoOutcome::kIgnored);       // Second on the crowd region.
  EXPECT_EQ(c.positives[0], 1);
}

TEST(CocoEvalTest, ThresholdsAreNumpysLinspace) {
  const CocoParams& p = CocoDefaultParams();
  ASSERT_EQ(p.iou_thresholds.size(), 10u);
  EXPECT_EQ(p.iou_thresholds[8], 0.8999999999999999);  // Not 0.9: numpy's i * step + start.
  EXPECT_EQ(p.iou_thresholds[9], 0.95);
  EXPECT_EQ(p.iou_thresholds[5], 0.75);
  ASSERT_EQ(p.recall_thresholds.size(), 101u);
  EXPECT_EQ(p.recall_thresholds[7], 7 * 0.01);
  EXPECT_EQ(p.recall_thresholds[100], 1.0);
}

TEST(CocoEvalTest, NumpyMeanSumsPairwiseInBlocksOf8192) {
  // Values whose sum depends on the order: 1 followed by many tiny ones. Sequential summation
  // loses every 1e-17 against 1; numpy's pairwise blocks add the tiny ones among themselves first.
  std::vector<double> v(20000, 1e-17);
  v[0] = 1;
  double sequential = 0;
  for (double x : v) sequential += x;
  EXPECT_EQ(sequential, 1.0);
  // Block 1: 1 + (8191 tiny, summed pairwise) ; blocks 2 and 3: 8192 and 3616 tiny ones.
  const double got = NumpyMean(v) * 20000;
  EXPECT_GT(got, 1.0);
  EXPECT_NEAR(got, 1 + 19999e-17, 1e-15);
  EXPECT_EQ(NumpyMean({0.1, 0.2, 0.3}), (0.1 + 0.2 + 0.3) / 3);  // Under 8 values: in order.
}

}  // namespace
}  // namespace tally
