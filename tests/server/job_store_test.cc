#include "server/store/job_store.h"

#include <algorithm>
#include <random>

#include <sqlite3.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/server/store_fixture.h"

namespace tally {
namespace {

class JobStoreTest : public StoreFixture {
 protected:
  JobStoreTest() : StoreFixture("job_store_test") {}
};

v1::ImageResult Result(int64_t index) {
  v1::ImageResult r;
  r.set_index(index);
  return r;
}

// Runs `sql` on the database file at `path` with SQLite directly (no JobStore); returns the first
// column of the first row as text ("" when there is none).
std::string Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  std::string out;
  sqlite3_stmt* stmt = nullptr;
  const char* tail = sql.c_str();
  while (*tail != '\0') {
    EXPECT_EQ(sqlite3_prepare_v2(db, tail, -1, &stmt, &tail), SQLITE_OK) << sqlite3_errmsg(db) << " in " << sql;
    if (stmt == nullptr) break;
    if (sqlite3_step(stmt) == SQLITE_ROW && out.empty() && sqlite3_column_text(stmt, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return out;
}

// A database from before schema versions (the first schema: no owner, summary, prediction or
// columns columns, no thumbnails or job_workers tables) opens, keeps its job and is brought to
// the current version.
// COCO results jobs' detections live in a file beside the database: each row reads back its own
// bytes (from two batches, rows without any left empty), and DeleteJob (or, for a submission that
// never completed, the next Open) removes the file with the rest of the job.
TEST_F(JobStoreTest, DetectionsComeBackPerRowAndLeaveWithTheJob) {
  ASSERT_TRUE(store_->BeginSubmission("coco").ok());
  std::vector<ManifestRow> rows(6);
  for (int64_t i = 0; i < 6; ++i) {
    rows[i].index = i;
    if (i != 3) rows[i].coco_detections = std::string(static_cast<size_t>(100 + i * 37), static_cast<char>('a' + i));
  }
  ASSERT_TRUE(store_->InsertManifestRows("coco", {rows.begin(), rows.begin() + 4}).ok());
  ASSERT_TRUE(store_->InsertManifestRows("coco", {rows.begin() + 4, rows.end()}).ok());
  std::vector<ManifestRow> asked(6);
  for (int64_t i = 0; i < 6; ++i) asked[i].index = 5 - i;
  ASSERT_TRUE(store_->ReadDetections("coco", &asked).ok());
  for (const ManifestRow& r : asked) {
    EXPECT_EQ(r.coco_detections, rows[r.index].coco_detections) << "row " << r.index;
  }
  const std::string file = dir_ + "/state.db-detections/" + "636f636f";  // "coco" in hex.
  EXPECT_EQ(access(file.c_str(), F_OK), 0);
  ASSERT_TRUE(store_->DeleteJob("coco").ok());
  EXPECT_NE(access(file.c_str(), F_OK), 0);
  std::vector<ManifestRow> gone(1);
  gone[0].index = 1;
  ASSERT_TRUE(store_->ReadDetections("coco", &gone).ok());
  EXPECT_TRUE(gone[0].coco_detections.empty());
  // A submission that never completed is deleted at the next Open, its file with it.
  ASSERT_TRUE(store_->BeginSubmission("half").ok());
  ASSERT_TRUE(store_->InsertManifestRows("half", {rows.begin(), rows.begin() + 2}).ok());
  const std::string half = dir_ + "/state.db-detections/" + "68616c66";  // "half" in hex.
  EXPECT_EQ(access(half.c_str(), F_OK), 0);
  store_.reset();
  auto reopened = JobStore::Open(dir_ + "/state.db");
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  store_ = std::move(*reopened);
  EXPECT_NE(access(half.c_str(), F_OK), 0);
}

TEST_F(JobStoreTest, OldDatabaseIsMigratedOnOpen) {
  const std::string path = dir_ + "/old.db";
  Sql(path,
      "CREATE TABLE jobs(job_id TEXT PRIMARY KEY, spec BLOB NOT NULL, state INTEGER NOT NULL, error TEXT NOT NULL,"
      " images_total INTEGER NOT NULL, shard_size INTEGER NOT NULL, num_classes INTEGER NOT NULL,"
      " created REAL NOT NULL, started REAL NOT NULL, finished REAL NOT NULL, last_result REAL NOT NULL);"
      "CREATE TABLE manifest_rows(job_id TEXT NOT NULL, idx INTEGER NOT NULL, line INTEGER NOT NULL, id TEXT NOT NULL,"
      " image TEXT NOT NULL, mask TEXT NOT NULL, image_path TEXT NOT NULL, mask_path TEXT NOT NULL,"
      " error TEXT NOT NULL, PRIMARY KEY(job_id, idx)) WITHOUT ROWID;"
      "INSERT INTO jobs VALUES('j1', x'', 3, '', 10, 5, 2, 1.0, 2.0, 3.0, 3.0);");
  ASSERT_EQ(Sql(path, "PRAGMA user_version"), "0");
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  store->reset();
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), std::to_string(JobStore::SchemaVersion()));
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM pragma_table_info('jobs') WHERE name IN ('owner', 'summary')"), "2");
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM pragma_table_info('manifest_rows') "
                      "WHERE name IN ('prediction', 'prediction_path', 'columns')"),
            "3");
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM sqlite_master WHERE name IN ('thumbnails', 'job_workers')"), "2");
  EXPECT_EQ(Sql(path, "SELECT job_id || ':' || owner || ':' || images_total FROM jobs"), "j1::10");
  // Opening again changes nothing.
  ASSERT_TRUE(JobStore::Open(path).ok());
  EXPECT_EQ(Sql(path, "PRAGMA user_version"), std::to_string(JobStore::SchemaVersion()));
}

