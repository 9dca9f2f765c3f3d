#include "common/io/manifest.h"

#include <sys/stat.h>
#include <unistd.h>

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

TEST(ManifestTest, InvalidUtf8NamesLineAndColumn) {
  auto m = ParseManifest("id,image,mask\nok,a.png,b.png\ncaf\xe9,c.png,d.png\n", ".", "latin1.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              HasSubstr("manifest 'latin1.csv' line 3, column 1 ('id'): invalid UTF-8 (byte 0xE9 at byte 4"));
  // Valid multi-byte UTF-8 is fine.
  auto ok = ParseManifest("id,image,mask\ncaf\xc3\xa9,c.png,d.png\n", ".", "utf8.csv");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rows[0].id, "caf\xc3\xa9");
  EXPECT_EQ(FirstInvalidUtf8("\xed\xa0\x80"), 0);  // A UTF-16 surrogate.
  EXPECT_EQ(FirstInvalidUtf8("a\xc0\xaf"), 1);      // Overlong '/'.
}

TEST(ManifestTest, LimitsOnFieldsAndRows) {
  auto m = ParseManifest("image,mask\n" + std::string(5000, 'a') + ",m.png\n", ".", "long.csv");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("line 2, column 1: field longer than 4096 bytes"));
  ManifestLimits limits;
  limits.max_rows = 2;
  m = ParseManifest("image,mask\na,b\nc,d\ne,f\n", ".", "rows.csv", limits);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("more than 2 rows"));
}

// A file that is not a manifest (/etc/shadow, say) is refused without echoing any of its bytes.
TEST(ManifestTest, ErrorsNeverEchoTheFile) {
  auto m = ParseManifest("root:*:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n", ".", "shadow");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("line 1: the header has no 'image' column"));
  EXPECT_THAT(std::string(m.status().message()), ::testing::Not(HasSubstr("root")));
  EXPECT_THAT(std::string(m.status().message()), ::testing::Not(HasSubstr("20228")));
}

TEST(ManifestTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = ::testing::TempDir() + "/manifest_fifo.csv";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto m = ReadManifest(fifo);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("not a regular file"));
}

// Streaming reads the file in 1 MiB chunks: records (quoted fields with commas and newlines
// included) that straddle chunk boundaries come out exactly as from the whole text.
TEST(ManifestTest, StreamingMatchesParsingTheWholeText) {
  std::string text = "id,image,mask\n";
  for (int i = 0; i < 40000; ++i) {
    text += "\"case " + std::to_string(i) + ", with \"\"quotes\"\"\nand a newline\",img/" + std::to_string(i) +
            ".png,msk/" + std::to_string(i) + ".png\r\n";
  }
  ASSERT_GT(text.size(), size_t{2} << 20);
  const std::string path = ::testing::TempDir() + "/manifest_stream.csv";
  std::ofstream(path, std::ios::binary) << text;
  auto streamed = ReadManifest(path);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_EQ(streamed->rows.size(), 40000u);
  EXPECT_EQ(streamed->rows[39999].id, "case 39999, with \"quotes\"\nand a newline");
  EXPECT_EQ(streamed->rows[39999].line, 2 + 2 * 39999);
  EXPECT_EQ(streamed->rows[12345].mask, "msk/12345.png");
}

}  // namespace
}  // namespace tally
