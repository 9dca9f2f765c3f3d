// COCO jobs' per-row pieces (common/coco/coco_instances.h, coco_masks.h, coco_json.h's panoptic reader)
// on hand-worked cases: label maps painted in the documented order, a row's records at IoU 0.5 with
// a crowd region and a category without references, the instance F1, panoptic files' errors.
#include "common/coco/coco_instances.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/coco/coco_json.h"
#include "common/formats/thumbnail.h"
#include "proto/tally.pb.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

// A rectangle [y0, y1) x [x0, x1) of an h x w image as an instance.
CocoInstance Box(int64_t id, int64_t category, double score, int h, int w, int y0, int y1, int x0, int x1,
                 bool crowd = false) {
  std::vector<uint8_t> m(static_cast<size_t>(h) * w, 0);
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) m[static_cast<size_t>(y) * w + x] = 1;
  }
  CocoInstance inst;
  inst.id = id;
  inst.category_id = category;
  inst.score = score;
  inst.crowd = crowd;
  inst.mask = RleFromMask(m.data(), h, w);
  inst.area = static_cast<double>(RleArea(inst.mask));
  return inst;
}

TEST(PaintCocoLabelsTest, DetectionsByAscendingScoreAboveHalfReferencesInOrder) {
  const int h = 3, w = 4;
  // Three detections over pixel (1, 1): category 1 at 0.6, 2 at 0.9, 3 at 0.4 (below 0.5: not painted).
  const std::vector<CocoInstance> dets = {Box(1, 1, 0.6, h, w, 0, 2, 0, 2), Box(2, 2, 0.9, h, w, 1, 3, 1, 3),
                                          Box(3, 3, 0.4, h, w, 0, 3, 0, 4)};
  std::vector<uint16_t> labels(h * w, 99);
  PaintCocoLabels(dets, true, h, w, labels.data());
  const std::vector<uint16_t> want = {1, 1, 0, 0,
                                      1, 2, 2, 0,
                                      0, 2, 2, 0};
  EXPECT_EQ(labels, want);
  // References: the file's order, the later on top, whatever their scores.
  std::vector<uint16_t> refs(h * w, 99);
  PaintCocoLabels({dets[1], dets[0]}, false, h, w, refs.data());
  EXPECT_EQ(refs[1 * w + 1], 1);
  // Column by column: the same map, transposed.
  std::vector<uint16_t> columns(h * w, 99);
  PaintCocoLabels(dets, true, h, w, columns.data(), true);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) EXPECT_EQ(columns[x * h + y], labels[y * w + x]) << y << "," << x;
  }
}

// Column runs of every length from 1 to 40 (the fill's short runs, whole blocks of 8 and partial
// last blocks) and runs ending at the image's last pixel, against the map painted pixel by pixel.
TEST(PaintCocoLabelsTest, ColumnRunsOfEveryLengthPaintTheirPixelsOnly) {
  const int h = 41, w = 43;
  std::vector<CocoInstance> dets;
  std::vector<uint16_t> want(static_cast<size_t>(h) * w, 0);  // Column-major.
  for (int k = 0; k < 6; ++k) {
    std::vector<uint8_t> m(static_cast<size_t>(h) * w, 0);
    for (int x = 0; x < w; ++x) {
      const int len = 1 + (x + 7 * k) % 40, y0 = (k % 2 == 0) ? (x * 3 + k) % (h - len + 1) : h - len;
      for (int y = y0; y < y0 + len; ++y) m[static_cast<size_t>(y) * w + x] = 1;
    }
    CocoInstance inst;
    inst.id = k + 1;
    inst.category_id = 10 + k;
    inst.score = 0.5 + 0.05 * k;  // Ascending: painted in this order.
    inst.mask = RleFromMask(m.data(), h, w);
    dets.push_back(inst);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        if (m[static_cast<size_t>(y) * w + x]) want[static_cast<size_t>(x) * h + y] = static_cast<uint16_t>(10 + k);
      }
    }
  }
  std::vector<uint16_t> got(static_cast<size_t>(h) * w, 0);
  PaintCocoLabels(dets, true, h, w, got.data(), /*column_major=*/true, /*zeroed=*/true);
  EXPECT_EQ(got, want);
}

