// A follow's curve files (server/follow/follow_curve.h): the CSV's cells, the JSON's values, and
// an HTML page that draws each metric with its interval band and escapes what the trainer named.
#include "server/follow/follow_curve.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

FollowCurve Curve() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  FollowCurve c;
  c.follow = "f1";
  c.folder = "/runs/a";
  c.metric = "dice_mean[1]";
  CurvePoint a;
  a.step = 100;
  a.checkpoint = "ckpt-100.pt";
  a.job = "j1";
  a.rows = 50;
  a.rows_total = 50;
  a.decision = "best";
  a.best_step = 100;
  a.race_lo = nan;
  a.race_hi = nan;
  a.metrics = {{"dice_mean[1]", 0.5, 0.4, 0.6}, {"iou, mean", 0.25, 0.2, 0.3}};
  CurvePoint b = a;
  b.step = 200;
  b.checkpoint = "<script>x</script>.pt";
  b.job = "j2";
  b.rows = 12;
  b.decision = "worse";
  b.race_rows = 12;
  b.race_lo = -0.3;
  b.race_hi = -0.05;
  b.metrics = {{"dice_mean[1]", 0.3, 0.1, 0.5}};
  c.points = {a, b};
  return c;
}

TEST(FollowCurveTest, CsvHasEveryMetricsMeanAndIntervalPerStep) {
  const std::vector<std::string> lines = absl::StrSplit(CurveCsv(Curve()), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "step,checkpoint,job,rows,rows_total,decision,reason,best_step,race_rows,race_lo,race_hi,dice_mean[1],"
            "dice_mean[1]_lo,dice_mean[1]_hi,\"iou, mean\",\"iou, mean_lo\",\"iou, mean_hi\"");
  EXPECT_EQ(lines[1], "100,ckpt-100.pt,j1,50,50,best,,100,0,nan,nan,0.5,0.4,0.6,0.25,0.2,0.3");
  // The second point has no iou: empty cells.
  EXPECT_EQ(lines[2], "200,<script>x</script>.pt,j2,12,50,worse,,100,12,-0.3,-0.05,0.3,0.1,0.5,,,");
}

TEST(FollowCurveTest, JsonAndHtmlSayTheSameAndEscapeNames) {
  const std::string json = CurveJson(Curve());
  EXPECT_NE(json.find("\"lo\": null"), std::string::npos) << json;  // NaN: no race.
  EXPECT_NE(json.find("\"decision\": \"worse\""), std::string::npos);
  const std::string html = CurveHtml(Curve());
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;x&lt;/script&gt;.pt"), std::string::npos);
  // One figure per metric; the first's band has both points' upper and lower ends.
  size_t figures = 0;
  for (size_t at = html.find("<figure>"); at != std::string::npos; at = html.find("<figure>", at + 1)) ++figures;
  EXPECT_EQ(figures, 2u);
  const size_t polygon = html.find("<polygon points=\"");
  ASSERT_NE(polygon, std::string::npos);
  const size_t from = polygon + 17;
  const std::string points = html.substr(from, html.find('"', from) - from);
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(points, ' ', absl::SkipEmpty())).size(), 4u) << points;
  // Nothing fetched from elsewhere: the only URLs are the SVG namespace's.
  size_t urls = 0, namespaces = 0;
  for (size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1)) ++urls;
  for (size_t at = html.find("xmlns=\"http://www.w3.org/2000/svg\""); at != std::string::npos;
       at = html.find("xmlns=\"http://www.w3.org/2000/svg\"", at + 1)) {
    ++namespaces;
  }
  EXPECT_EQ(urls, namespaces);
}

}  // namespace
}  // namespace tally
