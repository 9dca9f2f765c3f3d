// The job store's manifest rows (server/store/job_store.h): rows kept in compressed blocks of a
// job's index range, read back by range or by index, and a COCO results job's detections kept in a
// file beside the database.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/store/job_store.h"
#include "server/store/job_store_internal.h"

namespace tally {

using store_internal::BlockCache;
using store_internal::DecodeBlock;
using store_internal::FindInBlock;
using store_internal::kRowBlock;
using store_internal::RowsInBlocks;
using store_internal::SqlError;
using store_internal::Stmt;

namespace {

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

}  // namespace

namespace store_internal {

absl::Status RowColumnsFromBlob(const std::string& blob, std::vector<std::string>* columns) {
  columns->clear();
  if (blob.empty()) return absl::OkStatus();
  ManifestRow r;
  RETURN_IF_ERROR(ApplyExtraBlob(blob, &r));
  *columns = std::move(r.columns);
  return absl::OkStatus();
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

}  // namespace store_internal

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

}  // namespace tally
