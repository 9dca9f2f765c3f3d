// Hostile inputs (SECURITY.md "Hostile inputs handled"), unit by unit: sizes that overflow, client-named JSON
// files that are no regular files or too large, COCO fields of the wrong type or with control
// characters, polygons whose rasterisation would cost more than a row may use, unions of many
// polygons, NIfTI files whose voxels are not finite or not where the header says, and the instance
// thumbnail counted from the masks' runs against the one painted pixel by pixel.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/checked_math.h"
#include "common/coco/coco_json.h"
#include "common/coco/coco_instances.h"
#include "common/formats/thumbnail.h"
#include "common/formats/volume.h"
#include "common/security/data_roots.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/coco_rle.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "/hostile_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(CheckedProductTest, OverflowIsRefusedNotWrapped) {
  EXPECT_EQ(CheckedProduct({4294967296, 4294967296}), -1);  // 2^64 wraps to 0 in 64-bit arithmetic.
  EXPECT_EQ(CheckedProduct({int64_t{1} << 40, int64_t{1} << 40}), -1);
  EXPECT_EQ(CheckedProduct({-1, 5}), -1);
  EXPECT_EQ(CheckedProduct({3, 5, 7}), 105);
  EXPECT_EQ(CheckedProduct({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_FALSE(ProductWithin({4294967296, 4294967296}, int64_t{1} << 28));
  EXPECT_TRUE(ProductWithin({16384, 16384}, int64_t{1} << 28));
}

TEST(CocoRleHostileTest, MaskSizesThatOverflowAreRefused) {
  for (int64_t side : {int64_t{4294967296}, int64_t{1} << 40}) {
    EXPECT_FALSE(RleFromCounts({0}, side, side).ok()) << side;
    EXPECT_FALSE(RleFromPolygon({0, 0, 10, 0, 10, 10}, side, side).ok()) << side;
  }
}

TEST(CocoRleHostileTest, PolygonCostIsKnownBeforeTheWalkAndRefusedPastTheBudget) {
  // A square 10 pixels a side: 4 edges of 50 steps on the 5x grid, 51 points each.
  const std::vector<double> square = {0, 0, 10, 0, 10, 10, 0, 10};
  EXPECT_EQ(PolygonWalkBytes(square, 20, 20), 4 * 51 * kPolygonBytesPerPoint);
  EXPECT_TRUE(RleFromPolygons({square}, 20, 20, 4 * 51 * kPolygonBytesPerPoint).ok());
  // A triangle 268 435 455 pixels long on a 1 x 268 435 456 image: about 2.7 billion points.
  const std::vector<double> bomb = {0, 0, 268435455, 0, 0, 0.9};
  EXPECT_GT(PolygonWalkBytes(bomb, 1, 268435456), int64_t{1} << 35);
  absl::StatusOr<Rle> r = RleFromPolygons({bomb}, 1, 268435456, int64_t{1} << 30);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("polygon 0: rasterising it walks"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("boundary points"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("1.0 GiB"));
}

// A mask's pixels (row-major), independently of the runs.
std::vector<uint8_t> Pixels(const Rle& r) {
  std::vector<uint8_t> m(static_cast<size_t>(r.height * r.width));
  RleToMask(r, m.data());
  return m;
}

TEST(CocoRleHostileTest, UnionOfManyMasksIsThePixelsOr) {
  std::mt19937 rng(49);
  for (int trial = 0; trial < 40; ++trial) {
    const int h = 1 + static_cast<int>(rng() % 30), w = 1 + static_cast<int>(rng() % 30);
    const int n = static_cast<int>(rng() % 70);
    std::vector<Rle> masks;
    std::vector<uint8_t> want(static_cast<size_t>(h) * w, 0);
    for (int k = 0; k < n; ++k) {
      std::vector<uint8_t> m(static_cast<size_t>(h) * w);
      const unsigned density = rng() % 5;
      for (uint8_t& v : m) v = rng() % 8 < density;
      for (size_t i = 0; i < m.size(); ++i) want[i] |= m[i];
      masks.push_back(RleFromMask(m.data(), h, w));
    }
    std::vector<const Rle*> all;
    for (const Rle& m : masks) all.push_back(&m);
    const Rle u = RleUnion(all, h, w);
    EXPECT_EQ(Pixels(u), want) << trial;
    EXPECT_EQ(u.counts, RleFromMask(want.data(), h, w).counts) << "canonical runs, trial " << trial;
  }
}

TEST(CocoRleHostileTest, EightyThousandTrianglesUnite) {
  // One annotation of 80 000 small triangles (quadratic in the count before: 26.6 s).
  std::vector<std::vector<double>> polygons;
  for (int i = 0; i < 80000; ++i) {
    const double x = (i % 400) * 2.5, y = (i / 400) * 5.0;
    polygons.push_back({x, y, x + 2, y, x, y + 3});
  }
  absl::StatusOr<Rle> r = RleFromPolygons(polygons, 1000, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  // Each triangle alone, its 1s marked pixel by pixel (column-major, as the runs go).
  std::vector<uint8_t> want(1000 * 1000, 0);
  for (const auto& p : polygons) {
    absl::StatusOr<Rle> one = RleFromPolygon(p, 1000, 1000);
    ASSERT_TRUE(one.ok());
    size_t at = 0;
    for (size_t j = 0; j < one->counts.size(); ++j) {
      if (j % 2 == 1) std::fill(want.begin() + at, want.begin() + at + one->counts[j], 1);
      at += one->counts[j];
    }
  }
  std::vector<uint8_t> got(1000 * 1000, 0);
  size_t at = 0;
  for (size_t j = 0; j < r->counts.size(); ++j) {
    if (j % 2 == 1) std::fill(got.begin() + at, got.begin() + at + r->counts[j], 1);
    at += r->counts[j];
  }
  EXPECT_EQ(got, want);
}

TEST(ClientFileTest, FifosDevicesAndOversizeFilesAreRefusedWithoutBlocking) {
  const std::string dir = TempDir();
  const std::string fifo = dir + "/fifo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> r = ReadClientFile("COCO file", fifo, ClientFileLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is a FIFO, not a regular file"));
  r = ReadClientFile("COCO file", "/dev/zero", ClientFileLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is a device"));
  Write(dir + "/big.json", std::string(5000, ' '));
  ClientFileLimits small;
  small.max_bytes = 4096;
  r = ReadClientFile("COCO file", dir + "/big.json", small);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("5000 bytes, more than the 4096 allowed (--max-json-file-size)"));
  ClientFileLimits late;
  late.deadline = absl::Now() - absl::Seconds(1);
  r = ReadClientFile("COCO file", dir + "/big.json", late);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  r = ReadClientFile("COCO file", dir + "/big.json", ClientFileLimits{}, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 5000u);
  EXPECT_GE(r->capacity(), 5064u);
  absl::StatusOr<CocoDataset> d = LoadCocoDataset(fifo);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("FIFO"));
}

constexpr char kImages[] = R"("images": [{"id": 7, "file_name": "a.png", "height": 4, "width": 4}])";
constexpr char kCategories[] = R"("categories": [{"id": 1, "name": "thing"}])";

absl::StatusOr<CocoDataset> Parse(const std::string& annotations, const std::string& images = kImages,
                                  const std::string& categories = kCategories) {
  return ParseCocoDataset(absl::StrCat("{", images, ", ", categories, ", \"annotations\": [", annotations, "]}"), "gt.json");
}

TEST(CocoJsonHostileTest, FieldsOfTheWrongTypeAreNamed) {
  const std::string seg = R"("segmentation": {"counts": [0, 16], "size": [4, 4]})";
  // category_id as a string or 1e20: the annotation's error says so (not "category 0").
  for (const char* category : {R"("1")", "1e20"}) {
    absl::StatusOr<CocoDataset> d =
        Parse(absl::StrCat(R"({"id": 3, "image_id": 7, "category_id": )", category, ", ", seg, "}"));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_THAT(d->annotations[0].error, HasSubstr("'category_id' is not an integer")) << category;
  }
  // An image_id that is not an integer names no image whose row could fail: the file is refused.
  absl::StatusOr<CocoDataset> d = Parse(absl::StrCat(R"({"id": 3, "image_id": "7", "category_id": 1, )", seg, "}"));
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("annotations[0]: 'image_id' is not an integer"));
  // An RLE size that is not whole numbers.
  d = Parse(R"({"id": 3, "image_id": 7, "category_id": 1, "segmentation": {"counts": [0, 16], "size": [4.5, 4]}})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->annotations[0].error, HasSubstr("'size' is not [height, width] in whole numbers"));
}

TEST(CocoJsonHostileTest, ControlCharactersInNamesAreRefused) {
  absl::StatusOr<CocoDataset> d =
      Parse("", R"("images": [{"id": 7, "file_name": "a\u0000b.png", "height": 4, "width": 4}])");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("images[0]: 'file_name' holds a control character (byte 1)"));
  d = Parse("", kImages, R"("categories": [{"id": 1, "name": "ca\u001bt"}])");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("categories[0]: 'name' holds a control character"));
}

