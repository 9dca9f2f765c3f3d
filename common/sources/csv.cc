#include "common/sources/csv.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/text.h"

namespace tally {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------
// CsvReader
// ---------------------------------------------------------------------------------------------

CsvReader::CsvReader(ReadFn read, std::string name, ManifestLimits limits)
    : read_(std::move(read)), name_(std::move(name)), limits_(limits) {}

CsvReader::CsvReader(absl::string_view text, std::string name, ManifestLimits limits)
    : name_(std::move(name)), limits_(limits), view_(text), eof_(true) {}

bool CsvReader::Refill() {
  if (eof_) return false;
  // Keep nothing: fields are copied out as they are read.
  buffer_.resize(kChunkBytes);
  const int64_t n = read_(buffer_.data(), buffer_.size());
  if (n <= 0) {
    eof_ = true;
    read_error_ = n < 0;
    buffer_.clear();
    view_ = absl::string_view();
    pos_ = 0;
    return false;
  }
  buffer_.resize(static_cast<size_t>(n));
  view_ = buffer_;
  pos_ = 0;
  return true;
}

int CsvReader::Peek() {
  if (pos_ >= view_.size() && !Refill()) return -1;
  return static_cast<unsigned char>(view_[pos_]);
}

void CsvReader::SkipByteOrderMark() {
  // UTF-8 byte order mark, as spreadsheet programs write it.
  static constexpr unsigned char kBom[3] = {0xEF, 0xBB, 0xBF};
  if (Peek() == kBom[0]) {
    // The BOM can only straddle a chunk boundary in a file of a 1-byte first chunk; ignore that.
    if (pos_ + 2 < view_.size() && static_cast<unsigned char>(view_[pos_ + 1]) == kBom[1] &&
        static_cast<unsigned char>(view_[pos_ + 2]) == kBom[2]) {
      pos_ += 3;
    }
  }
}

bool CsvReader::FieldTooLong(size_t column, absl::Status* status) {
  *status = absl::InvalidArgumentError(absl::StrCat("manifest '", name_, "' line ", line_, ", column ", column,
                                                    ": field longer than ", limits_.max_field_bytes, " bytes"));
  return false;
}

bool CsvReader::ReadQuoted(size_t column, std::string* field, absl::Status* status) {
  Skip();
  const int64_t quote_line = line_;
  bool closed = false;
  int c;
  while ((c = Peek()) >= 0) {
    Skip();
    if (c == '"') {
      if (Peek() == '"') {
        Skip();
        field->push_back('"');
        continue;
      }
      closed = true;
      break;
    }
    if (c == '\n') ++line_;
    field->push_back(static_cast<char>(c));
    if (field->size() > limits_.max_field_bytes) return FieldTooLong(column, status);
  }
  if (!closed) {
    *status = absl::InvalidArgumentError(
        absl::StrCat("manifest '", name_, "' line ", quote_line, ": unterminated quoted field"));
    return false;
  }
  // Text after the closing quote up to the separator is kept, as most readers do.
  while ((c = Peek()) >= 0 && c != ',' && c != '\n' && c != '\r') {
    field->push_back(static_cast<char>(c));
    Skip();
    if (field->size() > limits_.max_field_bytes) return FieldTooLong(column, status);
  }
  return true;
}

bool CsvReader::ReadUnquoted(size_t column, std::string* field, bool* any_content, absl::Status* status) {
  // The field's bytes up to the separator, a run of the buffer at a time.
  while (Peek() >= 0) {
    const char* begin = view_.data() + pos_;
    const char* end = view_.data() + view_.size();
    const char* p = begin;
    while (p < end && *p != ',' && *p != '\n' && *p != '\r') ++p;
    if (p > begin) {
      field->append(begin, static_cast<size_t>(p - begin));
      pos_ += static_cast<size_t>(p - begin);
      *any_content = true;
      if (field->size() > limits_.max_field_bytes) return FieldTooLong(column, status);
    }
    if (p < end) break;  // At a separator; else the buffer ran out: refill and go on.
  }
  return true;
}

bool CsvReader::Next(CsvRecord* rec, absl::Status* status) {
  if (!started_) {
    started_ = true;
    SkipByteOrderMark();
  }
  while (Peek() >= 0) {
    rec->line = line_;
    rec->fields.clear();
    std::string field;
    bool any_content = false;
    while (true) {
      const size_t column = rec->fields.size() + 1;
      if (Peek() == '"') {
        any_content = true;
        if (!ReadQuoted(column, &field, status)) return false;
      } else if (!ReadUnquoted(column, &field, &any_content, status)) {
        return false;
      }
      rec->fields.push_back(std::move(field));
      field.clear();
      if (rec->fields.size() > limits_.max_fields) {
        *status = absl::InvalidArgumentError(absl::StrCat("manifest '", name_, "' line ", rec->line, ": more than ",
                                                          limits_.max_fields, " fields"));
        return false;
      }
      if (Peek() == ',') {
        any_content = true;
        Skip();
        continue;
      }
      break;
    }
    // End of record: CRLF, LF, lone CR or end of text.
    if (Peek() == '\r') Skip();
    if (Peek() == '\n') Skip();
    ++line_;
    if (any_content) return true;
  }
  if (read_error_) *status = absl::DataLossError(absl::StrCat("manifest '", name_, "': read error"));
  return false;
}

absl::StatusOr<std::vector<CsvRecord>> SplitCsv(absl::string_view text, const std::string& name) {
  CsvReader reader(text, name, ManifestLimits{});
  std::vector<CsvRecord> records;
  CsvRecord rec;
  absl::Status status;
  while (reader.Next(&rec, &status)) records.push_back(std::move(rec));
  if (!status.ok()) return status;
  return records;
}
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace tally
