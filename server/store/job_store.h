// Durable state of the coordinator in an embedded SQLite database (WAL mode): job specs, the
// manifest rows of each job, shard states, every per-image result and per-worker statistics.
// A result counts only once it is committed here; reports are built from here.
//
// Thread-safe: one connection, serialised by an internal mutex. Calls block on disk I/O, so
// callers must not hold their own locks across them. Errors: RESOURCE_EXHAUSTED when the disk (or
// the database) is full, UNAVAILABLE for other I/O errors (both pass once space or the disk
// returns), INTERNAL otherwise; every message starts with "database".
#ifndef TALLY_SERVER_STORE_JOB_STORE_H_
#define TALLY_SERVER_STORE_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/sources/manifest.h"
#include "proto/tally.pb.h"

struct sqlite3;

namespace tally {

// A manifest row's id and paths as written in the manifest (reports show these).
struct RowNames {
  std::string id;
  std::string image;       // Empty in prediction manifests without an image column.
  std::string mask;
  std::string prediction;  // Prediction manifests.
  std::string mask_path;   // Resolved against the manifest's folder.
  std::string prediction_path;
  std::vector<std::string> columns;  // The extra columns' values where the job keeps them (JobSpec.manifest_columns).
};

// A manifest row's names (what reports show of it).
inline RowNames NamesOf(const ManifestRow& r) {
  return RowNames{r.id, r.image, r.mask, r.prediction, r.mask_path, r.prediction_path, r.columns};
}

// One report thumbnail (common/formats/thumbnail.h) as the store keeps it, stripped from its result.
struct StoredThumbnail {
  int64_t index = 0;
  int class_index = 0;
  double dice = 0;  // The row's Dice for the class under the job's empty-score convention.
  int slice = 0;
  std::string jpeg;
};

// What the store keeps about a job besides its results.
struct JobRecord {
  v1::Job job;             // job_id, spec, state, error, totals and times.
  int64_t shard_size = 0;  // Every shard but the last has exactly this many rows.
  double last_result_unix = 0;
};

enum class ShardState : int { kPending = 0, kDone = 1 };

struct WorkerRecord {
  std::string worker_id;
  std::string name;
  std::string device;
  double first_lease_unix = 0;
  double last_result_unix = 0;
  v1::WorkerStats stats;
  int64_t images = 0;  // Rows this worker committed first (filled by ReadWorkers).
};

class JobStore {
 public:
  // Opens (creating if needed) the database file and brings its schema to this version (creating
  // tables, adding columns; PRAGMA user_version records it). Errors name the path;
  // FAILED_PRECONDITION for a database written by a newer tallyd (a newer schema version).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  static int SchemaVersion();
  ~JobStore();

  // A submission streams its manifest rows in with InsertManifestRows (one transaction per batch,
  // so other jobs' commits interleave) and then makes the job visible with CreateJob (the job
  // row and all its shards, pending, in one transaction). Rows of a submission that never reached
  // CreateJob (an error, a crash) are deleted by DeleteJob or at the next Open.
  absl::Status BeginSubmission(const std::string& job_id);
  // `blocks`: stored 256 rows to a record (manifest_blocks), for jobs that read their rows in index
  // ranges: what makes a submission of millions of rows take seconds. Rows must then come in index
  // order (a block may span calls). Otherwise one record a row (random-order jobs read rows scattered
  // over the manifest; COCO jobs).
  absl::Status InsertManifestRows(const std::string& job_id, const std::vector<ManifestRow>& rows,
                                  bool blocks = false);
  absl::Status CreateJob(const JobRecord& record);
  // Deletes everything of a job (rows, results, shards, workers) in bounded transactions and gives
  // the freed pages back to the file system.
  absl::Status DeleteJob(const std::string& job_id);
  absl::Status UpdateJob(const JobRecord& record);
  // Replaces the stored spec (the coordinator's resolved settings).
  absl::Status UpdateSpec(const std::string& job_id, const v1::JobSpec& spec);
  absl::StatusOr<std::vector<JobRecord>> LoadJobs();

