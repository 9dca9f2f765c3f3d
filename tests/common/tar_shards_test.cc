// Tar shards (common/sources/tar_shards.h): pattern expansion, locators, the header index against
// offsets worked out by hand from the tar format (512-byte headers, data padded to 512), samples.
#include "common/sources/tar_shards.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

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
  auto listing = ListTarBytes(tar, "s.tar", TarListOptions{true});
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
  EXPECT_NE(again[0].error.find("its key is that of an earlier sample in shard 's.tar'"), std::string::npos)
      << again[0].error;
}

TEST(TarShardsTest, ClaimsPastTheEndAndTruncationFailTheirSamplesOnly) {
  std::string tar = Member("ok.png", "i") + Member("ok.seg.png", "m") + Member("cut.png", std::string(3000, 'c'));
  tar.resize(tar.size() - 1000);  // Ends inside cut.png's data.
  auto listing = ListTarBytes(tar, "s.tar", TarListOptions{false});
  ASSERT_TRUE(listing.ok());
  EXPECT_FALSE(listing->ended_early.empty());
  SampleRowsState state;
  std::vector<ManifestRow> rows = SampleRows(*listing, "s.tar", SampleConventions{}, 0, &state);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].error.empty()) << rows[0].error;
  EXPECT_NE(rows[1].error.find("cut.png"), std::string::npos) << rows[1].error;
  EXPECT_FALSE(ListTarBytes("not a tar at all, just text", "x.tar", TarListOptions{}).ok());
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
    auto listing = ListTarBytes(tar, "s.tar", TarListOptions{false});
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
  auto listing = ListTarBytes(std::string(out.data(), used), "s.tar.gz", TarListOptions{});
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_TRUE(listing->compressed);
  ASSERT_EQ(listing->members.size(), 2u);
  for (const TarMember& m : listing->members) {
    EXPECT_TRUE(m.problem.empty()) << m.name << ": " << m.problem;
    EXPECT_EQ(m.size, 200000);
  }
  EXPECT_EQ(listing->members[1].offset - listing->members[0].offset, 200192 + 512);
}


// A gzipped tar of the given members (libarchive writes it: an independent writer).
std::string Gzipped(const std::vector<std::pair<std::string, std::string>>& members, bool pax = true) {
  std::vector<char> out(8 << 20);
  size_t used = 0;
  archive* w = archive_write_new();
  archive_write_add_filter_gzip(w);
  if (pax) {
    archive_write_set_format_pax_restricted(w);
  } else {
    archive_write_set_format_gnutar(w);
  }
  archive_write_open_memory(w, out.data(), out.size(), &used);
  for (const auto& [name, data] : members) {
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
  return std::string(out.data(), used);
}

// A GNU long-name entry ('L') whose name is `n` bytes, before a member.
std::string LongName(size_t n, const std::string& data) {
  return Member("././@LongLink", std::string(n, 'x'), 'L') + Member(std::string(99, 'x'), data);
}

TEST(TarLimitsTest, ANameOverTheLimitFailsItsOwnSampleAndTheShardGoesOn) {
  // 10 MB of name in the middle of a shard: its sample fails by name, the samples after it are rows.
  const std::string tar = Member("a.png", "i") + Member("a.seg.png", "m") + LongName(10 << 20, "x") +
                          Member("b.png", "i") + Member("b.seg.png", "m") + End();
  auto listing = ListTarBytes(tar, "s.tar", TarListOptions{});
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_TRUE(listing->ended_early.empty()) << listing->ended_early;
  ASSERT_EQ(listing->members.size(), 5u);
  EXPECT_NE(listing->members[2].problem.find("its long-name header is 10485760 bytes, more than the limit of 4096"), std::string::npos)
      << listing->members[2].problem;
  SampleRowsState state;
  const std::vector<ManifestRow> rows = SampleRows(*listing, "s.tar", SampleConventions{}, 0, &state);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(rows[0].error.empty());
  EXPECT_NE(rows[1].error.find("more than the limit of 4096"), std::string::npos) << rows[1].error;
  EXPECT_TRUE(rows[2].error.empty()) << rows[2].error;
  // A long name within the limit is the member's name.
  auto ok = ListTarBytes(LongName(300, "x") + End(), "s.tar", TarListOptions{});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->members[0].name, std::string(300, 'x'));
}