TEST(CocoSourceHostileTest, AnImageOfOverflowingSizeFailsItsRowNotTheProcess) {
  const std::string dir = TempDir();
  Write(dir + "/gt.json",
        R"({"images": [{"id": 1, "height": 4294967296, "width": 4294967296}, {"id": 2, "height": 4, "width": 4}],
            "categories": [{"id": 1, "name": "a"}],
            "annotations": [{"id": 5, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 5, 0, 5, 5]]},
                            {"id": 6, "image_id": 2, "category_id": 1, "segmentation": [[0, 0, 3, 0, 3, 3]]}]})");
  absl::StatusOr<std::shared_ptr<const CocoSource>> source = CocoSource::Load(dir + "/gt.json", "");
  ASSERT_TRUE(source.ok()) << source.status();
  CocoImageInstances image;
  absl::Status s = (*source)->Instances(1, &image);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("4294967296x4294967296"));
  EXPECT_TRUE((*source)->Instances(2, &image).ok());
}

TEST(CocoSourceHostileTest, InstanceThumbnailFromRunsEqualsThePaintedPicture) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    CocoImageInstances image;
    image.image_id = 1;
    image.height = 1 + rng() % 300;
    image.width = 1 + rng() % 300;  // Small ones are enlarged: panel boxes overlap.
    auto box = [&](int64_t id, int64_t category, double score) {
      const int64_t h = image.height, w = image.width;
      std::vector<uint8_t> m(static_cast<size_t>(h * w), 0);
      const int64_t y0 = rng() % h, x0 = rng() % w;
      const int64_t y1 = y0 + 1 + rng() % (h - y0), x1 = x0 + 1 + rng() % (w - x0);
      for (int64_t y = y0; y < y1; ++y) {
        for (int64_t x = x0; x < x1; ++x) m[static_cast<size_t>(y * w + x)] = rng() % 10 != 0;
      }
      CocoInstance inst;
      inst.id = id;
      inst.category_id = category;
      inst.score = score;
      inst.mask = RleFromMask(m.data(), h, w);
      inst.area = static_cast<double>(RleArea(inst.mask));
      return inst;
    };
    for (int k = 0; k < 6; ++k) image.references.push_back(box(k + 1, 1 + k % 2, 0));
    for (int k = 0; k < 8; ++k) image.detections.push_back(box(k + 1, 1 + k % 3, (rng() % 1000) / 1000.0));
    std::vector<uint8_t> rgb(static_cast<size_t>(image.height * image.width * 3));
    for (uint8_t& v : rgb) v = static_cast<uint8_t>(rng());
    for (const uint8_t* pixels : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(rgb.data())}) {
      std::vector<uint8_t> outcomes;
      google::protobuf::RepeatedPtrField<v1::CocoImageRecord> records;
      EvaluateCocoInstances(image, &records, &outcomes);
      absl::StatusOr<std::string> painted =
          RenderThumbnail(pixels, outcomes.data(), static_cast<int>(image.height), static_cast<int>(image.width));
      absl::StatusOr<std::string> counted = RenderInstanceThumbnail(image, pixels);
      ASSERT_TRUE(painted.ok() && counted.ok());
      EXPECT_TRUE(*painted == *counted) << "trial " << trial << " " << image.height << "x" << image.width;
    }
  }
}