// A database written by a newer tallyd (a higher schema version) is refused, untouched.
TEST_F(JobStoreTest, NewerSchemaIsRefused) {
  const std::string path = dir_ + "/new.db";
  Sql(path, "CREATE TABLE future(x INTEGER); PRAGMA user_version = " + std::to_string(JobStore::SchemaVersion() + 1));
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status();
  EXPECT_NE(store.status().message().find("newer than this tallyd"), std::string::npos) << store.status();
  EXPECT_EQ(Sql(path, "SELECT count(*) FROM sqlite_master WHERE name = 'jobs'"), "0");
}

// A new database starts at the current version.
TEST_F(JobStoreTest, NewDatabaseHasTheCurrentVersion) {
  EXPECT_EQ(Sql(dir_ + "/state.db", "PRAGMA user_version"), std::to_string(JobStore::SchemaVersion()));
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


// Rows stored in blocks (manifest-order jobs) read back as rows stored one a record do: ranges,
// scattered indices, the names a commit reads, ForEachResult's names; batches that end inside a
// block are merged into it; deleting the job removes the blocks.
TEST_F(JobStoreTest, RowsInBlocksReadBackAsRowsOneARecord) {
  const int64_t n = 1000;
  const std::vector<ManifestRow> rows = MakeRows(n, [](int64_t i, ManifestRow* r) {
    r->id = "id," + std::to_string(i);
    r->image = i % 7 == 0 ? "" : "img/" + std::to_string(i) + ".png";
    r->image_path = r->image.empty() ? "" : "/d/" + r->image;
    r->error = i % 13 == 0 ? "manifest line " + std::to_string(i + 2) + ": empty 'mask' field" : "";
    if (i % 5 == 0) r->columns = {"a prompt, " + std::to_string(i), ""};
  });
  ASSERT_TRUE(store_->InsertManifestRows("flat", rows).ok());
  // Batches of 100, 300 and 600 rows: 100 and 400 fall inside blocks of 256.
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 100}, {100, 400}, {400, n}}) {
    ASSERT_TRUE(store_->InsertManifestRows("blocked", std::vector<ManifestRow>(rows.begin() + b, rows.begin() + e), true).ok());
  }
  auto same = [](const std::vector<ManifestRow>& a, const std::vector<ManifestRow>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].index != b[i].index || a[i].line != b[i].line || a[i].id != b[i].id || a[i].image != b[i].image ||
          a[i].mask != b[i].mask || a[i].image_path != b[i].image_path || a[i].mask_path != b[i].mask_path ||
          a[i].error != b[i].error || a[i].columns != b[i].columns) {
        return false;
      }
    }
    return true;
  };
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {255, 257}, {300, 301}, {990, 2000}, {5, 5}}) {
    auto x = store_->ReadRows("flat", b, e), y = store_->ReadRows("blocked", b, e);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(same(*x, *y)) << b << ".." << e;
    EXPECT_EQ(static_cast<int64_t>(y->size()), std::max<int64_t>(0, std::min(e, n) - b));
  }
  const std::vector<int64_t> scattered = {999, 0, 513, 256, 255, 77, 5000, 511};
  auto x = store_->ReadRowsAt("flat", scattered), y = store_->ReadRowsAt("blocked", scattered);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(same(*x, *y));
  EXPECT_EQ(y->size(), scattered.size() - 1);  // 5000 is no row.
  std::vector<v1::ImageResult> results;
  for (int64_t i : {3, 700, 256, 42}) results.push_back(Result(i));
  std::vector<bool> new_flat, new_blocked;
  std::vector<RowNames> names_flat, names_blocked;
  ASSERT_TRUE(store_->CommitResults("flat", "w", results, 1.0, &new_flat, {}, 0, &names_flat).ok());
  ASSERT_TRUE(store_->CommitResults("blocked", "w", results, 1.0, &new_blocked, {}, 0, &names_blocked).ok());
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(names_flat[i].id, names_blocked[i].id);
    EXPECT_EQ(names_blocked[i].id, "id," + std::to_string(results[i].index()));
    EXPECT_EQ(names_flat[i].mask_path, names_blocked[i].mask_path);
  }
  std::vector<std::string> seen_flat, seen_blocked;
  ASSERT_TRUE(store_->ForEachResult("flat", [&](const v1::ImageResult& r, const RowNames& names) {
    seen_flat.push_back(std::to_string(r.index()) + " " + names.id + " " + names.image + " " + names.mask_path);
    return absl::OkStatus();
  }).ok());
  ASSERT_TRUE(store_->ForEachResult("blocked", [&](const v1::ImageResult& r, const RowNames& names) {
    seen_blocked.push_back(std::to_string(r.index()) + " " + names.id + " " + names.image + " " + names.mask_path);
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(seen_flat, seen_blocked);
  EXPECT_EQ(seen_blocked.front(), "3 id,3 img/3.png /d/m/3.png");
  ASSERT_TRUE(store_->DeleteJob("blocked").ok());
  EXPECT_EQ(Sql(dir_ + "/state.db", "SELECT COUNT(*) FROM manifest_blocks"), "0");
  auto gone = store_->ReadRows("blocked", 0, n);
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->empty());
}

}  // namespace
}  // namespace tally
