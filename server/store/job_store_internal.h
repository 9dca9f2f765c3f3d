// Internal to the job store (server/store/job_store.cc, server/store/job_store_rows.cc): SQLite
// errors as Status values, a prepared statement that finalises itself, and manifest rows kept in
// blocks.
#ifndef TALLY_SERVER_STORE_JOB_STORE_INTERNAL_H_
#define TALLY_SERVER_STORE_JOB_STORE_INTERNAL_H_

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/sources/row_source.h"

namespace tally {
namespace store_internal {

inline absl::Status SqlError(sqlite3* db, const std::string& what) {
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


// Manifest rows stored kRowBlock to a record (manifest_blocks): one B-tree insert and one
// statement per block instead of per row, which is what a submission of millions of rows costs.
// A rowid table (tens of KB a record: WITHOUT ROWID would copy them around its index pages).
// A block's rows: each as varints (index, line) and length-prefixed strings, in index order.
constexpr int64_t kRowBlock = 256;

// A block's rows decoded (rows in index order); DATA_LOSS when it does not read back.
absl::Status DecodeBlock(const std::string& data, std::vector<ManifestRow>* rows);
// A manifest_rows.columns blob's extra column values (none for "").
absl::Status RowColumnsFromBlob(const std::string& blob, std::vector<std::string>* columns);
// The row with `index` in a decoded block (rows in index order), or null.
const ManifestRow* FindInBlock(const std::vector<ManifestRow>& rows, int64_t index);
// Whether a job's rows are in manifest_blocks (else in manifest_rows, one record a row).
absl::StatusOr<bool> RowsInBlocks(sqlite3* db, const std::string& job_id);

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

}  // namespace store_internal
}  // namespace tally

#endif  // TALLY_SERVER_STORE_JOB_STORE_INTERNAL_H_