// A NIfTI-1 file of float32 voxels written by hand: header (vox_offset given), extension flag, data.
void WriteNifti(const std::string& path, const std::vector<float>& voxels, int nx, int ny, int nz, float vox_offset) {
  std::string h(348, '\0');
  auto put = [&](int at, const void* v, size_t n) { std::memcpy(&h[at], v, n); };
  const int32_t size = 348;
  put(0, &size, 4);
  const int16_t dim[8] = {3, static_cast<int16_t>(nx), static_cast<int16_t>(ny), static_cast<int16_t>(nz), 1, 1, 1, 1};
  put(40, dim, sizeof(dim));
  const int16_t datatype = 16, bitpix = 32;
  put(70, &datatype, 2);
  put(72, &bitpix, 2);
  const float pixdim[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  put(76, pixdim, sizeof(pixdim));
  put(108, &vox_offset, 4);
  const float slope = 1;
  put(112, &slope, 4);
  std::memcpy(&h[344], "n+1\0", 4);
  std::string data(reinterpret_cast<const char*>(voxels.data()), voxels.size() * 4);
  Write(path, h + std::string(4, '\0') + data);
}

TEST(VolumeHostileTest, NonFiniteVoxelsFailNamingTheFile) {
  const std::string dir = TempDir();
  std::vector<float> v(4 * 3 * 2, 1.0f);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    v[5] = bad;
    const std::string path = dir + "/p.nii";
    WriteNifti(path, v, 4, 3, 2, 352);
    LabelMap labels;
    VolumeGeometry g;
    absl::Status s = LoadNiftiLabels(path, 1 << 20, &labels, &g);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
    EXPECT_THAT(std::string(s.message()), HasSubstr("at (x=1, y=1, z=0) is not finite"));
    VolumeImage image;
    s = LoadNiftiImage(path, 1 << 20, false, &image);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("is not finite"));
  }
}