TEST(EvaluateCocoInstancesTest, CountsAtHalfWithCrowdAndAnotherCategory) {
  const int h = 8, w = 8;
  CocoImageInstances image;
  image.image_id = 5;
  image.height = h;
  image.width = w;
  image.references = {Box(10, 1, 0, h, w, 0, 2, 0, 2), Box(11, 1, 0, h, w, 4, 8, 4, 8, /*crowd=*/true)};
  image.detections = {Box(1, 1, 0.9, h, w, 0, 2, 0, 2),   // IoU 1 with reference 10: true positive.
                      Box(2, 1, 0.8, h, w, 5, 7, 5, 7),   // Inside the crowd region: ignored.
                      Box(3, 1, 0.7, h, w, 0, 2, 5, 7),   // Nothing there: false positive.
                      Box(4, 2, 0.6, h, w, 0, 2, 0, 2)};  // Category 2 has no reference: false positive.
  google::protobuf::RepeatedPtrField<v1::CocoImageRecord> records;
  std::vector<uint8_t> outcomes;
  EvaluateCocoInstances(image, &records, &outcomes);
  ASSERT_EQ(records.size(), 2);
  const v1::CocoImageRecord& c1 = records.Get(0);
  EXPECT_EQ(c1.category_id(), 1);
  EXPECT_EQ(c1.references(), 2);
  EXPECT_EQ(c1.detections(), 3);
  EXPECT_EQ(c1.tp50(), 1);
  EXPECT_EQ(c1.fp50(), 1);
  EXPECT_EQ(c1.fn50(), 0);
  ASSERT_EQ(c1.positives_size(), 4);
  EXPECT_EQ(c1.positives(0), 1);  // The crowd region does not count.
  EXPECT_EQ(c1.scores_size(), 3);
  EXPECT_EQ(c1.outcomes().size(), 4u * 10u * 3u);
  const v1::CocoImageRecord& c2 = records.Get(1);
  EXPECT_EQ(c2.category_id(), 2);
  EXPECT_EQ(c2.tp50(), 0);
  EXPECT_EQ(c2.fp50(), 1);
  EXPECT_EQ(c2.fn50(), 0);
  // The picture: the matched pair green; the false detections red (category 2's on top of the
  // match); the crowd region and the ignored detection uncoloured.
  EXPECT_EQ(outcomes[0 * w + 0], kOutcomeFp);
  EXPECT_EQ(outcomes[0 * w + 5], kOutcomeFp);
  EXPECT_EQ(outcomes[6 * w + 6], kOutcomeNone);
  v1::ImageResult r;
  *r.mutable_instances() = records;
  EXPECT_DOUBLE_EQ(RowInstanceF1(r), 2.0 / (2.0 + 2.0));  // 2 TP / (2 TP + FP + FN) = 2 / 4.
  EXPECT_TRUE(std::isnan(RowInstanceF1(v1::ImageResult())));
}

TEST(EvaluateCocoInstancesTest, AMissedReferenceIsBlue) {
  const int h = 4, w = 4;
  CocoImageInstances image;
  image.height = h;
  image.width = w;
  image.references = {Box(1, 3, 0, h, w, 0, 2, 0, 2)};
  google::protobuf::RepeatedPtrField<v1::CocoImageRecord> records;
  std::vector<uint8_t> outcomes;
  EvaluateCocoInstances(image, &records, &outcomes);
  ASSERT_EQ(records.size(), 1);
  EXPECT_EQ(records.Get(0).fn50(), 1);
  EXPECT_EQ(outcomes[0], kOutcomeFn);
  EXPECT_EQ(outcomes[3 * w + 3], kOutcomeNone);
}

