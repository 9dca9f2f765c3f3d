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
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "server/store/sharding.h"

namespace tally {
namespace {

absl::Status SqlError(sqlite3* db, const std::string& what) {
  const int code = sqlite3_extended_errcode(db) & 0xff;
  const std::string msg = absl::StrCat("database: ", what, ": ", sqlite3_errmsg(db));
  if (code == SQLITE_FULL) return absl::ResourceExhaustedError(msg);
  if (code == SQLITE_IOERR || code == SQLITE_CANTOPEN || code == SQLITE_BUSY) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

// A prepared statement, finalised on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqlError(db_, "prepare");
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Without a copy: `v` must outlive the statement's next Run (bulk inserts).
  Stmt& BindStatic(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // Steps once: true if a row is available, false when done. Errors go to `status`.
  bool Step(absl::Status* status) {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) *status = SqlError(db_, "step");
    return false;
  }
  absl::Status Run() {
    absl::Status s;
    Step(&s);
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return s;
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(stmt_, col)) : std::string();
  }
  std::string Blob(int col) {
    const void* b = sqlite3_column_blob(stmt_, col);
    return b ? std::string(static_cast<const char*>(b), sqlite3_column_bytes(stmt_, col)) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

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
)sql";

// The schema's version, kept in the database (PRAGMA user_version). 0: a new file, or a database
// from before versions were kept; both are brought to this schema by creating what is missing
// (the statements above) and adding the columns below. A database of a newer version than this
// is refused: it was written by a newer tallyd, and this one could misread it. A change of the
// schema bumps this number and, where the statements above do not suffice, adds a step to
// MigrateSchema (README "Operating tallyd": backups and upgrades).
// 3: manifest_blocks (rows of manifest-order jobs, kRowBlock a record).
constexpr int kSchemaVersion = 3;

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
  // power loss can roll back the last transactions (README "Durability").
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

namespace {

// Manifest rows stored kRowBlock to a record (manifest_blocks): one B-tree insert and one
// statement per block instead of per row, which is what a submission of millions of rows costs.
// A rowid table (tens of KB a record: WITHOUT ROWID would copy them around its index pages).
// A block's rows: each as varints (index, line) and length-prefixed strings, in index order.
constexpr int64_t kRowBlock = 256;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(const char** p, const char* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(*(*p)++);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

void PutString(std::string* out, const std::string& v) {
  PutVarint(out, v.size());
  out->append(v);
}

bool GetString(const char** p, const char* end, std::string* v) {
  uint64_t n = 0;
  if (!GetVarint(p, end, &n) || n > static_cast<uint64_t>(end - *p)) return false;
  v->assign(*p, n);
  *p += n;
  return true;
}

// The serialized ManifestRow holding a row's extra columns and COCO fields ("" for other rows).
void ExtraBlob(const ManifestRow& r, std::string* out) {
  out->clear();
  if (r.columns.empty() && !r.has_coco_image && !r.has_coco_ann_ids) return;
  v1::ManifestRow extra;
  for (const std::string& v : r.columns) extra.add_columns(v);
  if (r.has_coco_image) {
    extra.set_has_coco_image(true);
    extra.set_coco_image_id(r.coco_image_id);
  }
  if (r.has_coco_ann_ids) {
    extra.set_has_coco_ann_ids(true);
    for (int64_t id : r.coco_ann_ids) extra.add_coco_ann_ids(id);
  }
  extra.SerializeToString(out);
}

absl::Status ApplyExtraBlob(const std::string& blob, ManifestRow* r) {
  if (blob.empty()) return absl::OkStatus();
  v1::ManifestRow extra;
  if (!extra.ParseFromString(blob)) return absl::DataLossError("manifest row " + std::to_string(r->index) + ": unreadable columns");
  r->columns.assign(extra.columns().begin(), extra.columns().end());
  r->has_coco_image = extra.has_coco_image();
  r->coco_image_id = extra.coco_image_id();
  r->has_coco_ann_ids = extra.has_coco_ann_ids();
  r->coco_ann_ids.assign(extra.coco_ann_ids().begin(), extra.coco_ann_ids().end());
  return absl::OkStatus();
}

void EncodeRow(const ManifestRow& r, std::string* out, std::string* scratch) {
  PutVarint(out, static_cast<uint64_t>(r.index));
  PutVarint(out, static_cast<uint64_t>(r.line));
  for (const std::string* f : {&r.id, &r.image, &r.mask, &r.image_path, &r.mask_path, &r.error, &r.prediction,
                               &r.prediction_path}) {
    PutString(out, *f);
  }
  ExtraBlob(r, scratch);
  PutString(out, *scratch);
}

absl::Status DecodeBlock(const std::string& data, std::vector<ManifestRow>* rows) {
  rows->clear();
  const char* p = data.data();
  const char* end = p + data.size();
  std::string extra;
  while (p < end) {
    ManifestRow r;
    uint64_t index = 0, line = 0;
    bool ok = GetVarint(&p, end, &index) && GetVarint(&p, end, &line);
    for (std::string* f : {&r.id, &r.image, &r.mask, &r.image_path, &r.mask_path, &r.error, &r.prediction,
                           &r.prediction_path, &extra}) {
      ok = ok && GetString(&p, end, f);
    }
    if (!ok) return absl::DataLossError("database: unreadable block of manifest rows");
    r.index = static_cast<int64_t>(index);
    r.line = static_cast<int64_t>(line);
    RETURN_IF_ERROR(ApplyExtraBlob(extra, &r));
    rows->push_back(std::move(r));
  }
  return absl::OkStatus();
}

// The row with `index` in a decoded block (rows in index order), or null.
const ManifestRow* FindInBlock(const std::vector<ManifestRow>& rows, int64_t index) {
  auto it = std::lower_bound(rows.begin(), rows.end(), index,
                             [](const ManifestRow& r, int64_t i) { return r.index < i; });
  return it != rows.end() && it->index == index ? &*it : nullptr;
}

// Decoded blocks of one job, read as they are asked for (point lookups of a call).
class BlockCache {
 public:
  BlockCache(sqlite3* db, const std::string& job_id)
      : q_(db, "SELECT data FROM manifest_blocks WHERE job_id=? AND block=?"), job_id_(job_id) {}
  absl::StatusOr<const ManifestRow*> Find(int64_t index) {
    RETURN_IF_ERROR(q_.status());
    const int64_t block = index / kRowBlock;
    auto it = blocks_.find(block);
    if (it == blocks_.end()) {
      std::vector<ManifestRow> rows;
      absl::Status s;
      q_.Bind(1, job_id_).Bind(2, block);
      if (q_.Step(&s)) {
        const std::string data = q_.Blob(0);
        q_.Reset();
        RETURN_IF_ERROR(DecodeBlock(data, &rows));
      } else {
        q_.Reset();
        RETURN_IF_ERROR(s);
      }
      it = blocks_.emplace(block, std::move(rows)).first;
    }
    return FindInBlock(it->second, index);
  }

 private:
  Stmt q_;
  const std::string job_id_;
  std::map<int64_t, std::vector<ManifestRow>> blocks_;
};

// Whether a job's rows are in manifest_blocks (else in manifest_rows, one record a row).
absl::StatusOr<bool> RowsInBlocks(sqlite3* db, const std::string& job_id) {
  Stmt q(db, "SELECT EXISTS(SELECT 1 FROM manifest_blocks WHERE job_id=?)");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  absl::Status s;
  const bool found = q.Step(&s) && q.Int(0) != 0;
  RETURN_IF_ERROR(s);
  return found;
}

}  // namespace

absl::StatusOr<bool> JobStore::BlockedLocked(const std::string& job_id) {
  auto it = blocked_.find(job_id);
  if (it != blocked_.end()) return it->second;
  ASSIGN_OR_RETURN(const bool blocked, RowsInBlocks(db_, job_id));
  if (blocked) blocked_[job_id] = true;  // Rows in blocks stay there; a job without rows may get some.
  return blocked;
}

absl::Status JobStore::InsertManifestRows(const std::string& job_id, const std::vector<ManifestRow>& rows,
                                          bool blocks) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(InsertDetectionsLocked(job_id, rows));
  if (blocks) {
    blocked_[job_id] = true;
    return InTransaction([&](sqlite3* db) -> absl::Status {
      Stmt read(db, "SELECT data FROM manifest_blocks WHERE job_id=? AND block=?");
      RETURN_IF_ERROR(read.status());
      Stmt write(db, "INSERT OR REPLACE INTO manifest_blocks VALUES(?,?,?)");
      RETURN_IF_ERROR(write.status());
      std::string data, scratch;
      std::vector<ManifestRow> merged;
      for (size_t i = 0; i < rows.size();) {
        const int64_t block = rows[i].index / kRowBlock;
        size_t j = i;
        while (j < rows.size() && rows[j].index / kRowBlock == block) ++j;
        data.clear();
        // A block begun by an earlier call (batches that do not end on a block): its rows first.
        absl::Status s;
        read.Bind(1, job_id).Bind(2, block);
        const bool existed = read.Step(&s);
        if (existed) data = read.Blob(0);
        read.Reset();
        RETURN_IF_ERROR(s);
        for (size_t k = i; k < j; ++k) EncodeRow(rows[k], &data, &scratch);
        if (existed) {  // Keep index order inside the block.
          RETURN_IF_ERROR(DecodeBlock(data, &merged));
          std::stable_sort(merged.begin(), merged.end(),
                           [](const ManifestRow& a, const ManifestRow& b) { return a.index < b.index; });
          data.clear();
          for (const ManifestRow& r : merged) EncodeRow(r, &data, &scratch);
        }
        write.BindStatic(1, job_id).Bind(2, block).BindBlob(3, data);
        RETURN_IF_ERROR(write.Run());
        i = j;
      }
      return absl::OkStatus();
    });
  }
  // One record a row: groups of kGroup a statement (one step inserts them all: the per-step cost of
  // the virtual machine is paid once a group), the rest one at a time; strings bound without copies.
  constexpr size_t kGroup = 64;
  constexpr const char* kInsert =
      "INSERT INTO manifest_rows(job_id, idx, line, id, image, mask, image_path, mask_path, error, prediction, "
      "prediction_path, columns) VALUES";
  constexpr const char* kValues = "(?,?,?,?,?,?,?,?,?,?,?,?)";
  return InTransaction([&](sqlite3* db) -> absl::Status {
    std::string group_sql = kInsert;
    for (size_t i = 0; i < kGroup; ++i) absl::StrAppend(&group_sql, i ? "," : "", kValues);
    Stmt group(db, group_sql.c_str());
    RETURN_IF_ERROR(group.status());
    Stmt one(db, absl::StrCat(kInsert, kValues).c_str());
    RETURN_IF_ERROR(one.status());
    std::vector<std::string> extras(kGroup);
    auto bind = [&](Stmt& st, int base, const ManifestRow& r, std::string* extra_blob) {
      st.BindStatic(base + 1, job_id).Bind(base + 2, r.index).Bind(base + 3, r.line).BindStatic(base + 4, r.id);
      st.BindStatic(base + 5, r.image).BindStatic(base + 6, r.mask).BindStatic(base + 7, r.image_path);
      st.BindStatic(base + 8, r.mask_path).BindStatic(base + 9, r.error).BindStatic(base + 10, r.prediction);
      st.BindStatic(base + 11, r.prediction_path);
      ExtraBlob(r, extra_blob);
      st.BindBlob(base + 12, *extra_blob);
    };
    size_t i = 0;
    for (; i + kGroup <= rows.size(); i += kGroup) {
      for (size_t k = 0; k < kGroup; ++k) bind(group, static_cast<int>(12 * k), rows[i + k], &extras[k]);
      RETURN_IF_ERROR(group.Run());
    }
    for (; i < rows.size(); ++i) {
      bind(one, 0, rows[i], &extras[0]);
      RETURN_IF_ERROR(one.Run());
    }
    return absl::OkStatus();
  });
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

constexpr const char* kRowColumns =
    "SELECT idx, line, id, image, mask, image_path, mask_path, error, prediction, prediction_path, columns "
    "FROM manifest_rows ";

// The manifest row at the statement's current result (kRowColumns).
absl::StatusOr<ManifestRow> RowFromStmt(Stmt& q) {
  ManifestRow r;
  r.index = q.Int(0);
  r.line = q.Int(1);
  r.id = q.Text(2);
  r.image = q.Text(3);
  r.mask = q.Text(4);
  r.image_path = q.Text(5);
  r.mask_path = q.Text(6);
  r.error = q.Text(7);
  r.prediction = q.Text(8);
  r.prediction_path = q.Text(9);
  RETURN_IF_ERROR(ApplyExtraBlob(q.Blob(10), &r));
  return r;
}

}  // namespace

// COCO results jobs' detections (ManifestRow.coco_detections): apart from the rows, which other
// readers read without them, so that a lease reads only its own rows'. They go to a file of the
// job's beside the database (DetectionsPath: one sequential write and an fdatasync, where the same
// 130 MB as SQLite records cost 4x as much, and again when the WAL is checkpointed), each row's
// offset and length into detection_spans in the same call; the file is on disk before the spans
// commit, and a submission that never completes is deleted with its file (DeleteJob). Without a
// directory to hold the file (an in-memory database), the bytes go into row_detections.
std::string JobStore::DetectionsPath(const std::string& job_id) const {
  if (path_.empty() || path_ == ":memory:" || path_.rfind("file:", 0) == 0) return "";
  return absl::StrCat(path_, "-detections/", absl::BytesToHexString(job_id));
}

absl::Status JobStore::InsertDetectionsLocked(const std::string& job_id, const std::vector<ManifestRow>& rows) {
  if (std::none_of(rows.begin(), rows.end(), [](const ManifestRow& r) { return !r.coco_detections.empty(); })) {
    return absl::OkStatus();
  }
  const std::string file = DetectionsPath(job_id);
  if (file.empty()) {
    return InTransaction([&](sqlite3* db) -> absl::Status {
      Stmt write(db, "INSERT OR REPLACE INTO row_detections VALUES(?,?,?)");
      RETURN_IF_ERROR(write.status());
      for (const ManifestRow& r : rows) {
        if (r.coco_detections.empty()) continue;
        write.BindStatic(1, job_id).Bind(2, r.index).BindBlob(3, r.coco_detections);
        RETURN_IF_ERROR(write.Run());
      }
      return absl::OkStatus();
    });
  }
  auto failed = [&](const char* what) {
    return absl::UnavailableError(absl::StrCat("detections file '", file, "': ", what, ": ", std::strerror(errno)));
  };
  const std::string dir = file.substr(0, file.rfind('/'));
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return failed("cannot create its directory");
  const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return failed("cannot open");
  absl::Cleanup close_fd = [fd] { close(fd); };
  struct stat st;
  if (fstat(fd, &st) != 0) return failed("cannot stat");
  int64_t end = st.st_size;
  std::vector<std::pair<int64_t, int64_t>> spans(rows.size(), {-1, 0});
  std::string pending;  // Written a few MB at a time.
  auto flush = [&]() -> absl::Status {
    for (size_t done = 0; done < pending.size();) {
      const ssize_t n = write(fd, pending.data() + done, pending.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return failed("write failed");
      done += static_cast<size_t>(n);
    }
    pending.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string& d = rows[i].coco_detections;
    if (d.empty()) continue;
    spans[i] = {end, static_cast<int64_t>(d.size())};
    end += static_cast<int64_t>(d.size());
    pending += d;
    if (pending.size() >= (size_t{4} << 20)) RETURN_IF_ERROR(flush());
  }
  RETURN_IF_ERROR(flush());
  if (fdatasync(fd) != 0) return failed("fdatasync failed");
  return InTransaction([&](sqlite3* db) -> absl::Status {
    Stmt write(db, "INSERT OR REPLACE INTO detection_spans VALUES(?,?,?,?)");
    RETURN_IF_ERROR(write.status());
    for (size_t i = 0; i < rows.size(); ++i) {
      if (spans[i].first < 0) continue;
      write.BindStatic(1, job_id).Bind(2, rows[i].index).Bind(3, spans[i].first).Bind(4, spans[i].second);
      RETURN_IF_ERROR(write.Run());
    }
    return absl::OkStatus();
  });
}

absl::Status JobStore::ReadDetections(const std::string& job_id, std::vector<ManifestRow>* rows) {
  absl::MutexLock lock(&mu_);
  Stmt spans(db_, "SELECT offset, length FROM detection_spans WHERE job_id=? AND idx=?");
  RETURN_IF_ERROR(spans.status());
  Stmt q(db_, "SELECT data FROM row_detections WHERE job_id=? AND idx=?");
  RETURN_IF_ERROR(q.status());
  const std::string file = DetectionsPath(job_id);
  int fd = -1;
  absl::Cleanup close_fd = [&fd] {
    if (fd >= 0) close(fd);
  };
  for (ManifestRow& r : *rows) {
    absl::Status s;
    spans.Bind(1, job_id).Bind(2, r.index);
    if (spans.Step(&s)) {
      const int64_t offset = spans.Int(0), length = spans.Int(1);
      if (fd < 0 && (fd = open(file.c_str(), O_RDONLY | O_CLOEXEC)) < 0) {
        return absl::DataLossError(absl::StrCat("detections file '", file, "' of job ", job_id,
                                                " cannot be opened: ", std::strerror(errno)));
      }
      r.coco_detections.resize(static_cast<size_t>(length));
      const ssize_t n = length > 0 ? pread(fd, r.coco_detections.data(), static_cast<size_t>(length), offset) : 0;
      if (n != static_cast<ssize_t>(length)) {
        return absl::DataLossError(absl::StrCat("detections file '", file, "' of job ", job_id, ": row ", r.index,
                                                "'s ", length, " bytes at ", offset, " could not be read"));
      }
    }
    spans.Reset();
    RETURN_IF_ERROR(s);
    if (!r.coco_detections.empty()) continue;
    q.Bind(1, job_id).Bind(2, r.index);  // Stored by a tallyd before the files, or in memory.
    if (q.Step(&s)) r.coco_detections = q.Blob(0);
    q.Reset();
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ManifestRow>> JobStore::ReadRows(const std::string& job_id, int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const bool blocked, BlockedLocked(job_id));
  if (blocked) {
    Stmt q(db_, "SELECT data FROM manifest_blocks WHERE job_id=? AND block>=? AND block<=? ORDER BY block");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id).Bind(2, begin / kRowBlock).Bind(3, end <= begin ? begin / kRowBlock : (end - 1) / kRowBlock);
    std::vector<ManifestRow> rows, block;
    absl::Status s;
    while (q.Step(&s)) {
      RETURN_IF_ERROR(DecodeBlock(q.Blob(0), &block));
      for (ManifestRow& r : block) {
        if (r.index >= begin && r.index < end) rows.push_back(std::move(r));
      }
    }
    RETURN_IF_ERROR(s);
    return rows;
  }
  Stmt q(db_, absl::StrCat(kRowColumns, "WHERE job_id=? AND idx>=? AND idx<? ORDER BY idx").c_str());
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id).Bind(2, begin).Bind(3, end);
  std::vector<ManifestRow> rows;
  absl::Status s;
  while (q.Step(&s)) {
    ASSIGN_OR_RETURN(ManifestRow r, RowFromStmt(q));
    rows.push_back(std::move(r));
  }
  RETURN_IF_ERROR(s);
  return rows;
}

absl::StatusOr<std::vector<ManifestRow>> JobStore::ReadRowsAt(const std::string& job_id,
                                                              const std::vector<int64_t>& indices) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const bool blocked, BlockedLocked(job_id));
  if (blocked) {
    BlockCache cache(db_, job_id);
    std::vector<ManifestRow> rows;
    rows.reserve(indices.size());
    for (int64_t index : indices) {
      ASSIGN_OR_RETURN(const ManifestRow* r, cache.Find(index));
      if (r != nullptr) rows.push_back(*r);
    }
    return rows;
  }
  Stmt q(db_, absl::StrCat(kRowColumns, "WHERE job_id=? AND idx=?").c_str());
  RETURN_IF_ERROR(q.status());
  std::vector<ManifestRow> rows;
  rows.reserve(indices.size());
  for (int64_t index : indices) {
    absl::Status s;
    q.Bind(1, job_id).Bind(2, index);
    if (q.Step(&s)) {
      ASSIGN_OR_RETURN(ManifestRow r, RowFromStmt(q));
      rows.push_back(std::move(r));
    }
    q.Reset();
    RETURN_IF_ERROR(s);
  }
  return rows;
}

namespace {

// A row's names from columns first..first+5 of a statement: id, image, mask, prediction, mask_path,
// prediction_path (as kNameColumns lists them).
constexpr const char* kNameColumns = "id, image, mask, prediction, mask_path, prediction_path";
RowNames NamesFromColumns(Stmt& q, int first) {
  return RowNames{q.Text(first),     q.Text(first + 1), q.Text(first + 2),
                  q.Text(first + 3), q.Text(first + 4), q.Text(first + 5)};
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
         "SELECT r.payload, m.id, m.image, m.mask, m.prediction, m.mask_path, m.prediction_path "
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
