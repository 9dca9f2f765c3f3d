// COCO run-length masks against hand-worked strings and against masks pycocotools 2.0 (maskApi.c,
// built from its source for this test's literals) produced for the same polygons.
#include "metrics/coco_rle.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tally {
namespace {

std::vector<uint8_t> Mask(const std::vector<std::string>& rows) {
  std::vector<uint8_t> m;
  for (const std::string& r : rows) {
    for (char c : r) m.push_back(c == '1');
  }
  return m;
}

std::vector<std::string> Rows(const Rle& r) {
  std::vector<uint8_t> m(r.height * r.width);
  RleToMask(r, m.data());
  std::vector<std::string> rows(r.height);
  for (int64_t y = 0; y < r.height; ++y) {
    for (int64_t x = 0; x < r.width; ++x) rows[y].push_back(m[y * r.width + x] ? '1' : '0');
  }
  return rows;
}

TEST(CocoRleTest, EncodesColumnMajorRunsAndTheCompressedString) {
  // Columns top to bottom: 000 110 101 001 -> runs 3 0s, 2 1s, 1, 1, 1, 1, 2, 1. The string: 3 2 1,
  // then differences to the run two before: 1-2 = -1 ('O' = 48 + 31), 0, 0, 1, 0.
  const std::vector<std::string> rows = {"0110", "0100", "0011"};
  const Rle r = RleFromMask(Mask(rows).data(), 3, 4);
  EXPECT_EQ(r.counts, (std::vector<uint32_t>{3, 2, 1, 1, 1, 1, 2, 1}));
  EXPECT_EQ(RleToString(r), "321O0010");
  EXPECT_EQ(RleArea(r), 5u);
  EXPECT_EQ(RleBbox(r), (std::array<double, 4>{1, 0, 3, 3}));
  EXPECT_EQ(Rows(r), rows);
  absl::StatusOr<Rle> back = RleFromString("321O0010", 3, 4);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->counts, r.counts);
}

TEST(CocoRleTest, LongRunsAndNegativeDifferencesRoundTrip) {
  // 100 = 3 * 32 + 4: groups 4 (with the 'more' bit: 36 -> 'T') then 3 -> "T3"; 60 = 1 * 32 + 28:
  // 'l' (28 | 32 = 60), '1'; 20 has bit 0x10 set, so a 0 group follows to keep it positive: "d0".
  // The fourth run 20 against the second 60: -40 = -2 * 32 + 24: 24 | 0x20 = 56 -> 'h', then
  // -2 & 31 = 30 -> 'N'. (pycocotools writes the same "T3l1d0hN".)
  Rle r;
  r.height = 10;
  r.width = 20;
  r.counts = {100, 60, 20, 20};
  EXPECT_EQ(RleToString(r), "T3l1d0hN");
  absl::StatusOr<Rle> back = RleFromString(RleToString(r), 10, 20);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->counts, r.counts);
}

TEST(CocoRleTest, MalformedStringsAndCountsAreRefused) {
  EXPECT_NE(RleFromString("32", 3, 4).status().message().find("sum to 5, not height x width = 3 x 4 = 12"),
            std::string::npos);
  EXPECT_NE(RleFromString("3~", 3, 4).status().message().find("outside '0'..'o'"), std::string::npos);
  EXPECT_NE(RleFromString("3T", 3, 4).status().message().find("ends inside a run"), std::string::npos);
  EXPECT_NE(RleFromString("30O", 3, 4).status().message().find("out of range"), std::string::npos);  // 0 then -1.
  EXPECT_NE(RleFromCounts({3, -1, 10}, 3, 4).status().message().find("run 1 is -1"), std::string::npos);
  EXPECT_NE(RleFromCounts({3, 2}, 3, 4).status().message().find("sum to 5"), std::string::npos);
  EXPECT_TRUE(RleFromCounts({12}, 3, 4).ok());
  EXPECT_NE(RleFromPolygon({1, 1, 2, 2, 3}, 5, 5).status().message().find("odd number of coordinates (5)"),
            std::string::npos);
  EXPECT_NE(RleFromPolygon({1, 1, 2, 2}, 5, 5).status().message().find("at least 3 points, not 2"), std::string::npos);
  EXPECT_NE(RleFromPolygon({1, 1, 2, 2, 1e300, 3}, 5, 5).status().message().find("point 2"), std::string::npos);
  EXPECT_NE(RleFromPolygon({1, 1, 2, 2, 3, -11}, 5, 10).status().message().find("point 2 (3, -11) is more than"),
            std::string::npos);
  EXPECT_TRUE(RleFromPolygon({1, 1, 2, 2, 3, -10}, 5, 10).ok());  // 10 outside a 5 x 10 image: allowed.
}

