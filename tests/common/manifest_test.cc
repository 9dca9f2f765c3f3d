#include "common/manifest.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

TEST(ManifestTest, ParsesRequiredColumnsAndResolvesPaths) {
  auto m = ParseManifest("image,mask\na/x.png,m/x.png\n/abs/y.jpg,m/y.png\n", "/data", "m.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->rows.size(), 2u);
  EXPECT_EQ(m->rows[0].index, 0);
  EXPECT_EQ(m->rows[0].id, "x");  // No id column: the image's stem.
  EXPECT_EQ(m->rows[0].image, "a/x.png");
  EXPECT_EQ(m->rows[0].image_path, "/data/a/x.png");
  EXPECT_EQ(m->rows[0].mask_path, "/data/m/x.png");
  EXPECT_EQ(m->rows[1].image_path, "/abs/y.jpg");
  EXPECT_EQ(m->rows[1].index, 1);
  EXPECT_EQ(m->rows[1].line, 3);
}

TEST(ManifestTest, IdColumnAnyOrderExtraColumnsIgnored) {
  auto m = ParseManifest("split, MASK ,id,Image\ntrain,m1.png,case-7,i1.png\n", ".", "m.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->rows.size(), 1u);
  EXPECT_EQ(m->rows[0].id, "case-7");
  EXPECT_EQ(m->rows[0].image, "i1.png");
  EXPECT_EQ(m->rows[0].mask, "m1.png");
}

TEST(ManifestTest, QuotesCrlfBomAndBlankLines) {
  std::string text = "\xEF\xBB\xBFimage,mask\r\n\"dir,with comma/a.png\",\"m \"\"q\"\".png\"\r\n\r\nb.png,c.png";
  auto m = ParseManifest(text, "/d", "m.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->rows.size(), 2u);
  EXPECT_EQ(m->rows[0].image, "dir,with comma/a.png");
  EXPECT_EQ(m->rows[0].mask, "m \"q\".png");
  EXPECT_EQ(m->rows[1].image, "b.png");
  EXPECT_EQ(m->rows[1].index, 1);
}

TEST(ManifestTest, MissingColumnNamesIt) {
  auto m = ParseManifest("image,label\na.png,b.png\n", ".", "data.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("'mask'"));
  EXPECT_THAT(m.status().message(), HasSubstr("data.csv"));
  auto m2 = ParseManifest("mask\nb.png\n", ".", "data.csv");
  ASSERT_FALSE(m2.ok());
  EXPECT_THAT(m2.status().message(), HasSubstr("'image'"));
}

TEST(ManifestTest, EmptyFileIsAnError) {
  auto m = ParseManifest("", ".", "empty.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("empty.csv"));
}

TEST(ManifestTest, HeaderOnlyHasNoRows) {
  auto m = ParseManifest("image,mask\n", ".", "m.csv");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->rows.empty());
}

TEST(ManifestTest, MalformedRowFailsOnlyThatRow) {
  auto m = ParseManifest("image,mask\na.png\nb.png,b_m.png\n,c.png\n", ".", "m.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->rows.size(), 3u);
  EXPECT_THAT(m->rows[0].error, HasSubstr("line 2"));
  EXPECT_TRUE(m->rows[1].error.empty());
  EXPECT_THAT(m->rows[2].error, HasSubstr("empty 'image'"));
}

TEST(ManifestTest, UnterminatedQuoteNamesLine) {
  auto m = ParseManifest("image,mask\na.png,b.png\n\"c.png,d.png\n", ".", "m.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("line 3"));
}

TEST(ManifestTest, MissingFileIsNotFoundAndNamesPath) {
  auto m = ReadManifest("/nonexistent/dir/manifest.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("/nonexistent/dir/manifest.csv"));
}

TEST(ManifestTest, ReadsFileRelativeToItsFolder) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/manifest_test.csv";
  std::ofstream(path) << "id,image,mask\n1,img/a.png,msk/a.png\n";
  auto m = ReadManifest(path);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->rows.size(), 1u);
  std::string base = dir;
  while (!base.empty() && base.back() == '/') base.pop_back();
  EXPECT_EQ(m->rows[0].image_path, base + "/img/a.png");
}

}  // namespace
}  // namespace tally