TEST(TarLimitsTest, AMemberOverTheSizeLimitIsRefusedAtItsHeader) {
  TarListOptions options;
  options.max_member_bytes = 1000;
  const std::string plain = Member("a.png", std::string(2000, 'i')) + Member("a.seg.png", "m") + Member("b.png", "i") +
                            Member("b.seg.png", "m") + End();
  auto listing = ListTarBytes(plain, "s.tar", options);
  ASSERT_TRUE(listing.ok());
  EXPECT_TRUE(listing->ended_early.empty());  // A plain tar seeks past it.
  ASSERT_EQ(listing->members.size(), 4u);
  EXPECT_EQ(listing->members[0].problem, "it declares 2000 bytes, more than the limit of 1000 for one member");
  EXPECT_TRUE(listing->members[2].problem.empty());
  // A compressed tar would have to decompress it to go on: the listing ends there, saying so.
  auto gz = ListTarBytes(Gzipped({{"a.png", std::string(2000, 'i')}, {"a.seg.png", "m"}, {"b.png", "i"}}), "s.tar.gz",
                         options);
  ASSERT_TRUE(gz.ok()) << gz.status();
  ASSERT_EQ(gz->members.size(), 1u);
  EXPECT_NE(gz->ended_early.find("'a.png' declares 2000 bytes, more than the limit of 1000"), std::string::npos)
      << gz->ended_early;
}

TEST(TarLimitsTest, SparseMembersAreListedNeverRead) {
  // GNU's sparse entry (type 'S') and pax's GNU.sparse records: a 12 KB tar may declare gigabytes.
  std::string pax_header = "30 GNU.sparse.size=6442450944\n";
  const std::string tar = Member("s.png", "", 'S') + Member("./PaxHeaders/t.png", pax_header, 'x') +
                          Member("t.png", "") + Member("u.png", "i") + End();
  auto listing = ListTarBytes(tar, "s.tar", TarListOptions{});
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->members.size(), 3u);
  EXPECT_NE(listing->members[0].problem.find("sparse"), std::string::npos);
  EXPECT_NE(listing->members[1].problem.find("sparse"), std::string::npos);
  EXPECT_TRUE(listing->members[2].problem.empty());
}

TEST(TarLimitsTest, AHeaderThatIsNoHeaderEndsTheShardAndTheIndexSaysSo) {
  std::string garbage(512, 'g');
  const std::string tar = Member("a.png", "i") + Member("a.seg.png", "m") + garbage + Member("b.png", "i") + End();
  auto listing = ListTarBytes(tar, "s.tar", TarListOptions{});
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(listing->members.size(), 2u);
  EXPECT_NE(listing->ended_early.find("the block at byte 2048 is no tar header"), std::string::npos)
      << listing->ended_early;
}

TEST(TarLimitsTest, MembersAfterALoneZeroBlockOrAnEndMarkerAreNotDroppedSilently) {
  const std::string first = Member("a.png", "i") + Member("a.seg.png", "m");  // 2048 bytes.
  const std::string zero(512, '\0');
  // Record padding after the end marker is the archive's end; a second archive joined on is not.
  for (const auto& [tar, want] : std::vector<std::pair<std::string, std::string>>{
           {first + End() + std::string(8 * 512, '\0'), ""},
           {first + zero + Member("b.png", "i") + End(), "a tar header at byte 2560 follows a lone zero block at byte 2048"},
           {first + End() + Member("b.png", "i") + End(),
            "a tar header at byte 3072 follows the end-of-archive marker at byte 2048"}}) {
    auto listing = ListTarBytes(tar, "s.tar", TarListOptions{});
    ASSERT_TRUE(listing.ok()) << listing.status();
    EXPECT_EQ(listing->members.size(), 2u);
    if (want.empty()) {
      EXPECT_EQ(listing->ended_early, "");
    } else {
      EXPECT_NE(listing->ended_early.find(want), std::string::npos) << listing->ended_early;
    }
  }
}

