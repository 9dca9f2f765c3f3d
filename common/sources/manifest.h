// Manifest parsing: a CSV file with a header row naming at least the columns `image` and `mask`
// (`id` optional, any other column ignored), or, for scoring predictions that already exist,
// `mask` and `prediction` (`image` optional). Paths are relative to the manifest's folder or
// absolute.
//
// Manifests are untrusted input: the reader streams the file in bounded memory (rows come out in
// batches), enforces limits on rows, fields and field sizes, requires text to be valid UTF-8 without
// NUL or control characters (tabs aside; line breaks only in a quoted `prompt`), and its error
// messages name the file, the line and the column but never echo the file's bytes.
// Thread-compatible.
#ifndef TALLY_COMMON_SOURCES_MANIFEST_H_
#define TALLY_COMMON_SOURCES_MANIFEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sources/csv.h"
#include "common/sources/row_source.h"

namespace tally {

struct Manifest {
  std::string path;  // Absolute path of the manifest file.
  bool has_prediction = false;
  std::vector<ManifestRow> rows;
};

// Rows whose id repeats an earlier row's, found in O(rows log rows) time and 16 bytes a row (ids
// are kept as 64-bit hashes, so a manifest of millions of rows needs no set of strings): feed every
// row with Add, then Finish. The groups name each repeated id's first rows; the caller reads their
// ids back (Groups' indices) where it needs the text.
class DuplicateIds {
 public:
  void Add(const std::string& id, int64_t index, int64_t line);
  struct Group {
    uint64_t hash = 0;
    std::vector<std::pair<int64_t, int64_t>> rows;  // (index, line), in manifest order.
  };
  // Sorts what was added; returns the number of rows whose id hash equals an earlier row's, and in
  // `groups` up to `max_groups` such ids, in the order their second row comes in the manifest
  // (`repeated_ids`, when given: how many ids repeat in all).
  int64_t Finish(size_t max_groups, std::vector<Group>* groups, int64_t* repeated_ids = nullptr);

 private:
  struct Entry {
    uint64_t hash;
    int64_t index;
    int64_t line;
  };
  std::vector<Entry> entries_;
  absl::flat_hash_set<uint64_t> seen_;      // Every hash so far.
  absl::flat_hash_set<uint64_t> repeated_;  // Hashes seen twice or more.
};
// "3 rows repeat the id of an earlier row (2 ids): 'same' (lines 2, 3, 5), 'x' (lines 6, 7)": from
// Finish's counts and the repeated ids with their lines ("..." where ids are left out).
std::string DuplicateIdsMessage(int64_t rows, int64_t ids,
                                const std::vector<std::pair<std::string, std::vector<int64_t>>>& named);

// Streams a manifest's rows in batches. Open() checks the file (a regular, readable file) and its
// header; NextBatch() parses up to `max_rows` further rows.
class ManifestReader : public RowSource {
 public:
  // Errors name the file: NOT_FOUND when it does not exist, PERMISSION_DENIED when it cannot be
  // read, INVALID_ARGUMENT when it is not a regular file or the header lacks a required column.
  static absl::StatusOr<std::unique_ptr<ManifestReader>> Open(const std::string& path, ManifestLimits limits = {});
  // The same over text in memory; `base_dir` resolves relative paths, `name` is used in messages.
  static absl::StatusOr<std::unique_ptr<ManifestReader>> FromText(absl::string_view text, const std::string& base_dir,
                                                                  const std::string& name, ManifestLimits limits = {});
  ~ManifestReader();

  // Appends up to `max_rows` rows to `rows` (cleared first); an empty batch means the end.
  // Malformed data rows do not fail the manifest: they carry `error` so the job fails just that
  // row. Unterminated quotes, invalid UTF-8, oversized fields and too many rows fail it.
  absl::Status NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) override;
  const std::string& path() const override { return path_; }
  int64_t rows_read() const override { return next_index_; }
  bool has_prediction() const { return prediction_col_ >= 0; }
  bool has_image() const { return image_col_ >= 0; }
  bool has_coco_ann_ids() const { return coco_ann_ids_col_ >= 0; }
  // Columns besides id, image, mask and prediction (header text, whitespace stripped; unnamed
  // columns left out). Rows carry their values, unstripped, in `columns` once KeepExtraColumns()
  // was called (Python models read them; other jobs do not pay for copying them).
  const std::vector<std::string>& extra_columns() const { return extra_names_; }
  void KeepExtraColumns() { keep_extra_ = true; }

 private:
  ManifestReader(std::string path, std::string base_dir, std::string name, ManifestLimits limits)
      : path_(std::move(path)), base_dir_(std::move(base_dir)), name_(std::move(name)), limits_(limits) {}
  absl::Status ReadHeader();
  absl::Status CheckText(const CsvRecord& record) const;

  std::string path_;
  std::string base_dir_;
  std::string name_;
  ManifestLimits limits_;
  int fd_ = -1;
  std::unique_ptr<CsvReader> csv_;
  std::vector<std::string> header_;
  int image_col_ = -1, mask_col_ = -1, id_col_ = -1, prediction_col_ = -1, coco_ann_ids_col_ = -1;
  std::vector<int> extra_cols_;
  std::vector<std::string> extra_names_;
  bool keep_extra_ = false;
  int64_t next_index_ = 0;
};

// Reads and parses a whole manifest into memory (tests, benchmarks, small manifests).
absl::StatusOr<Manifest> ReadManifest(const std::string& path, ManifestLimits limits = {});
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& base_dir, const std::string& name,
                                       ManifestLimits limits = {});

// A `coco_ann_ids` field: positive integers joined by ';' (blank: none). Errors quote the field.
absl::Status ParseCocoAnnIds(absl::string_view text, std::vector<int64_t>* ids);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_MANIFEST_H_
