// Reading tar members (common/sources/tar_members.h) from shards on disk: a shard changed after it
// was indexed is never read from the old offsets, declared sizes are held to their limits before
// anything is allocated, scratch copies that could not be written whole are never used, and every
// shard is closed when asked. Tars are written by libarchive (an independent writer) and indexed by
// Tally's own listing.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sources/tar_shards.h"

namespace tally {
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;

void WriteTar(const std::string& path, const Members& members, bool gzip = false,
              int format = ARCHIVE_FORMAT_TAR_PAX_RESTRICTED) {
  archive* w = archive_write_new();
  if (gzip) archive_write_add_filter_gzip(w);
  archive_write_set_format(w, format);
  ASSERT_EQ(archive_write_open_filename(w, path.c_str()), ARCHIVE_OK);
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
}

std::vector<ManifestRow> Index(const std::string& shard) {
  auto index = ShardIndex::Open({shard}, SampleConventions{}, 1000);
  EXPECT_TRUE(index.ok());
  std::vector<ManifestRow> rows;
  EXPECT_TRUE((*index)->NextBatch(1000, &rows).ok());
  return rows;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  stat(path.c_str(), &st);
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void SetMtimeNs(const std::string& path, int64_t ns) {
  timespec times[2] = {{ns / 1000000000, ns % 1000000000}, {ns / 1000000000, ns % 1000000000}};
  utimensat(AT_FDCWD, path.c_str(), times, 0);
}

class TarMembersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tar_members_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0755);
    CloseShards();
  }
  void TearDown() override {
    CloseShards();
    SetScratchLimit(0);
  }
  std::string dir_;
};

TEST_F(TarMembersTest, AShardRepackedUnderTheSameSizeAndTimeIsNeverReadFromTheOldOffsets) {
  const std::string shard = dir_ + "/s.tar";
  // Same names, same sizes, another order: every member's offset now holds another's bytes.
  WriteTar(shard, {{"a.png", std::string(600, 'A')}, {"a.seg.png", std::string(600, 'a')},
                   {"b.png", std::string(600, 'B')}, {"b.seg.png", std::string(600, 'b')}});
  const std::vector<ManifestRow> rows = Index(shard);
  ASSERT_EQ(rows.size(), 2u);
  std::string bytes;
  ASSERT_TRUE(ReadMemberBytes(rows[0].image_path, &bytes).ok());
  EXPECT_EQ(bytes, std::string(600, 'A'));
  const int64_t mtime = MtimeNs(shard);
  CloseShards();
  WriteTar(shard, {{"b.png", std::string(600, 'B')}, {"b.seg.png", std::string(600, 'b')},
                   {"a.png", std::string(600, 'A')}, {"a.seg.png", std::string(600, 'a')}});
  SetMtimeNs(shard, mtime);  // Even with its time put back, as a copy preserving times would.
  for (const ManifestRow& row : rows) {
    for (const std::string* path : {&row.image_path, &row.mask_path}) {
      absl::Status s = ReadMemberBytes(*path, &bytes);
      ASSERT_FALSE(s.ok()) << DisplayPath(*path);
      EXPECT_NE(s.message().find("the header before its data names another member"), std::string::npos) << s;
      EXPECT_NE(s.message().find("is not the one indexed"), std::string::npos) << s;
    }
  }
}

TEST_F(TarMembersTest, LongAndNonAsciiNamesOfEveryWriterReadBackAsTheirOwnMembers) {
  // Names past the header's 100 bytes (kept whole in a GNU long-name or pax header, split into
  // ustar's prefix, or cut to 100 bytes in the header before the data) and a non-ASCII character
  // (which pax writers may write as '?' there): the header check must accept each member's own.
  const std::string dir = "./" + std::string(120, 'd') + "/caf\xc3\xa9";
  const Members members = {{dir + "/k0.png", "image 0"}, {dir + "/k0.seg.png", "mask 0"},
                           {dir + "/k\xc3\xa91.png", "image 1"}, {dir + "/k\xc3\xa91.seg.png", "mask 1"}};
  for (const int format : {ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FORMAT_TAR_PAX_INTERCHANGE,
                           ARCHIVE_FORMAT_TAR_GNUTAR, ARCHIVE_FORMAT_TAR_USTAR}) {
    SCOPED_TRACE(format);
    const std::string shard = absl::StrCat(dir_, "/s", format, ".tar");
    WriteTar(shard, members, false, format);
    const std::vector<ManifestRow> rows = Index(shard);
    ASSERT_EQ(rows.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      std::string bytes;
      ASSERT_TRUE(ReadMemberBytes(rows[i].image_path, &bytes).ok()) << ReadMemberBytes(rows[i].image_path, &bytes);
      EXPECT_EQ(bytes, absl::StrCat("image ", i));
      ASSERT_TRUE(ReadMemberBytes(rows[i].mask_path, &bytes).ok());
      EXPECT_EQ(bytes, absl::StrCat("mask ", i));
    }
  }
}