TEST(ParseCocoImagesTest, ScalarFieldsAreKeptWithinTheirBounds) {
  std::string many;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&many, ", \"f", i, "\": ", i);
  const std::string json = absl::StrCat(
      "{\"images\": [{\"id\": 1, \"file_name\": \"a.png\", \"height\": 2, \"width\": 3, \"site\": \"B\", ",
      "\"dose\": 1.50 , \"ok\": true, \"none\": null, \"list\": [1], \"obj\": {\"a\": 1}, \"bad\": \"x\\u0001\", ",
      "\"long\": \"", std::string(300, 'y'), "\"}, {\"id\": 2, \"file_name\": \"b.png\"", many, "}], ",
      "\"categories\": [{\"id\": 1, \"name\": \"c\"}], \"annotations\": []}");
  absl::StatusOr<CocoDataset> d = ParseCocoDataset(json, "fields.json");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->images.size(), 2u);
  // Strings, numbers as written and booleans; not null, lists, objects, control characters or values
  // past 256 bytes.
  using Fields = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(d->images[0].fields, (Fields{{"site", "B"}, {"dose", "1.50"}, {"ok", "true"}}));
  EXPECT_EQ(d->images[1].fields.size(), kMaxCocoImageFields);
  EXPECT_EQ(d->images[1].fields.back(), (std::pair<std::string, std::string>{"f15", "15"}));
}

TEST(ParseCocoPanopticTest, SegmentsAndTheirErrors) {
  const std::string json = R"({"categories": [{"id": 1, "name": "a", "isthing": 1}, {"id": 10, "name": "sky", "isthing": 0}],
    "annotations": [
      {"image_id": 3, "file_name": "3.png", "segments_info": [{"id": 7, "category_id": 1, "area": 12, "iscrowd": 1}]},
      {"image_id": 4, "file_name": "4.png", "segments_info": [{"id": 0, "category_id": 1, "area": 2}]},
      {"image_id": 5, "file_name": "5.png", "segments_info": [{"id": 9, "area": 2}]}]})";
  absl::StatusOr<CocoDataset> d = ParseCocoPanoptic(json, "p.json");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->panoptic.size(), 3u);
  EXPECT_EQ(d->categories[1].isthing, false);
  const CocoPanopticAnnotation& a = d->panoptic[0];
  EXPECT_EQ(a.image_id, 3);
  EXPECT_EQ(a.file_name, "3.png");
  ASSERT_EQ(a.segments.size(), 1u);
  EXPECT_EQ(a.segments[0].id, 7);
  EXPECT_EQ(a.segments[0].area, 12);
  EXPECT_TRUE(a.segments[0].iscrowd);
  EXPECT_TRUE(a.error.empty());
  EXPECT_EQ(d->panoptic[1].error, "segment 0: no segment id in 1..2^24-1");
  EXPECT_EQ(d->panoptic[2].error, "segment 0: no category_id");
  // An annotation without an image id cannot fail a row: the file is refused, naming it.
  absl::StatusOr<CocoDataset> bad = ParseCocoPanoptic(R"({"annotations": [{"file_name": "x.png"}]})", "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("annotations[0]"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Every field of two detections, bit for bit (scores order the matching).
void ExpectSameDetection(const CocoAnnotation& a, const CocoAnnotation& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.image_id, b.image_id);
  EXPECT_EQ(a.category_id, b.category_id);
  EXPECT_EQ(a.score, b.score);
  EXPECT_EQ(a.area, b.area);
  EXPECT_EQ(a.has_area, b.has_area);
  EXPECT_EQ(a.iscrowd, b.iscrowd);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.segmentation.kind, b.segmentation.kind);
  EXPECT_EQ(a.segmentation.polygons, b.segmentation.polygons);
  EXPECT_EQ(a.segmentation.counts, b.segmentation.counts);
  EXPECT_EQ(a.segmentation.counts_string, b.segmentation.counts_string);
  EXPECT_EQ(a.segmentation.height, b.segmentation.height);
  EXPECT_EQ(a.segmentation.width, b.segmentation.width);
}

