// Tar shards (common/sources/tar_shards.h): pattern expansion, locators, the header index against
// offsets worked out by hand from the tar format (512-byte headers, data padded to 512), samples.
#include "common/sources/tar_shards.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <cstring>

namespace tally {
namespace {

// A ustar member: a 512-byte header (name, mode, sizes in octal, checksum) and its data padded.
std::string Member(const std::string& name, const std::string& data, char type = '0', const std::string& link = "") {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), name.size());
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011o", static_cast<unsigned>(data.size()));
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = type;
  std::memcpy(&h[157], link.data(), link.size());
  std::memcpy(&h[257], "ustar\0" "00", 8);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  std::string padded = data;
  padded.resize((data.size() + 511) / 512 * 512, '\0');
  return h + padded;
}
std::string End() { return std::string(1024, '\0'); }

TEST(TarShardsTest, BracesExpandToZeroPaddedRangesAndLists) {
  auto v = ExpandBraces("d/train-{008..011}.{tar,tgz}", 100);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<std::string>{"d/train-008.tar", "d/train-008.tgz", "d/train-009.tar", "d/train-009.tgz",
                                          "d/train-010.tar", "d/train-010.tgz", "d/train-011.tar", "d/train-011.tgz"}));
  EXPECT_FALSE(ExpandBraces("x-{0..1000000}.tar", 1000).ok());
  EXPECT_FALSE(ExpandBraces("x-{3..1}.tar", 1000).ok());
  EXPECT_FALSE(ExpandBraces("x-{1..2.tar", 1000).ok());
}

TEST(TarShardsTest, LocatorsRoundTripAndDisplayAsShardColonMember) {
  const std::string loc = MemberLocator("/d/a:b.tar", 1536, 77, true, "k:1.png");
  EXPECT_TRUE(IsMemberLocator(loc));
  EXPECT_FALSE(IsMemberLocator("/d/a.png"));
  auto ref = ParseMemberLocator(loc);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->shard, "/d/a:b.tar");
  EXPECT_EQ(ref->member, "k:1.png");
  EXPECT_EQ(ref->offset, 1536);
  EXPECT_EQ(ref->size, 77);
  EXPECT_TRUE(ref->compressed);
  EXPECT_EQ(DisplayPath(loc), "/d/a:b.tar:k:1.png");
  EXPECT_FALSE(ParseMemberLocator("@tar:1:2:t:999:/short").ok());
}

TEST(TarShardsTest, IndexGivesDataOffsetsAndSamplesByKey) {
  // Offsets by hand: each header 512 bytes, data rounded up to 512.
  const std::string tar = Member("a/k1.png", std::string(700, 'i')) +           // header 0, data 512
                          Member("a/k1.seg.png", std::string(10, 'm')) +        // header 1536, data 2048
                          Member("a/k1.json", R"({"prompt": "red cell", "n": 3, "x": [1, 2]})") +  // 2560, 3072
                          Member("k2.jpg", "j") +                               // 3584, 4096
                          Member("k2.seg.png", "s") +                           // 4608, 5120
                          Member("k3.png", "", '2', "../../etc/passwd") +       // a symlink
                          Member("k3.seg.png", "s") + End();
  auto listing = ListTarBytes(tar, "s.tar", true);
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->members.size(), 7u);
  EXPECT_FALSE(listing->compressed);
  const int64_t offsets[] = {512, 2048, 3072, 4096, 5120};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(listing->members[i].offset, offsets[i]) << i;
  EXPECT_EQ(listing->members[0].size, 700);
  EXPECT_FALSE(listing->members[5].regular);

  SampleConventions c;
  c.keep_columns = true;
  SampleRowsState state;
  std::vector<ManifestRow> rows = SampleRows(*listing, "s.tar", c, 10, &state);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].id, "a/k1");
  EXPECT_EQ(rows[0].index, 10);
  EXPECT_EQ(rows[0].image, "s.tar:a/k1.png");
  EXPECT_EQ(rows[0].mask, "s.tar:a/k1.seg.png");
  EXPECT_EQ(rows[0].image_path, MemberLocator("s.tar", 512, 700, false, "a/k1.png"));
  EXPECT_EQ(state.columns, (std::vector<std::string>{"prompt", "n", "x"}));
  EXPECT_EQ(rows[0].columns, (std::vector<std::string>{"red cell", "3", "[1,2]"}));
  EXPECT_EQ(rows[1].columns, (std::vector<std::string>{"", "", ""}));
  EXPECT_TRUE(rows[0].error.empty() && rows[1].error.empty());
  EXPECT_NE(rows[2].error.find("symbolic link to '../../etc/passwd'"), std::string::npos) << rows[2].error;
  // The same keys again (another shard): failed, saying why.
  std::vector<ManifestRow> again = SampleRows(*listing, "t.tar", c, 13, &state);
  EXPECT_NE(again[0].error.find("same key"), std::string::npos) << again[0].error;
}