TEST_F(TarMembersTest, AShardChangedAfterItWasIndexedFailsItsRowsNamingTheChange) {
  const std::string shard = dir_ + "/s.tar";
  WriteTar(shard, {{"a.png", "AAAA"}, {"a.seg.png", "aaaa"}});
  const std::vector<ManifestRow> rows = Index(shard);
  ASSERT_EQ(rows.size(), 1u);
  std::string bytes;
  ASSERT_TRUE(ReadMemberBytes(rows[0].mask_path, &bytes).ok());  // Opened and kept in the cache.
  WriteTar(shard, {{"a.png", "AAAA"}, {"a.seg.png", "aaaa"}, {"z.png", "z"}, {"z.seg.png", "z"}});
  SetMtimeNs(shard, MtimeNs(shard) + 5000000000);
  absl::Status s = ReadMemberBytes(rows[0].image_path, &bytes);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(absl::StrCat("shard '", shard, "' changed after the job was submitted")),
            std::string::npos) << s;
  EXPECT_NE(s.message().find("modified"), std::string::npos) << s;
}

TEST_F(TarMembersTest, DeclaredSizesAreHeldToTheLimitBeforeAnythingIsRead) {
  const std::string shard = dir_ + "/s.tar";
  WriteTar(shard, {{"a.png", std::string(5000, 'A')}, {"a.seg.png", "a"}});
  const std::vector<ManifestRow> rows = Index(shard);
  std::string bytes;
  absl::Status s = ReadMemberBytes(rows[0].image_path, &bytes, 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("declares 5000 bytes, more than the limit of 4096"), std::string::npos) << s;
  EXPECT_TRUE(bytes.empty());
  // A forged locator claiming 6 GiB is refused the same way, whatever the budget.
  const std::string forged = MemberLocator(shard, 512, int64_t{6} << 30, false, "a.png");
  s = ReadMemberBytes(forged, &bytes);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
}

TEST_F(TarMembersTest, ScratchPastItsLimitFailsTheRowAndEveryShardClosesOnRequest) {
  const std::string shard = dir_ + "/s.tar.gz";
  WriteTar(shard, {{"a.png", std::string(300000, 'A')}, {"a.seg.png", "a"}, {"b.png", "B"}, {"b.seg.png", "b"}},
           true);
  const std::vector<ManifestRow> rows = Index(shard);
  ASSERT_EQ(rows.size(), 2u);
  SetScratchLimit(100000);
  std::string bytes;
  absl::Status s = ReadMemberBytes(rows[1].image_path, &bytes);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("more than the scratch limit of 100000"), std::string::npos) << s;
  SetScratchLimit(1 << 20);
  ASSERT_TRUE(ReadMemberBytes(rows[1].image_path, &bytes).ok());
  EXPECT_EQ(bytes, "B");
  ASSERT_TRUE(ReadMemberBytes(rows[0].image_path, &bytes).ok());
  EXPECT_EQ(bytes, std::string(300000, 'A'));
  EXPECT_GT(ScratchBytesHeld(), 300000);
  CloseShards();
  EXPECT_EQ(OpenShardCount(), 0);
  EXPECT_EQ(ScratchBytesHeld(), 0);
}

TEST_F(TarMembersTest, AScratchCopyThatCouldNotBeWrittenWholeIsNeverUsed) {
  const std::string shard = dir_ + "/s.tar.gz";
  WriteTar(shard, {{"a.png", std::string(3 << 20, 'A')}, {"a.seg.png", "a"}, {"b.png", "B"}, {"b.seg.png", "b"}},
           true);
  const std::vector<ManifestRow> rows = Index(shard);
  ASSERT_EQ(rows.size(), 2u);
  // Files of this process may not grow past 1 MiB: the scratch copy's second chunk fails to write.
  rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 1 << 20;
  std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string bytes;
  absl::Status s = ReadMemberBytes(rows[1].image_path, &bytes);
  absl::Status again = ReadMemberBytes(rows[1].mask_path, &bytes);
  setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("scratch write failed: shard '"), std::string::npos) << s;
  EXPECT_NE(s.message().find("free in '"), std::string::npos) << s;
  ASSERT_FALSE(again.ok());  // Never from the broken copy (it would be 16 chunks off).
  // With room again, a fresh copy reads right.
  ASSERT_TRUE(ReadMemberBytes(rows[1].image_path, &bytes).ok());
  EXPECT_EQ(bytes, "B");
  ASSERT_TRUE(ReadMemberBytes(rows[0].image_path, &bytes).ok());
  EXPECT_EQ(bytes.size(), 3u << 20);
}

}  // namespace
}  // namespace tally