// tallyd's parse of a results file on several threads: the parts hold consecutive detections, in
// the file's order, each the single-threaded parser's to the bit; appended one by one they encode as
// the whole list does; a malformed detection is named as the single-threaded parser names it.
TEST(CocoResultsInPartsTest, PartsAreTheFileInOrderAndEncodeAsTheList) {
  std::string json = "[";
  for (int i = 0; i < 1000; ++i) {
    if (i > 0) json += ",\n";
    json += absl::StrCat("{\"image_id\": ", i % 7, ", \"category_id\": ", 1 + i % 3, ", \"score\": 0.", 1000 + i,
                         i % 2 == 0 ? ", \"segmentation\": {\"size\": [4, 5], \"counts\": \"02N0\\\\0\"}"
                                    : ", \"segmentation\": [[0, 0, 3, 0, 3, 2]]",
                         "}");
  }
  json += "]";
  auto whole = ParseCocoResults(json, "r.json");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 1000u);
  std::vector<std::vector<CocoAnnotation>> parts(4);
  auto used = ParseCocoResultsInParts(
      json, "r.json", 4, [&](int k, CocoAnnotation&& a) { parts[k].push_back(std::move(a)); }, 100);
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(*used, 4);
  std::vector<const CocoAnnotation*> flat;
  std::string appended;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(parts[k].size(), 250u);
    for (const CocoAnnotation& a : parts[k]) {
      flat.push_back(&a);
      AppendCocoDetection(a, &appended);
    }
  }
  ASSERT_EQ(flat.size(), whole->size());
  std::vector<const CocoAnnotation*> expected;
  for (size_t i = 0; i < flat.size(); ++i) {
    expected.push_back(&(*whole)[i]);
    EXPECT_EQ(flat[i]->id, static_cast<int64_t>(i) + 1);
    ExpectSameDetection(*flat[i], (*whole)[i]);
  }
  EXPECT_EQ(appended, EncodeCocoDetections(expected));
  // A detection near the 700th without an image id: named as ParseCocoResults names it.
  const size_t at = json.find("{\"image_id\": 0, \"category_id\": ", json.size() * 7 / 10);
  ASSERT_NE(at, std::string::npos);
  std::string bad = json;
  bad.replace(at, std::string("{\"image_id\": 0, \"category_id\": ").size(), "{\"imageid\": 0, \"category_id\": ");
  auto single = ParseCocoResults(bad, "r.json");
  auto split = ParseCocoResultsInParts(bad, "r.json", 4, [](int, CocoAnnotation&&) {}, 100);
  ASSERT_FALSE(single.ok());
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(), single.status().message());
  EXPECT_NE(split.status().message().find("r.json"), absl::string_view::npos);
}

// What a row carries from tallyd to a worker: every field of every segmentation kind, in order.
TEST(CocoDetectionsTest, EveryKindOfSegmentationRoundTrips) {
  std::vector<CocoAnnotation> in(4);
  in[0].id = 7;
  in[0].image_id = 3;
  in[0].category_id = 2;
  in[0].score = 0.123456789012345;
  in[0].segmentation.kind = CocoSegmentation::Kind::kPolygons;
  in[0].segmentation.polygons = {{1.5, 2, 3, 4.25, 5, 6}, {10, 10, 20, 10, 15, 20, 11, 12}};
  in[1].id = 8;
  in[1].score = 1;
  in[1].segmentation.kind = CocoSegmentation::Kind::kCounts;
  in[1].segmentation.counts = {0, 5, 3, 100};
  in[1].segmentation.height = 9;
  in[1].segmentation.width = 12;
  in[2].id = 9;
  in[2].area = 41.5;
  in[2].has_area = true;
  in[2].iscrowd = true;
  in[2].segmentation.kind = CocoSegmentation::Kind::kString;
  in[2].segmentation.counts_string = std::string("Ph0\0;1", 6);
  in[2].segmentation.height = 640;
  in[2].segmentation.width = 480;
  in[3].id = 10;
  in[3].error = "result 10: no segmentation";
  std::vector<const CocoAnnotation*> pointers;
  for (const CocoAnnotation& a : in) pointers.push_back(&a);
  auto out = DecodeCocoDetections(EncodeCocoDetections(pointers));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ExpectSameDetection(in[i], (*out)[i]);
  }
  EXPECT_TRUE(DecodeCocoDetections("").ok());
  EXPECT_FALSE(DecodeCocoDetections("\xff\xff\xff").ok());
}

