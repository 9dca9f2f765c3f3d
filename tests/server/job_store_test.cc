#include "server/job_store.h"

#include <stdlib.h>

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace tally {
namespace {

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/job_store_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    auto store = JobStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)system(cmd.c_str());
  }
  std::string dir_;
  std::unique_ptr<JobStore> store_;
};

v1::ImageResult Result(int64_t index) {
  v1::ImageResult r;
  r.set_index(index);
  return r;
}

// Shards commit their rows' thumbnails in any order; the table keeps the job's `keep` lowest
// (dice, index) per class, and rows committed before keep their first result's thumbnails.
TEST_F(JobStoreTest, ThumbnailsKeepTheLowestPerClassWhateverTheCommitOrder) {
  std::mt19937 rng(3);
  std::vector<StoredThumbnail> all;
  for (int64_t i = 0; i < 60; ++i) {
    for (int c = 1; c <= 2; ++c) {
      StoredThumbnail t;
      t.index = i;
      t.class_index = c;
      t.dice = std::uniform_int_distribution<int>(0, 10)(rng) / 10.0;  // Ties, broken by index.
      t.jpeg = "jpeg" + std::to_string(i);
      all.push_back(t);
    }
  }
  std::vector<std::pair<double, int64_t>> want[3];
  for (const StoredThumbnail& t : all) want[t.class_index].emplace_back(t.dice, t.index);
  for (auto& w : want) {
    std::sort(w.begin(), w.end());
    if (w.size() > 4) w.resize(4);
  }
  for (int trial = 0; trial < 3; ++trial) {
    const std::string job = "job" + std::to_string(trial);
    std::vector<int64_t> shards = {0, 1, 2, 3, 4, 5};  // 10 rows each.
    std::shuffle(shards.begin(), shards.end(), rng);
    for (int64_t s : shards) {
      std::vector<v1::ImageResult> results;
      std::vector<StoredThumbnail> thumbnails;
      for (int64_t i = s * 10; i < s * 10 + 10; ++i) results.push_back(Result(i));
      for (const StoredThumbnail& t : all) {
        if (t.index / 10 == s) thumbnails.push_back(t);
      }
      std::vector<bool> new_rows;
      ASSERT_TRUE(store_->CommitResults(job, "w", results, 1.0, &new_rows, thumbnails, 4).ok());
    }
    // A second report of a committed row changes nothing.
    StoredThumbnail late;
    late.index = 7;
    late.class_index = 1;
    late.dice = -1;
    late.jpeg = "late";
    std::vector<bool> new_rows;
    ASSERT_TRUE(store_->CommitResults(job, "w", {Result(7)}, 2.0, &new_rows, {late}, 4).ok());
    EXPECT_FALSE(new_rows[0]);
    auto got = store_->ReadThumbnails(job);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<std::pair<double, int64_t>> have[3];
    for (const StoredThumbnail& t : *got) {
      have[t.class_index].emplace_back(t.dice, t.index);
      EXPECT_EQ(t.jpeg, "jpeg" + std::to_string(t.index));
    }
    for (int c = 1; c <= 2; ++c) {
      std::sort(have[c].begin(), have[c].end());
      EXPECT_EQ(have[c], want[c]) << "trial " << trial << " class " << c;
    }
  }
  ASSERT_TRUE(store_->DeleteJob("job0").ok());
  auto gone = store_->ReadThumbnails("job0");
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->empty());
}

}  // namespace
}  // namespace tally