TEST(TarShardsTest, ClaimsPastTheEndAndTruncationFailTheirSamplesOnly) {
  std::string tar = Member("ok.png", "i") + Member("ok.seg.png", "m") + Member("cut.png", std::string(3000, 'c'));
  tar.resize(tar.size() - 1000);  // Ends inside cut.png's data.
  auto listing = ListTarBytes(tar, "s.tar", false);
  ASSERT_TRUE(listing.ok());
  EXPECT_FALSE(listing->ended_early.empty());
  SampleRowsState state;
  std::vector<ManifestRow> rows = SampleRows(*listing, "s.tar", SampleConventions{}, 0, &state);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].error.empty()) << rows[0].error;
  EXPECT_NE(rows[1].error.find("cut.png"), std::string::npos) << rows[1].error;
  EXPECT_FALSE(ListTarBytes("not a tar at all, just text", "x.tar", false).ok());
}


TEST(TarShardsTest, ANegativeOrAbsurdSizeClaimFailsItsMemberWithoutOverflow) {
  // GNU base-256 sizes: 0xff... is -1; 0x80 then 0x7f ff.. is near INT64_MAX.
  std::string negative = Member("neg.png", "");
  std::memset(&negative[124], 0xff, 12);
  std::string huge = Member("huge.png", "");
  std::memset(&huge[124], 0, 12);
  huge[124] = static_cast<char>(0x80);
  std::memset(&huge[128], 0xff, 8);
  huge[128] = 0x7f;
  for (std::string* h : {&negative, &huge}) {  // The checksum again over the new size bytes.
    std::memset(&(*h)[148], ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>((*h)[i]);
    std::snprintf(&(*h)[148], 8, "%06o", sum);
    (*h)[155] = ' ';
  }
  for (const std::string& bad : {negative, huge}) {
    const std::string tar = Member("a.png", "i") + Member("a.seg.png", "m") + bad + Member("b.png", "i") + End();
    auto listing = ListTarBytes(tar, "s.tar", false);
    ASSERT_TRUE(listing.ok()) << listing.status();
    // libarchive may refuse the header (the shard ends early there) or list it: never a sample.
    ASSERT_GE(listing->members.size(), 2u);
    EXPECT_EQ(listing->members[0].offset, 512);
    EXPECT_EQ(listing->members[1].offset, 1536);
    if (listing->members.size() == 2) {
      EXPECT_FALSE(listing->ended_early.empty());
    } else {
      EXPECT_FALSE(listing->members[2].problem.empty());
      EXPECT_LT(listing->members[2].offset, static_cast<int64_t>(tar.size()));
    }
  }
}

TEST(TarShardsTest, ACompressedMemberMayBeLargerThanTheWholeCompressedShard) {
  // 200 KB of zeros (an uncompressed mask, say) gzips to a few hundred bytes.
  const std::string big(200000, '\0');
  std::vector<char> out(1 << 20);
  size_t used = 0;
  archive* w = archive_write_new();
  archive_write_add_filter_gzip(w);
  archive_write_set_format_pax_restricted(w);
  ASSERT_EQ(archive_write_open_memory(w, out.data(), out.size(), &used), ARCHIVE_OK);
  for (const auto& [name, data] : {std::pair<std::string, std::string>{"k.tif", big}, {"k.seg.tif", big}}) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_write_header(w, e);
    archive_write_data(w, data.data(), data.size());
    archive_entry_free(e);
  }
  archive_write_close(w);
  archive_write_free(w);
  ASSERT_LT(used, big.size());
  auto listing = ListTarBytes(std::string(out.data(), used), "s.tar.gz", false);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_TRUE(listing->compressed);
  ASSERT_EQ(listing->members.size(), 2u);
  for (const TarMember& m : listing->members) {
    EXPECT_TRUE(m.problem.empty()) << m.name << ": " << m.problem;
    EXPECT_EQ(m.size, 200000);
  }
  EXPECT_EQ(listing->members[1].offset - listing->members[0].offset, 200192 + 512);
}

}  // namespace
}  // namespace tally