TEST(TarLimitsTest, TheDeadlineBindsTheListing) {
  TarListOptions options;
  options.deadline = absl::InfinitePast();
  auto listing = ListTarBytes(Member("a.png", "i") + End(), "slow.tar", options);
  ASSERT_FALSE(listing.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(listing.status()));
  EXPECT_NE(listing.status().message().find("shard 'slow.tar'"), std::string::npos);
}

TEST(TarLimitsTest, JsonFieldsAreHeldToARowsLimits) {
  std::string many = "{";
  for (int i = 0; i < 75000; ++i) absl::StrAppend(&many, i ? "," : "", "\"f", i, "\": 1");
  many += "}";
  const std::string tar = Member("a.png", "i") + Member("a.seg.png", "m") + Member("a.json", many) +
                          Member("b.png", "i") + Member("b.seg.png", "m") + Member("b.json", R"({"prompt": "x"})") +
                          Member("c.png", "i") + Member("c.seg.png", "m") +
                          Member("c.json", absl::StrCat(R"({"prompt": ")", std::string(5000, 'p'), "\"}")) + End();
  TarListOptions options;
  options.read_json = true;
  auto listing = ListTarBytes(tar, "s.tar", options);
  ASSERT_TRUE(listing.ok());
  SampleConventions conventions;
  conventions.keep_columns = true;
  SampleRowsState state;
  const std::vector<ManifestRow> rows = SampleRows(*listing, "s.tar", conventions, 0, &state);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_NE(rows[0].error.find("shard 's.tar', sample 'a'"), std::string::npos) << rows[0].error;
  EXPECT_NE(rows[0].error.find("more than 1024 fields"), std::string::npos) << rows[0].error;
  EXPECT_TRUE(rows[1].error.empty()) << rows[1].error;
  EXPECT_NE(rows[2].error.find("field 'prompt' holds 5000 bytes (the limit is 4096)"), std::string::npos) << rows[2].error;
  EXPECT_EQ(state.columns, std::vector<std::string>{"prompt"});
}

TEST(TarLimitsTest, AShardListPastTheLimitIsRefusedNamingIt) {
  const std::string dir = ::testing::TempDir() + "/shard_list";
  mkdir(dir.c_str(), 0755);
  std::string text;
  for (int i = 0; i < 12; ++i) absl::StrAppend(&text, "s", i, ".tar\n");
  FILE* f = std::fopen((dir + "/list.txt").c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  auto shards = ExpandShardPatterns({dir + "/list.txt"}, 10);
  ASSERT_FALSE(shards.ok());
  EXPECT_NE(shards.status().message().find("names more than 10 shards (line 11)"), std::string::npos)
      << shards.status();
  EXPECT_TRUE(ExpandShardPatterns({dir + "/list.txt"}, 12).ok());
}

// A CSV list's header is no shard, and paths come out without "./" segments.
TEST(TarShardsTest, AShardListMayBeACsvFileWithAHeader) {
  std::string dir = ::testing::TempDir();
  while (!dir.empty() && dir.back() == '/') dir.pop_back();
  dir += "/shard_csv";
  mkdir(dir.c_str(), 0755);
  const std::string text = "samples,path\n10,./a/s0.tar\n3,\"b//s1.tar\"\n";
  FILE* f = std::fopen((dir + "/list.csv").c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  auto shards = ExpandShardPatterns({dir + "/list.csv"}, 10);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, (std::vector<std::string>{dir + "/a/s0.tar", dir + "/b/s1.tar"}));
}

}  // namespace
}  // namespace tally
