// Manifest parsing: a CSV file with a header row naming at least the columns `image` and `mask`
// (`id` optional, any other column ignored). Paths are relative to the manifest's folder or
// absolute. Thread-compatible; no I/O besides reading the manifest file.
#ifndef TALLY_COMMON_MANIFEST_H_
#define TALLY_COMMON_MANIFEST_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

struct ManifestRow {
  int64_t index = 0;       // 0-based data row (the header is not a row).
  int64_t line = 0;        // 1-based line of the file where the row starts, for messages.
  std::string id;          // The `id` column, or the image file's stem when there is none.
  std::string image;       // As written in the manifest.
  std::string mask;        // As written in the manifest.
  std::string image_path;  // Resolved against the manifest's folder.
  std::string mask_path;
  std::string error;       // Non-empty when the row itself is malformed; the row fails with it.
};

struct Manifest {
  std::string path;  // Absolute path of the manifest file.
  std::vector<ManifestRow> rows;
};

// Reads and parses a manifest file. Errors name the file: NOT_FOUND when it does not exist,
// PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT when the header lacks a required
// column or the file has no header. Malformed data rows do not fail the manifest: they carry
// `error` so the job can fail just that row.
absl::StatusOr<Manifest> ReadManifest(const std::string& path);

// Parses manifest text. `base_dir` resolves relative paths; `name` is used in messages.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& base_dir,
                                       const std::string& name);

// Splits CSV text (RFC 4180: quoted fields, "" escapes, CRLF or LF) into records. Each record
// keeps the 1-based line where it starts. Blank lines are skipped.
struct CsvRecord {
  int64_t line = 0;
  std::vector<std::string> fields;
};
absl::StatusOr<std::vector<CsvRecord>> SplitCsv(absl::string_view text, const std::string& name);

}  // namespace tally

#endif  // TALLY_COMMON_MANIFEST_H_
