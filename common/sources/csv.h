// CSV as manifests are written (RFC 4180: quoted fields, "" escapes, CRLF or LF), read in bounded
// memory from an untrusted file: every field and record is checked against ManifestLimits before it
// grows, and errors name the file, the line and the column but never echo the file's bytes.
#ifndef TALLY_COMMON_SOURCES_CSV_H_
#define TALLY_COMMON_SOURCES_CSV_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

struct ManifestLimits {
  int64_t max_rows = 50'000'000;    // More data rows fail the manifest (tallyd --max-manifest-rows).
  size_t max_field_bytes = 4096;    // One field (a path, an id).
  size_t max_fields = 1024;         // Columns of one record.
};

// Splits CSV text (RFC 4180: quoted fields, "" escapes, CRLF or LF) into records, reading from
// `read` in chunks. Each record keeps the 1-based line where it starts. Blank lines are skipped.
struct CsvRecord {
  int64_t line = 0;
  std::vector<std::string> fields;
};
class CsvReader {
 public:
  // Fills up to `capacity` bytes of `buffer`; returns the count, 0 at the end, -1 on a read error.
  using ReadFn = std::function<int64_t(char* buffer, size_t capacity)>;
  CsvReader(ReadFn read, std::string name, ManifestLimits limits);
  // A reader over text already in memory.
  CsvReader(absl::string_view text, std::string name, ManifestLimits limits);
  // The next record: true and `record` filled, or false at the end or on an error (`status`).
  bool Next(CsvRecord* record, absl::Status* status);

 private:
  int Peek();  // Next byte, or -1 at the end.
  void Skip() { ++pos_; }
  bool Refill();
  void SkipByteOrderMark();
  // One field of record column `column` (1-based) appended to `field`: false with `status` set on
  // an error. ReadQuoted starts at the opening quote.
  bool ReadQuoted(size_t column, std::string* field, absl::Status* status);
  bool ReadUnquoted(size_t column, std::string* field, bool* any_content, absl::Status* status);
  bool FieldTooLong(size_t column, absl::Status* status);

  ReadFn read_;
  std::string name_;
  ManifestLimits limits_;
  std::string buffer_;
  absl::string_view view_;
  size_t pos_ = 0;
  bool eof_ = false;
  bool read_error_ = false;
  bool started_ = false;
  int64_t line_ = 1;
};
absl::StatusOr<std::vector<CsvRecord>> SplitCsv(absl::string_view text, const std::string& name);

// One CSV field as RFC 4180 writes it: quoted (with "" for ") when it holds a comma, quote or line end.
std::string CsvField(const std::string& s);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_CSV_H_