// AppendCocoDetection writes the wire format itself: its bytes are the generated serializer's for
// the same fields (defaults left out, -0.0 kept, negative numbers as ten-byte varints, empty
// polygons, packed lists, long strings).
TEST(CocoDetectionsTest, AppendedBytesAreTheGeneratedSerializers) {
  std::vector<CocoAnnotation> in(6);
  in[0].id = 1;
  in[0].image_id = 397133;
  in[0].category_id = 90;
  in[0].score = 0.987654321;
  in[0].segmentation.kind = CocoSegmentation::Kind::kString;
  in[0].segmentation.counts_string = std::string(300, 'a') + std::string("\\0\x7f", 3);
  in[0].segmentation.height = 427;
  in[0].segmentation.width = 640;
  in[1].id = -5;
  in[1].image_id = -1;
  in[1].category_id = std::numeric_limits<int64_t>::min();
  in[1].score = -0.0;
  in[1].area = -0.0;
  in[1].has_area = true;
  in[2].id = std::numeric_limits<int64_t>::max();
  in[2].score = std::numeric_limits<double>::quiet_NaN();
  in[2].area = 1e300;
  in[2].iscrowd = true;
  in[2].segmentation.kind = CocoSegmentation::Kind::kPolygons;
  in[2].segmentation.polygons = {{}, {1.5, -2, 3e-300, 4.25, 5, 6}, {}};
  in[3].segmentation.kind = CocoSegmentation::Kind::kCounts;
  in[3].segmentation.counts = {0, 127, 128, 16383, 16384, -1, int64_t{1} << 40};
  in[3].segmentation.height = -2;
  in[3].segmentation.width = 1 << 20;
  in[4].error = std::string(200, 'e');
  in[5].segmentation.kind = CocoSegmentation::Kind::kPolygons;
  in[5].segmentation.polygons = {{}};
  for (const CocoAnnotation& a : in) {
    v1::CocoDetections list;
    v1::CocoDetection* d = list.add_detections();
    d->set_id(a.id);
    d->set_image_id(a.image_id);
    d->set_category_id(a.category_id);
    d->set_score(a.score);
    d->set_area(a.area);
    d->set_has_area(a.has_area);
    d->set_iscrowd(a.iscrowd);
    d->set_error(a.error);
    d->set_segmentation_kind(static_cast<int32_t>(a.segmentation.kind));
    for (const std::vector<double>& poly : a.segmentation.polygons) {
      d->add_polygon_sizes(static_cast<int64_t>(poly.size()));
      for (double v : poly) d->add_polygon_points(v);
    }
    for (int64_t c : a.segmentation.counts) d->add_counts(c);
    d->set_counts_string(a.segmentation.counts_string);
    d->set_height(a.segmentation.height);
    d->set_width(a.segmentation.width);
    std::string appended = "prefix";
    AppendCocoDetection(a, &appended);
    EXPECT_EQ(appended, "prefix" + list.SerializeAsString()) << "detection " << a.id;
  }
}

}  // namespace
}  // namespace tally
