#include "server/store/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/store/job_store_internal.h"
#include "server/store/sharding.h"

namespace tally {
namespace {

using store_internal::BlockCache;
using store_internal::DecodeBlock;
using store_internal::FindInBlock;
using store_internal::kRowBlock;
using store_internal::RowsInBlocks;
using store_internal::SqlError;
using store_internal::Stmt;


constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, spec BLOB NOT NULL, state INTEGER NOT NULL, error TEXT NOT NULL,
  images_total INTEGER NOT NULL, shard_size INTEGER NOT NULL, num_classes INTEGER NOT NULL,
  created REAL NOT NULL, started REAL NOT NULL, finished REAL NOT NULL, last_result REAL NOT NULL,
  summary TEXT NOT NULL DEFAULT '', owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS manifest_rows(
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, line INTEGER NOT NULL, id TEXT NOT NULL,
  image TEXT NOT NULL, mask TEXT NOT NULL, image_path TEXT NOT NULL, mask_path TEXT NOT NULL,
  error TEXT NOT NULL, prediction TEXT NOT NULL DEFAULT '', prediction_path TEXT NOT NULL DEFAULT '',
  columns BLOB NOT NULL DEFAULT x'',
  PRIMARY KEY(job_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS manifest_blocks(
  job_id TEXT NOT NULL, block INTEGER NOT NULL, data BLOB NOT NULL,
  PRIMARY KEY(job_id, block));
CREATE TABLE IF NOT EXISTS shards(
  job_id TEXT NOT NULL, shard_id INTEGER NOT NULL, state INTEGER NOT NULL, attempts INTEGER NOT NULL,
  PRIMARY KEY(job_id, shard_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS results(
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, worker_id TEXT NOT NULL, error TEXT NOT NULL,
  payload BLOB NOT NULL, committed REAL NOT NULL, PRIMARY KEY(job_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS submissions(job_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS row_detections(
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(job_id, idx));
CREATE TABLE IF NOT EXISTS detection_spans(
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,
  PRIMARY KEY(job_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS thumbnails(
  job_id TEXT NOT NULL, cls INTEGER NOT NULL, idx INTEGER NOT NULL, dice REAL NOT NULL, slice INTEGER NOT NULL,
  jpeg BLOB NOT NULL, PRIMARY KEY(job_id, cls, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_workers(
  job_id TEXT NOT NULL, worker_id TEXT NOT NULL, name TEXT NOT NULL, device TEXT NOT NULL,
  first_lease REAL NOT NULL, last_result REAL NOT NULL, stats BLOB NOT NULL,
  PRIMARY KEY(job_id, worker_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS service_state(key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
)sql";

// The schema's version, kept in the database (PRAGMA user_version). 0: a new file, or a database
// from before versions were kept; both are brought to this schema by creating what is missing
// (the statements above) and adding the columns below. A database of a newer version than this
// is refused: it was written by a newer tallyd, and this one could misread it. A change of the
// schema bumps this number and, where the statements above do not suffice, adds a step to
// MigrateSchema (docs/operations.md "Operating tallyd": backups and upgrades).
// 3: manifest_blocks (rows of manifest-order jobs, kRowBlock a record).
// 4: service_state (what one tallyd hands to the next across a restart: v1::Handoff).
constexpr int kSchemaVersion = 4;

// Columns added after the first schema, with their definitions (the schema above has them all).
struct ColumnMigration {
  const char* table;
  const char* column;
  const char* definition;
};
constexpr ColumnMigration kColumnMigrations[] = {
    {"jobs", "summary", "TEXT NOT NULL DEFAULT ''"},
    {"jobs", "owner", "TEXT NOT NULL DEFAULT ''"},
    {"manifest_rows", "prediction", "TEXT NOT NULL DEFAULT ''"},
    {"manifest_rows", "prediction_path", "TEXT NOT NULL DEFAULT ''"},
    {"manifest_rows", "columns", "BLOB NOT NULL DEFAULT x''"},
};

absl::StatusOr<bool> HasColumn(sqlite3* db, const char* table, const char* column) {
  Stmt q(db, absl::StrCat("SELECT name FROM pragma_table_info('", table, "')").c_str());
  RETURN_IF_ERROR(q.status());
  bool found = false;
  absl::Status s;
  while (q.Step(&s)) found |= q.Text(0) == column;
  RETURN_IF_ERROR(s);
  return found;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open database '", path, "': ", msg));
  }
  sqlite3_busy_timeout(db, 10000);
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  absl::ReleasableMutexLock lock(&store->mu_);
  int64_t version = 0;
  bool existing = false;
  {
    Stmt q(store->db_, "PRAGMA user_version");
    RETURN_IF_ERROR(q.status());
    absl::Status s;
    if (q.Step(&s)) version = q.Int(0);
    RETURN_IF_ERROR(s);
    Stmt t(store->db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'");
    RETURN_IF_ERROR(t.status());
    if (t.Step(&s)) existing = t.Int(0) > 0;
    RETURN_IF_ERROR(s);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database '", path, "' has schema version ", version, ", newer than this tallyd's (", kSchemaVersion,
        "): it was written by a newer tallyd; run that one, or restore the backup taken before the upgrade"));
  }
  // WAL + synchronous=NORMAL: a committed transaction survives the death of any process; only a
  // power loss can roll back the last transactions (docs/how-it-works.md "Durability").
  // Deleted jobs give their pages back (PRAGMA incremental_vacuum); must precede the first table.
  RETURN_IF_ERROR(store->Exec("PRAGMA auto_vacuum=INCREMENTAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(store->Exec(kSchema));
  // Databases made before a column existed get it.
  for (const ColumnMigration& m : kColumnMigrations) {
    ASSIGN_OR_RETURN(const bool present, HasColumn(store->db_, m.table, m.column));
    if (!present) {
      RETURN_IF_ERROR(store->Exec(absl::StrCat("ALTER TABLE ", m.table, " ADD COLUMN ", m.column, " ", m.definition).c_str()));
    }
  }
  if (version != kSchemaVersion) {
    RETURN_IF_ERROR(store->Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str()));
    if (existing) Log("database ", path, ": schema version ", version, " migrated to ", kSchemaVersion);
  }
  std::vector<std::string> abandoned;
  {
    Stmt q(store->db_, "SELECT job_id FROM submissions");
    RETURN_IF_ERROR(q.status());
    absl::Status s;
    while (q.Step(&s)) abandoned.push_back(q.Text(0));
    RETURN_IF_ERROR(s);
  }
  lock.Release();
  for (const std::string& job_id : abandoned) RETURN_IF_ERROR(store->DeleteJob(job_id));
  return store;
}

int JobStore::SchemaVersion() { return kSchemaVersion; }

JobStore::~JobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    return SqlError(db_, sql);
  }
  return absl::OkStatus();
}

absl::Status JobStore::InTransaction(const std::function<absl::Status(sqlite3* db)>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = body(db_);
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) Exec("ROLLBACK").IgnoreError();
  return s;
}

absl::Status JobStore::BeginSubmission(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt ins(db_, "INSERT OR IGNORE INTO submissions VALUES(?)");
  RETURN_IF_ERROR(ins.status());
  ins.Bind(1, job_id);
  return ins.Run();
}

absl::Status JobStore::CreateJob(const JobRecord& record) {
  absl::MutexLock lock(&mu_);
  const v1::Job& job = record.job;
  return InTransaction([&](sqlite3* db) -> absl::Status {
    Stmt ins(db, "INSERT INTO jobs VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)");
    RETURN_IF_ERROR(ins.status());
    ins.Bind(1, job.job_id()).BindBlob(2, job.spec().SerializeAsString()).Bind(3, int64_t{job.state()});
    ins.Bind(4, job.error()).Bind(5, job.images_total()).Bind(6, record.shard_size);
    ins.Bind(7, int64_t{job.num_classes()}).Bind(8, job.created_unix()).Bind(9, job.started_unix());
    ins.Bind(10, job.finished_unix()).Bind(11, record.last_result_unix).Bind(12, job.summary());
    ins.Bind(13, job.owner());
    RETURN_IF_ERROR(ins.Run());
    Stmt shard(db, "INSERT INTO shards VALUES(?,?,0,0)");
    RETURN_IF_ERROR(shard.status());
    const int64_t n = job.images_total();
    const int64_t num_shards = static_cast<int64_t>(JobShards(job.spec(), n, record.shard_size).size());
    for (int64_t s = 0; s < num_shards; ++s) {
      shard.Bind(1, job.job_id()).Bind(2, s);
      RETURN_IF_ERROR(shard.Run());
    }
    Stmt done(db, "DELETE FROM submissions WHERE job_id=?");
    RETURN_IF_ERROR(done.status());
    done.Bind(1, job.job_id());
    return done.Run();
  });
}

absl::Status JobStore::DeleteInBatches(const char* table, const std::string& job_id) {
  // Tables keyed by (job_id, idx) can hold millions of rows of a job: delete them in bounded
  // transactions, so that other jobs' commits are not held up behind one large deletion.
  const std::string name = table;
  const char* key = name == "manifest_rows" || name == "results" || name == "row_detections" ||
                            name == "detection_spans"
                        ? "idx"
                    : name == "manifest_blocks"                                            ? "block"
                                                                                           : nullptr;
  const bool by_index = key != nullptr;
  const std::string sql = by_index ? absl::StrCat("DELETE FROM ", table, " WHERE job_id=?1 AND ", key, " IN (SELECT ",
                                                  key, " FROM ", table, " WHERE job_id=?1 ORDER BY ", key,
                                                  " LIMIT 20000)")
                                   : absl::StrCat("DELETE FROM ", table, " WHERE job_id=?1");
  while (true) {
    absl::MutexLock lock(&mu_);
    int changes = 0;
    RETURN_IF_ERROR(InTransaction([&](sqlite3* db) -> absl::Status {
      Stmt del(db, sql.c_str());
      RETURN_IF_ERROR(del.status());
      del.Bind(1, job_id);
      RETURN_IF_ERROR(del.Run());
      changes = sqlite3_changes(db);
      return absl::OkStatus();
    }));
    if (!by_index || changes == 0) return absl::OkStatus();
  }
}

absl::Status JobStore::DeleteJob(const std::string& job_id) {
  for (const char* table :
       {"results", "manifest_rows", "manifest_blocks", "row_detections", "detection_spans", "shards", "job_workers",
        "thumbnails", "jobs", "submissions"}) {
    RETURN_IF_ERROR(DeleteInBatches(table, job_id));
  }
  if (const std::string file = DetectionsPath(job_id); !file.empty() && unlink(file.c_str()) != 0 && errno != ENOENT) {
    Log("cannot delete the detections file '", file, "' of job ", job_id, ": ", std::strerror(errno));
  }
  absl::MutexLock lock(&mu_);
  blocked_.erase(job_id);
  RETURN_IF_ERROR(Exec("PRAGMA incremental_vacuum"));
  return Exec("PRAGMA wal_checkpoint(TRUNCATE)");
}

absl::Status JobStore::UpdateJob(const JobRecord& record) {
  absl::MutexLock lock(&mu_);
  const v1::Job& job = record.job;
  Stmt up(db_,
          "UPDATE jobs SET state=?, error=?, num_classes=?, started=?, finished=?, last_result=?, summary=? "
          "WHERE job_id=?");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, int64_t{job.state()}).Bind(2, job.error()).Bind(3, int64_t{job.num_classes()});
  up.Bind(4, job.started_unix()).Bind(5, job.finished_unix()).Bind(6, record.last_result_unix).Bind(7, job.summary());
  up.Bind(8, job.job_id());
  return up.Run();
}

absl::Status JobStore::UpdateSpec(const std::string& job_id, const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  Stmt up(db_, "UPDATE jobs SET spec=? WHERE job_id=?");
  RETURN_IF_ERROR(up.status());
  up.BindBlob(1, spec.SerializeAsString()).Bind(2, job_id);
  return up.Run();
}

absl::StatusOr<std::vector<JobRecord>> JobStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT job_id, spec, state, error, images_total, shard_size, num_classes, created, started, finished, "
         "last_result, summary, owner FROM jobs ORDER BY created");
  RETURN_IF_ERROR(q.status());
  std::vector<JobRecord> out;
  absl::Status s;
  while (q.Step(&s)) {
    JobRecord r;
    r.job.set_job_id(q.Text(0));
    if (!r.job.mutable_spec()->ParseFromString(q.Blob(1))) {
      return absl::DataLossError(absl::StrCat("database: job ", r.job.job_id(), " has an unreadable spec"));
    }
    r.job.set_state(static_cast<v1::JobState>(q.Int(2)));
    r.job.set_error(q.Text(3));
    r.job.set_images_total(q.Int(4));
    r.shard_size = q.Int(5);
    r.job.set_num_classes(static_cast<int32_t>(q.Int(6)));
    r.job.set_created_unix(q.Double(7));
    r.job.set_started_unix(q.Double(8));
    r.job.set_finished_unix(q.Double(9));
    r.last_result_unix = q.Double(10);
    r.job.set_summary(q.Text(11));
    r.job.set_owner(q.Text(12));
    out.push_back(std::move(r));
  }
  RETURN_IF_ERROR(s);
  // Progress counters come from the results themselves.
  Stmt counts(db_, "SELECT SUM(error = ''), SUM(error != '') FROM results WHERE job_id=?");
  RETURN_IF_ERROR(counts.status());
  for (JobRecord& r : out) {
    counts.Bind(1, r.job.job_id());
    if (counts.Step(&s)) {
      r.job.set_images_evaluated(counts.Int(0));
      r.job.set_images_failed(counts.Int(1));
    }
    counts.Reset();
    RETURN_IF_ERROR(s);
  }
  return out;
}

namespace {

// A row's names from columns first..first+5 of a statement: id, image, mask, prediction, mask_path,
// prediction_path (as kNameColumns lists them).
constexpr const char* kNameColumns = "id, image, mask, prediction, mask_path, prediction_path, columns";
RowNames NamesFromColumns(Stmt& q, int first) {
  RowNames names{q.Text(first),     q.Text(first + 1), q.Text(first + 2),
                 q.Text(first + 3), q.Text(first + 4), q.Text(first + 5), {}};
  // An unreadable blob (never written so) leaves the row without columns: its groups show it as "".
  store_internal::RowColumnsFromBlob(q.Blob(first + 6), &names.columns).IgnoreError();
  return names;
}

// CommitResults' names of the newly inserted rows, from the job's blocks or rows.
absl::Status ReadNewRowNames(sqlite3* db, const std::string& job_id, bool blocked,
                             const std::vector<v1::ImageResult>& results, const std::vector<bool>& new_rows,
                             std::vector<RowNames>* names) {
  if (blocked) {
    BlockCache cache(db, job_id);
    for (size_t i = 0; i < results.size(); ++i) {
      if (!new_rows[i]) continue;
      ASSIGN_OR_RETURN(const ManifestRow* m, cache.Find(results[i].index()));
      if (m != nullptr) (*names)[i] = NamesOf(*m);
    }
    return absl::OkStatus();
  }
  Stmt q(db, absl::StrCat("SELECT ", kNameColumns, " FROM manifest_rows WHERE job_id=? AND idx=?").c_str());
  RETURN_IF_ERROR(q.status());
  for (size_t i = 0; i < results.size(); ++i) {
    if (!new_rows[i]) continue;
    absl::Status step;
    q.Bind(1, job_id).Bind(2, results[i].index());
    if (q.Step(&step)) (*names)[i] = NamesFromColumns(q, 0);
    q.Reset();
    RETURN_IF_ERROR(step);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status JobStore::CommitResults(const std::string& job_id, const std::string& worker_id,
                                     const std::vector<v1::ImageResult>& results, double now,
                                     std::vector<bool>* new_rows, const std::vector<StoredThumbnail>& thumbnails,
                                     int keep_thumbnails, std::vector<RowNames>* names) {
  absl::MutexLock lock(&mu_);
  new_rows->assign(results.size(), false);
  if (names != nullptr) names->assign(results.size(), RowNames());
  bool blocked = false;
  if (names != nullptr) {
    ASSIGN_OR_RETURN(blocked, BlockedLocked(job_id));
  }
  absl::Status s = InTransaction([&](sqlite3* db) -> absl::Status {
    Stmt ins(db, "INSERT OR IGNORE INTO results VALUES(?,?,?,?,?,?)");
    RETURN_IF_ERROR(ins.status());
    std::string payload;
    std::set<int64_t> inserted;
    for (size_t i = 0; i < results.size(); ++i) {
      const v1::ImageResult& r = results[i];
      r.SerializeToString(&payload);
      ins.Bind(1, job_id).Bind(2, r.index()).Bind(3, worker_id).Bind(4, r.error()).BindBlob(5, payload).Bind(6, now);
      RETURN_IF_ERROR(ins.Run());
      (*new_rows)[i] = sqlite3_changes(db) > 0;
      if ((*new_rows)[i]) inserted.insert(r.index());
    }
    if (names != nullptr) RETURN_IF_ERROR(ReadNewRowNames(db, job_id, blocked, results, *new_rows, names));
    std::set<int> classes;
    if (thumbnails.empty()) return absl::OkStatus();
    Stmt th(db, "INSERT OR IGNORE INTO thumbnails VALUES(?,?,?,?,?,?)");
    RETURN_IF_ERROR(th.status());
    for (const StoredThumbnail& t : thumbnails) {
      if (inserted.count(t.index) == 0 || !std::isfinite(t.dice)) continue;
      th.Bind(1, job_id).Bind(2, int64_t{t.class_index}).Bind(3, t.index).Bind(4, t.dice).Bind(5, int64_t{t.slice});
      th.BindBlob(6, t.jpeg);
      RETURN_IF_ERROR(th.Run());
      classes.insert(t.class_index);
    }
    for (int c : classes) {
      Stmt prune(db,
                 "DELETE FROM thumbnails WHERE job_id=?1 AND cls=?2 AND idx NOT IN (SELECT idx FROM thumbnails "
                 "WHERE job_id=?1 AND cls=?2 ORDER BY dice, idx LIMIT ?3)");
      RETURN_IF_ERROR(prune.status());
      prune.Bind(1, job_id).Bind(2, int64_t{c}).Bind(3, int64_t{keep_thumbnails});
      RETURN_IF_ERROR(prune.Run());
    }
    return absl::OkStatus();
  });
  if (!s.ok()) new_rows->assign(results.size(), false);
  return s;
}

absl::StatusOr<std::vector<StoredThumbnail>> JobStore::ReadThumbnails(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT cls, idx, dice, slice, jpeg FROM thumbnails WHERE job_id=? ORDER BY cls, idx");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  std::vector<StoredThumbnail> out;
  absl::Status s;
  while (q.Step(&s)) {
    StoredThumbnail t;
    t.class_index = static_cast<int>(q.Int(0));
    t.index = q.Int(1);
    t.dice = q.Double(2);
    t.slice = static_cast<int>(q.Int(3));
    t.jpeg = q.Blob(4);
    out.push_back(std::move(t));
  }
  RETURN_IF_ERROR(s);
  return out;
}

absl::Status JobStore::SetShardState(const std::string& job_id, int64_t shard_id, ShardState state, int attempts) {
  absl::MutexLock lock(&mu_);
  Stmt up(db_, "UPDATE shards SET state=?, attempts=? WHERE job_id=? AND shard_id=?");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, static_cast<int64_t>(state)).Bind(2, int64_t{attempts}).Bind(3, job_id).Bind(4, shard_id);
  return up.Run();
}

absl::StatusOr<std::vector<ShardState>> JobStore::ReadShardStates(const std::string& job_id, int64_t num_shards) {
  absl::MutexLock lock(&mu_);
  std::vector<ShardState> out(num_shards, ShardState::kPending);
  Stmt q(db_, "SELECT shard_id, state FROM shards WHERE job_id=?");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  absl::Status s;
  while (q.Step(&s)) {
    int64_t id = q.Int(0);
    if (id >= 0 && id < num_shards) out[id] = static_cast<ShardState>(q.Int(1));
  }
  RETURN_IF_ERROR(s);
  return out;
}

absl::StatusOr<std::vector<int64_t>> JobStore::ReadResultIndices(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT idx FROM results WHERE job_id=? ORDER BY idx");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  std::vector<int64_t> out;
  absl::Status s;
  while (q.Step(&s)) out.push_back(q.Int(0));
  RETURN_IF_ERROR(s);
  return out;
}

absl::Status JobStore::PutState(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  Stmt up(db_, "INSERT INTO service_state VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, key).BindBlob(2, value);
  return up.Run();
}

absl::StatusOr<std::optional<std::string>> JobStore::GetState(const std::string& key) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT value FROM service_state WHERE key=?");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, key);
  absl::Status s;
  std::optional<std::string> out;
  if (q.Step(&s)) out = q.Blob(0);
  RETURN_IF_ERROR(s);
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> JobStore::ListState(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  // Keys in [prefix, prefix + 0xFF...): a range scan of the primary key, no LIKE escaping.
  Stmt q(db_, "SELECT key, value FROM service_state WHERE key >= ? AND substr(key, 1, ?) = ? ORDER BY key");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, prefix).Bind(2, static_cast<int64_t>(prefix.size())).Bind(3, prefix);
  absl::Status s;
  std::vector<std::pair<std::string, std::string>> out;
  while (q.Step(&s)) out.emplace_back(q.Text(0), q.Blob(1));
  RETURN_IF_ERROR(s);
  return out;
}

absl::Status JobStore::DeleteState(const std::string& key) {
  absl::MutexLock lock(&mu_);
  Stmt del(db_, "DELETE FROM service_state WHERE key=?");
  RETURN_IF_ERROR(del.status());
  del.Bind(1, key);
  return del.Run();
}

absl::Status JobStore::UpsertWorker(const std::string& job_id, const WorkerRecord& w) {
  absl::MutexLock lock(&mu_);
  Stmt up(db_,
          "INSERT INTO job_workers VALUES(?,?,?,?,?,?,?) ON CONFLICT(job_id, worker_id) DO UPDATE SET "
          "last_result=excluded.last_result, stats=excluded.stats");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, job_id).Bind(2, w.worker_id).Bind(3, w.name).Bind(4, w.device).Bind(5, w.first_lease_unix);
  up.Bind(6, w.last_result_unix).BindBlob(7, w.stats.SerializeAsString());
  return up.Run();
}

absl::StatusOr<std::vector<WorkerRecord>> JobStore::ReadWorkers(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT w.worker_id, w.name, w.device, w.first_lease, w.last_result, w.stats, "
         "(SELECT COUNT(*) FROM results r WHERE r.job_id=w.job_id AND r.worker_id=w.worker_id) "
         "FROM job_workers w WHERE w.job_id=? ORDER BY w.first_lease, w.worker_id");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  std::vector<WorkerRecord> out;
  absl::Status s;
  while (q.Step(&s)) {
    WorkerRecord w;
    w.worker_id = q.Text(0);
    w.name = q.Text(1);
    w.device = q.Text(2);
    w.first_lease_unix = q.Double(3);
    w.last_result_unix = q.Double(4);
    w.stats.ParseFromString(q.Blob(5));
    w.images = q.Int(6);
    out.push_back(std::move(w));
  }
  RETURN_IF_ERROR(s);
  return out;
}

namespace {

// ForEachResult of a job whose rows are in blocks: the results in index order merged with the
// blocks in block order (each decoded once).
absl::Status ForEachBlockedResult(sqlite3* reader, const std::string& job_id, const JobStore::ResultFn& fn) {
  Stmt results(reader, "SELECT idx, payload FROM results WHERE job_id=? ORDER BY idx");
  RETURN_IF_ERROR(results.status());
  Stmt blocks(reader, "SELECT block, data FROM manifest_blocks WHERE job_id=? ORDER BY block");
  RETURN_IF_ERROR(blocks.status());
  results.Bind(1, job_id);
  blocks.Bind(1, job_id);
  absl::Status s, bs;
  int64_t current = -1;  // The block decoded into `rows`.
  bool blocks_left = true;
  std::vector<ManifestRow> rows;
  v1::ImageResult r;
  while (results.Step(&s)) {
    const int64_t index = results.Int(0);
    const int64_t block = index / kRowBlock;
    while (blocks_left && current < block) {
      blocks_left = blocks.Step(&bs);
      RETURN_IF_ERROR(bs);
      if (!blocks_left) break;
      current = blocks.Int(0);
      if (current == block) RETURN_IF_ERROR(DecodeBlock(blocks.Blob(1), &rows));
    }
    const ManifestRow* m = current == block ? FindInBlock(rows, index) : nullptr;
    if (m == nullptr) continue;  // As the join leaves out a result without its manifest row.
    if (!r.ParseFromString(results.Blob(1))) return absl::DataLossError("database: unreadable result payload");
    RETURN_IF_ERROR(fn(r, NamesOf(*m)));
  }
  return s;
}

}  // namespace

absl::Status JobStore::ForEachResult(const std::string& job_id, const ResultFn& fn) {
  sqlite3* reader = nullptr;
  if (sqlite3_open_v2(path_.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string msg = reader ? sqlite3_errmsg(reader) : "out of memory";
    sqlite3_close(reader);
    return absl::UnavailableError(absl::StrCat("cannot open database '", path_, "' for reading: ", msg));
  }
  sqlite3_busy_timeout(reader, 10000);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> closer(reader, sqlite3_close);
  ASSIGN_OR_RETURN(const bool blocked, RowsInBlocks(reader, job_id));
  if (blocked) return ForEachBlockedResult(reader, job_id, fn);
  Stmt q(reader,
         "SELECT r.payload, m.id, m.image, m.mask, m.prediction, m.mask_path, m.prediction_path, m.columns "
         "FROM results r JOIN manifest_rows m "
         "ON m.job_id = r.job_id AND m.idx = r.idx WHERE r.job_id=? ORDER BY r.idx");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  absl::Status s;
  v1::ImageResult r;
  while (q.Step(&s)) {
    if (!r.ParseFromString(q.Blob(0))) return absl::DataLossError("database: unreadable result payload");
    RETURN_IF_ERROR(fn(r, NamesFromColumns(q, 1)));
  }
  return s;
}

}  // namespace tally