// Polygons rasterised by pycocotools' frPyObjects + merge (the masks and strings it gave).
struct PolygonCase {
  const char* name;
  std::vector<std::vector<double>> polygons;
  int64_t height, width;
  std::string counts;
  std::vector<std::string> rows;
};

TEST(CocoRleTest, PolygonsRasteriseAsPycocotools) {
  const std::vector<PolygonCase> cases = {
      {"square", {{1, 1, 3, 1, 3, 3, 1, 3}}, 5, 5, "62309", {"00000", "01100", "01100", "00000", "00000"}},
      {"triangle through pixel centres", {{0.5, 0.5, 4.5, 0.5, 2.5, 4.0}}, 5, 6, "6142NN;",
       {"000000", "011100", "001000", "001000", "000000"}},
      {"partly outside the image", {{-1.3, -0.7, 3.2, -1.0, 4.9, 2.6, 0.2, 3.9}}, 4, 5, "0;1H2NN",
       {"11110", "11110", "11111", "11000"}},
      {"closed (first point repeated)", {{1, 1, 4, 1, 4, 4, 1, 4, 1, 1}}, 6, 6, "733000;",
       {"000000", "011100", "011100", "011100", "000000", "000000"}},
      {"concave", {{0, 0, 4, 0, 4, 1.5, 1.5, 1.5, 1.5, 4, 0, 4}}, 5, 5, "04100N205",
       {"11110", "11110", "11000", "11000", "00000"}},
      {"two polygons united", {{0, 0, 2, 0, 2, 2, 0, 2}, {1, 1, 3.5, 1, 3.5, 3.5, 1, 3.5}}, 4, 4, "0222OO00",
       {"1100", "1111", "0111", "0111"}},
      {"thinner than a pixel", {{0.2, 1.0, 6.8, 1.3, 6.8, 1.4}}, 3, 8, "h0", {"00000000", "00000000", "00000000"}},
  };
  for (const PolygonCase& c : cases) {
    absl::StatusOr<Rle> r = RleFromPolygons(c.polygons, c.height, c.width);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    EXPECT_EQ(Rows(*r), c.rows) << c.name;
    EXPECT_EQ(RleToString(*r), c.counts) << c.name;
  }
}

TEST(CocoRleTest, IouCountsPixelsAndCrowdRegionsTakeTheDetectionsArea) {
  const std::vector<std::string> d_rows = {"1100", "1100", "0000"}, g_rows = {"0110", "0110", "0110"};
  const Rle d = RleFromMask(Mask(d_rows).data(), 3, 4), g = RleFromMask(Mask(g_rows).data(), 3, 4);
  EXPECT_DOUBLE_EQ(RleIou(d, g, false), 2.0 / 8.0);  // |D n G| = 2, |D u G| = 4 + 6 - 2.
  EXPECT_DOUBLE_EQ(RleIou(d, g, true), 2.0 / 4.0);   // Over the detection's 4 pixels.
  const Rle empty = RleFromMask(Mask({"0000", "0000", "0000"}).data(), 3, 4);
  EXPECT_EQ(RleIou(empty, g, false), 0);
  EXPECT_EQ(RleIou(empty, g, true), 0);
  // The union of masks, as one mask.
  const Rle u = RleUnion({&d, &g}, 3, 4);
  EXPECT_EQ(Rows(u), (std::vector<std::string>{"1110", "1110", "0110"}));
  EXPECT_EQ(RleArea(u), 8u);
  EXPECT_EQ(RleBbox(empty), (std::array<double, 4>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace tally