TEST(VolumeHostileTest, VoxOffsetsOutsideTheFileFailNamingTheFile) {
  const std::string dir = TempDir();
  const std::vector<float> v(4 * 3 * 2, 1.0f);
  for (float offset : {2147483904.0f, 3e9f, 1e12f, -1000.0f, 100.0f, 352.5f, 360.0f}) {
    const std::string path = absl::StrCat(dir, "/o", static_cast<int64_t>(offset), ".nii");
    WriteNifti(path, v, 4, 3, 2, offset);
    LabelMap labels;
    VolumeGeometry g;
    absl::Status s = LoadNiftiLabels(path, 1 << 20, &labels, &g);
    ASSERT_FALSE(s.ok()) << offset;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path)) << offset;
    EXPECT_THAT(std::string(s.message()), HasSubstr("vox_offset")) << offset;
  }
  // The right offset reads every voxel.
  const std::string path = dir + "/ok.nii";
  WriteNifti(path, v, 4, 3, 2, 352);
  LabelMap labels;
  VolumeGeometry g;
  ASSERT_TRUE(LoadNiftiLabels(path, 1 << 20, &labels, &g).ok());
  EXPECT_EQ(labels.labels, std::vector<uint16_t>(24, 1));
}

}  // namespace
}  // namespace tally
