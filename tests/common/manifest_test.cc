#include "common/sources/manifest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/text.h"

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

TEST(ManifestTest, UntrustedNamesArePrintableAndSayWhyNoManifestCanHoldThem) {
  EXPECT_EQ(Printable("caf\xc3\xa9.png"), "caf\xc3\xa9.png");  // Valid UTF-8 stays as it is.
  EXPECT_EQ(Printable("bad\xe9.png"), "bad\\xe9.png");
  EXPECT_EQ(Printable("a\r\nb\x7f"), "a\\x0d\\x0ab\\x7f");
  EXPECT_EQ(Printable("c1\xc2\x85"), "c1\\xc2\\x85");  // NEL, a C1 control.
  EXPECT_EQ(Printable("\xe2\x82"), "\\xe2\\x82");      // A cut character.
  EXPECT_EQ(Printable(std::string(600, 'x'), 512), std::string(512, 'x') + "...");
  EXPECT_EQ(UncarriableNameReason("caf\xc3\xa9.png"), "");
  EXPECT_EQ(UncarriableNameReason("bad\xe9.png"), "it is not valid UTF-8 (byte 0xE9 at byte 3)");
  EXPECT_EQ(UncarriableNameReason("line\rfeed.png"), "it holds a control character (0x0D at byte 4)");
}

// Found by probing: "images/case_000.png<NUL>../../etc/passwd" was evaluated as images/case_000.png
// while the reports carried the whole string. NUL and control characters refuse the manifest, naming
// the line and the column; tabs pass, and line breaks only inside a quoted prompt.
TEST(ManifestTest, NulAndControlCharactersAreRefusedWithLineAndColumn) {
  const std::string header = "id,image,mask,prompt\n";
  struct Case {
    std::string row;     // The data row (line 2).
    std::string expect;  // In the error.
  };
  const std::vector<Case> cases = {
      {std::string("a,i.png\0../../etc/passwd,m.png,p\n", 33), "line 2, column 2 ('image'): a NUL byte at byte 6"},
      {std::string("a\0,i.png,m.png,p\n", 18), "line 2, column 1 ('id'): a NUL byte"},
      {"a,i.png,m\x01.png,p\n", "line 2, column 3 ('mask'): control character 0x01 at byte 2"},
      {"a,i.png,m.png,left\x1blung\n", "line 2, column 4 ('prompt'): control character 0x1B"},
      {"a,i.png\x7f,m.png,p\n", "line 2, column 2 ('image'): control character 0x7F"},
      {"a,i\xc2\x85.png,m.png,p\n", "line 2, column 2 ('image'): control character U+0085"},
      {"a,\"i\n.png\",m.png,p\n", "line 2, column 2 ('image'): control character 0x0A at byte 2"},
      {"a,i.png,\"m.png\r\",p\n", "line 2, column 3 ('mask'): control character 0x0D"},
  };
  for (const Case& c : cases) {
    auto m = ParseManifest(header + c.row, ".", "hostile.csv");
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("manifest 'hostile.csv' " + c.expect));
  }
  // In the header too.
  auto h = ParseManifest(std::string("image,ma\0sk\na,b\n", 15), ".", "h.csv");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("line 1, column 2: a NUL byte"));
  // Tabs anywhere, and line breaks inside a quoted prompt, are text.
  auto ok = ParseManifest(header + "a\tb,i.png,m.png,\"the left\r\nlung\tand\nmore\"\nc,j.png,n.png,q\n", ".", "ok.csv");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->rows.size(), 2u);
  EXPECT_EQ(ok->rows[0].id, "a\tb");
  EXPECT_EQ(ok->rows[1].line, 5);  // The prompt took lines 2-4.
}

TEST(DuplicateIdsTest, CountsRepeatsAndNamesTheFirstIdsInManifestOrder) {
  DuplicateIds d;
  const std::vector<std::string> ids = {"a", "b", "a", "c", "b", "a", "d", "e", "e"};
  for (size_t i = 0; i < ids.size(); ++i) d.Add(ids[i], static_cast<int64_t>(i), static_cast<int64_t>(i) + 2);
  std::vector<DuplicateIds::Group> groups;
  int64_t repeated_ids = 0;
  // a repeats twice, b once, e once: 4 rows repeat an earlier row's id, 3 ids repeat.
  EXPECT_EQ(d.Finish(2, &groups, &repeated_ids), 4);
  EXPECT_EQ(repeated_ids, 3);
  ASSERT_EQ(groups.size(), 2u);  // By their second row: a (row 2) before b (row 4); e (row 8) left out.
  EXPECT_EQ(groups[0].rows, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {5, 7}}));
  EXPECT_EQ(groups[1].rows, (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {4, 6}}));
  EXPECT_EQ(DuplicateIdsMessage(4, 3, {{"a", {2, 4, 7}}, {"b", {3, 6}}}),
            "4 rows repeat the id of an earlier row (3 ids): 'a' (lines 2, 4, 7), 'b' (lines 3, 6), ...");
  DuplicateIds none;
  none.Add("x", 0, 2);
  none.Add("y", 1, 3);
  EXPECT_EQ(none.Finish(3, &groups), 0);
  EXPECT_TRUE(groups.empty());
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
  std::string text = "id,image,mask,prompt\n";
  for (int i = 0; i < 40000; ++i) {
    text += "\"case " + std::to_string(i) + ", with \"\"quotes\"\"\",img/" + std::to_string(i) + ".png,msk/" +
            std::to_string(i) + ".png,\"a prompt\nwith a newline\"\r\n";
  }
  ASSERT_GT(text.size(), size_t{2} << 20);
  const std::string path = ::testing::TempDir() + "/manifest_stream.csv";
  std::ofstream(path, std::ios::binary) << text;
  auto streamed = ReadManifest(path);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_EQ(streamed->rows.size(), 40000u);
  EXPECT_EQ(streamed->rows[39999].id, "case 39999, with \"quotes\"");
  EXPECT_EQ(streamed->rows[39999].line, 2 + 2 * 39999);
  EXPECT_EQ(streamed->rows[12345].mask, "msk/12345.png");
}

}  // namespace
}  // namespace tally
