// Panoptic quality on hand-worked maps: void pixels, a crowd region, a match at IoU exactly 0.5
// (not a match), a predicted segment mostly on void (a false positive at exactly one half, ignored
// above it), stuff and things.
#include "metrics/panoptic.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace tally {
namespace {

// Reference (id: category, area):  1: thing 1, 6 px;  2: thing 1, 4 px;  3: stuff 3, 8 px;
// 4: thing 2, crowd, 4 px;  0: void (2 px).
const std::vector<uint32_t> kReference = {1, 1, 1, 2, 2, 0,   //
                                          1, 1, 1, 2, 2, 0,   //
                                          3, 3, 3, 3, 4, 4,   //
                                          3, 3, 3, 3, 4, 4};  //
// Prediction: 7 and 8 of category 1, 9 of category 3, 5 of category 2; one void pixel.
const std::vector<uint32_t> kPrediction = {7, 7, 7, 7, 8, 8,   //
                                           7, 7, 7, 0, 8, 8,   //
                                           9, 9, 9, 9, 9, 5,   //
                                           9, 9, 9, 9, 5, 5};  //
const std::vector<PanopticCategory> kCategories = {{1, true}, {2, true}, {3, false}};

std::vector<PanopticSegment> ReferenceSegments() {
  return {{1, 1, false, 6}, {2, 1, false, 4}, {3, 3, false, 8}, {4, 2, true, 4}};
}
std::vector<PanopticSegment> PredictedSegments() { return {{7, 1}, {8, 1}, {9, 3}, {5, 2}}; }

TEST(PanopticTest, HandWorkedImage) {
  absl::StatusOr<PanopticImageStats> s = EvaluatePanopticImage(
      kReference.data(), kPrediction.data(), kReference.size(), ReferenceSegments(), PredictedSegments(), kCategories);
  ASSERT_TRUE(s.ok()) << s.status();
  // (1, 7): |G n P| = 6, |P| = 7, area(G) = 6: IoU 6 / 7. (2, 8): 2 / (4 + 4 - 2 - 2 on void) = 0.5,
  // not > 0.5. (3, 9): 8 / (9 + 8 - 8) = 8 / 9. Crowd 4 is never matched.
  ASSERT_EQ(s->matches.size(), 2u);
  EXPECT_EQ(s->matches[0], (std::pair<int64_t, double>{1, 6.0 / 7.0}));
  EXPECT_EQ(s->matches[1], (std::pair<int64_t, double>{3, 8.0 / 9.0}));
  // FN: reference 2. FP: prediction 8 (half on void: not more than half); prediction 5 lies wholly
  // on category 2's crowd region: ignored.
  EXPECT_EQ(s->fn, (std::map<int64_t, int64_t>{{1, 1}}));
  EXPECT_EQ(s->fp, (std::map<int64_t, int64_t>{{1, 1}}));

  const PanopticSummary sum = SummarizePanoptic({&*s}, kCategories);
  const double pq1 = (6.0 / 7.0) / 2.0, pq3 = 8.0 / 9.0;  // TP + FP/2 + FN/2 = 2 and 1.
  EXPECT_EQ(sum.all.n, 2);  // Category 2 has no TP, FP or FN: not counted.
  EXPECT_EQ(sum.all.pq, (pq1 + pq3) / 2);
  EXPECT_EQ(sum.all.sq, (6.0 / 7.0 + 8.0 / 9.0) / 2);
  EXPECT_EQ(sum.all.rq, 0.75);
  EXPECT_EQ(sum.things.n, 1);
  EXPECT_EQ(sum.things.pq, pq1);
  EXPECT_EQ(sum.things.rq, 0.5);
  EXPECT_EQ(sum.stuff.pq, pq3);
  EXPECT_EQ(sum.stuff.sq, pq3);
  EXPECT_EQ(sum.stuff.rq, 1.0);
  ASSERT_EQ(sum.per_category.size(), 3u);
  EXPECT_EQ(sum.per_category[1].pq, 0.0);
  EXPECT_EQ(sum.per_category[0].tp, 1);
  EXPECT_EQ(sum.per_category[0].fp, 1);
  EXPECT_EQ(sum.per_category[0].fn, 1);
}

TEST(PanopticTest, MoreThanHalfOnVoidIsIgnoredAndSumsRunInImageOrder) {
  // A predicted segment of 3 pixels, 2 on void: ignored (2/3 > 1/2). No reference: nothing counted.
  const std::vector<uint32_t> ref = {0, 0, 5, 5}, pred = {6, 6, 6, 0};
  absl::StatusOr<PanopticImageStats> s =
      EvaluatePanopticImage(ref.data(), pred.data(), 4, {{5, 1, false, 2}}, {{6, 1}}, kCategories);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->fp.empty());
  // Reference 5: IoU with 6 = 1 / (3 + 2 - 1 - 2 on void) = 0.5, not a match: a false negative.
  EXPECT_EQ(s->fn, (std::map<int64_t, int64_t>{{1, 1}}));
  // Two images' matches of one category add in image order.
  PanopticImageStats a, b;
  a.matches = {{1, 0.1}};
  b.matches = {{1, 0.2}, {1, 0.3}};
  const PanopticSummary sum = SummarizePanoptic({&a, &b}, kCategories);
  EXPECT_EQ(sum.per_category[0].iou_sum, (0.1 + 0.2) + 0.3);
  EXPECT_TRUE(std::isnan(SummarizePanoptic({}, kCategories).all.pq));  // No category counted.
}

TEST(PanopticTest, InconsistentPredictionsAreNamed) {
  std::vector<PanopticSegment> missing = PredictedSegments();
  missing.pop_back();  // 5 is in the map, not in segments_info.
  EXPECT_NE(EvaluatePanopticImage(kReference.data(), kPrediction.data(), 24, ReferenceSegments(), missing, kCategories)
                .status()
                .message()
                .find("predicted segment 5 is in the map but not in segments_info"),
            std::string::npos);
  std::vector<PanopticSegment> extra = PredictedSegments();
  extra.push_back({12, 1});
  EXPECT_NE(EvaluatePanopticImage(kReference.data(), kPrediction.data(), 24, ReferenceSegments(), extra, kCategories)
                .status()
                .message()
                .find("predicted segment 12 is in segments_info but not in the map"),
            std::string::npos);
  std::vector<PanopticSegment> unknown = PredictedSegments();
  unknown[0].category_id = 99;
  EXPECT_NE(EvaluatePanopticImage(kReference.data(), kPrediction.data(), 24, ReferenceSegments(), unknown, kCategories)
                .status()
                .message()
                .find("predicted segment 7 has category 99, not in the categories"),
            std::string::npos);
}

}  // namespace
}  // namespace tally