  // Manifest rows [begin, end) of a job, in index order.
  absl::StatusOr<std::vector<ManifestRow>> ReadRows(const std::string& job_id, int64_t begin, int64_t end);
  // The rows of these manifest indices, in the order given (missing ones left out).
  absl::StatusOr<std::vector<ManifestRow>> ReadRowsAt(const std::string& job_id, const std::vector<int64_t>& indices);
  // COCO results jobs (JobSpec.coco_results_in_rows): each row's coco_detections filled in (stored
  // apart from the rows, which other readers read without them).
  absl::Status ReadDetections(const std::string& job_id, std::vector<ManifestRow>* rows);

  // Commits results in one transaction; rows that already have a result are left as they are
  // (a re-run of a shard produces the same values). `new_rows` receives, for each result, whether
  // it was newly inserted. In the same transaction, the thumbnails of newly inserted rows join the
  // job's, of which only the `keep_thumbnails` lowest (dice, index) per class stay: so the table
  // holds exactly the job's worst rows once every shard's worst sent theirs (common/formats/thumbnail.h).
  // `names` (optional) receives, for each newly inserted row, its names from the manifest (read in
  // the same transaction); other entries are left empty.
  absl::Status CommitResults(const std::string& job_id, const std::string& worker_id,
                             const std::vector<v1::ImageResult>& results, double now,
                             std::vector<bool>* new_rows, const std::vector<StoredThumbnail>& thumbnails = {},
                             int keep_thumbnails = 0, std::vector<RowNames>* names = nullptr);
  // A job's thumbnails, by class then index.
  absl::StatusOr<std::vector<StoredThumbnail>> ReadThumbnails(const std::string& job_id);
  absl::Status SetShardState(const std::string& job_id, int64_t shard_id, ShardState state, int attempts);
  // Shard states of a job, by shard id.
  absl::StatusOr<std::vector<ShardState>> ReadShardStates(const std::string& job_id, int64_t num_shards);
  // Indices that already have a result (for resume).
  absl::StatusOr<std::vector<int64_t>> ReadResultIndices(const std::string& job_id);

  // Small values of the service itself by key (the restart handoff), replaced whole.
  absl::Status PutState(const std::string& key, const std::string& value);
  absl::StatusOr<std::optional<std::string>> GetState(const std::string& key);
  // Every key beginning with `prefix` and its value, by key (the follows: "follow/<id>").
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListState(const std::string& prefix);
  absl::Status DeleteState(const std::string& key);
  absl::Status UpsertWorker(const std::string& job_id, const WorkerRecord& worker);
  absl::StatusOr<std::vector<WorkerRecord>> ReadWorkers(const std::string& job_id);

  // Calls `fn` for every committed result of a job in index order. Stops at the first error.
  // Reads through a connection of its own (WAL readers do not block the writer), so a long
  // report build does not stall commits.
  // `fn` gets the result with the row's id and paths as written in the manifest.
  using ResultFn = std::function<absl::Status(const v1::ImageResult&, const RowNames& names)>;
  absl::Status ForEachResult(const std::string& job_id, const ResultFn& fn);

  const std::string& path() const { return path_; }

 private:
  JobStore(sqlite3* db, std::string path) : path_(std::move(path)), db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` with the connection between BEGIN IMMEDIATE and COMMIT; rolls back on error. The
  // body gets the handle as an argument: lambdas are outside the lock analysis, so they must not
  // read db_ themselves.
  absl::Status InTransaction(const std::function<absl::Status(sqlite3* db)>& body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InsertDetectionsLocked(const std::string& job_id, const std::vector<ManifestRow>& rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteInBatches(const char* table, const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The file that holds a COCO results job's detections beside the database ("" for an in-memory one).
  std::string DetectionsPath(const std::string& job_id) const;

  // Whether the job's rows are in blocks (InsertManifestRows), remembered once known.
  absl::StatusOr<bool> BlockedLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> blocked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_STORE_JOB_STORE_H_
