#include "common/io/manifest.h"

#include <algorithm>

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "common/security/data_roots.h"
#include "common/base/file_util.h"

namespace tally {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

std::string Stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 7 && base.compare(base.size() - 7, 7, ".nii.gz") == 0) return base.substr(0, base.size() - 7);
  size_t dot = base.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

namespace {
// Eight bytes of `p`, as one word.
uint64_t Word(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}
constexpr uint64_t kHighBits = 0x8080808080808080ull;
constexpr uint64_t kOnes = 0x0101010101010101ull;
// Whether any byte of `w` (all below 0x80) is below 0x20 or is 0x7F.
bool AnyControl(uint64_t w) {
  const uint64_t del = w ^ (0x7F * kOnes);
  return (((w - 0x20 * kOnes) & ~w) | ((del - kOnes) & ~del)) & kHighBits;
}
}  // namespace

int64_t FirstInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && (Word(p + i) & kHighBits) == 0) {  // Eight ASCII bytes at once.
      i += 8;
      continue;
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
    const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

int64_t FirstControlCharacter(absl::string_view s, bool newlines_allowed) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t start = 0;  // Runs of eight printable ASCII bytes are skipped at once.
  while (start + 8 <= s.size()) {
    const uint64_t w = Word(p + start);
    if ((w & kHighBits) != 0 || AnyControl(w)) break;
    start += 8;
  }
  for (size_t i = start; i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b == '\t' || (newlines_allowed && (b == '\n' || b == '\r'))) continue;
    if (b < 0x20 || b == 0x7F) return static_cast<int64_t>(i);
    // C1 controls U+0080..U+009F: C2 80..C2 9F in UTF-8 (the text is valid UTF-8 by now).
    if (b == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9F) return static_cast<int64_t>(i);
  }
  return -1;
}

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

// ---------------------------------------------------------------------------------------------
// ManifestReader
// ---------------------------------------------------------------------------------------------

ManifestReader::~ManifestReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<ManifestReader>> ManifestReader::Open(const std::string& path, ManifestLimits limits) {
  const std::string abs = AbsolutePath(path);
  absl::StatusOr<RegularFile> file = OpenRegularFile(abs);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("manifest", path);
  if (absl::IsInvalidArgument(file.status())) {
    const bool dir = file.status().message() == "a directory";
    return absl::InvalidArgumentError(
        absl::StrCat("manifest '", path, "' is ", dir ? "a directory" : "not a regular file", ", not a CSV file"));
  }
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("manifest '", path, "' cannot be opened: ", file.status().message()));
  }
  const int fd = file->fd;
  std::unique_ptr<ManifestReader> r(new ManifestReader(abs, DirName(abs), path, limits));
  r->fd_ = fd;
  r->csv_ = std::make_unique<CsvReader>(
      [fd](char* buf, size_t cap) -> int64_t {
        while (true) {
          const ssize_t n = read(fd, buf, cap);
          if (n < 0 && errno == EINTR) continue;
          return n;
        }
      },
      path, limits);
  if (absl::Status s = r->ReadHeader(); !s.ok()) return s;
  return r;
}

absl::StatusOr<std::unique_ptr<ManifestReader>> ManifestReader::FromText(absl::string_view text,
                                                                         const std::string& base_dir,
                                                                         const std::string& name,
                                                                         ManifestLimits limits) {
  std::unique_ptr<ManifestReader> r(new ManifestReader(name, base_dir, name, limits));
  r->csv_ = std::make_unique<CsvReader>(text, name, limits);
  if (absl::Status s = r->ReadHeader(); !s.ok()) return s;
  return r;
}

absl::Status ManifestReader::CheckText(const CsvRecord& rec) const {
  for (size_t c = 0; c < rec.fields.size(); ++c) {
    const std::string& field = rec.fields[c];
    const bool named = c < header_.size() && !header_[c].empty() && rec.line > 1;
    const std::string col = named ? absl::StrCat(" ('", header_[c], "')") : std::string();
    const int64_t bad = FirstInvalidUtf8(field);
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "manifest '%s' line %d, column %d%s: invalid UTF-8 (byte 0x%02X at byte %d of the field); save the "
          "manifest as UTF-8",
          name_, rec.line, c + 1, col, static_cast<unsigned char>(field[bad]), bad + 1));
    }
    // A prompt may hold line breaks (inside quotes); no field may hold any other control character.
    const int64_t control = FirstControlCharacter(field, /*newlines_allowed=*/named && header_[c] == "prompt");
    if (control >= 0) {
      const int64_t line = rec.line + std::count(field.begin(), field.begin() + control, '\n');
      const unsigned char b = static_cast<unsigned char>(field[control]);
      const std::string what =
          b == 0      ? std::string("a NUL byte")
          : b == 0xC2 ? absl::StrFormat("control character U+%04X", static_cast<unsigned char>(field[control + 1]))
                      : absl::StrFormat("control character 0x%02X", b);
      return absl::InvalidArgumentError(absl::StrFormat(
          "manifest '%s' line %d, column %d%s: %s at byte %d of the field; a manifest may hold no NUL or control "
          "character (tabs aside, and line breaks only inside a quoted 'prompt')",
          name_, line, c + 1, col, what, control + 1));
    }
  }
  return absl::OkStatus();
}

absl::Status ManifestReader::ReadHeader() {
  CsvRecord rec;
  absl::Status status;
  if (!csv_->Next(&rec, &status)) {
    if (!status.ok()) return status;
    return absl::InvalidArgumentError(
        absl::StrCat("manifest '", name_, "' is empty: expected a header row with columns 'image' and 'mask'"));
  }
  if (absl::Status s = CheckText(rec); !s.ok()) return s;
  for (size_t c = 0; c < rec.fields.size(); ++c) {
    std::string col = absl::AsciiStrToLower(absl::StripAsciiWhitespace(rec.fields[c]));
    header_.push_back(col);
    int* slot = col == "image"        ? &image_col_
                : col == "mask"       ? &mask_col_
                : col == "id"         ? &id_col_
                : col == "prediction" ? &prediction_col_
                : col == "coco_ann_ids" ? &coco_ann_ids_col_
                                      : nullptr;
    if (slot == nullptr) {
      std::string name(absl::StripAsciiWhitespace(rec.fields[c]));
      if (!name.empty()) {
        extra_cols_.push_back(static_cast<int>(c));
        extra_names_.push_back(std::move(name));
      }
      continue;
    }
    if (*slot >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("manifest '", name_, "' header (line ", rec.line,
                                                     ") names column '", col, "' twice"));
    }
    *slot = static_cast<int>(c);
  }
  // The header is not echoed: the file may not be a manifest at all (README "Bad input").
  // A prediction manifest needs no images.
  // A referring manifest's references are COCO annotations (coco_ann_ids), not mask files.
  const int image_needed = prediction_col_ >= 0 ? 0 : image_col_;
  const int mask_needed = coco_ann_ids_col_ >= 0 ? 0 : mask_col_;
  for (auto [col, idx] : {std::pair<const char*, int>{"image", image_needed}, {"mask", mask_needed}}) {
    if (idx < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest '", name_, "' line ", rec.line, ": the header has no '", col, "' column (it has ",
          rec.fields.size(), " columns); required columns: image, mask (or mask, prediction to score predictions; ",
          "or image, coco_ann_ids with --coco)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ManifestReader::NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) {
  rows->clear();
  CsvRecord rec;
  absl::Status status;
  const size_t ncols = header_.size();
  while (rows->size() < max_rows && csv_->Next(&rec, &status)) {
    if (next_index_ >= limits_.max_rows) {
      return absl::InvalidArgumentError(absl::StrCat("manifest '", name_, "' has more than ", limits_.max_rows,
                                                     " rows (tallyd --max-manifest-rows)"));
    }
    if (absl::Status s = CheckText(rec); !s.ok()) return s;
    ManifestRow row;
    row.index = next_index_++;
    row.line = rec.line;
    auto get = [&](int col) -> std::string {
      return col >= 0 && static_cast<size_t>(col) < rec.fields.size()
                 ? std::string(absl::StripAsciiWhitespace(rec.fields[col]))
                 : std::string();
    };
    // The same moved out of the record where there is nothing to strip (no copy); only for columns
    // read once here (the coco_ann_ids and extra columns are other columns).
    auto take = [&](int col) -> std::string {
      if (col < 0 || static_cast<size_t>(col) >= rec.fields.size() || col == coco_ann_ids_col_) return get(col);
      std::string& f = rec.fields[col];
      if (absl::StripAsciiWhitespace(f).size() != f.size()) return get(col);
      return std::move(f);
    };
    const bool distinct = (image_col_ < 0 || (image_col_ != mask_col_ && image_col_ != id_col_ && image_col_ != prediction_col_)) &&
                          (mask_col_ < 0 || (mask_col_ != id_col_ && mask_col_ != prediction_col_)) &&
                          (id_col_ < 0 || id_col_ != prediction_col_) && !keep_extra_;
    row.image = distinct ? take(image_col_) : get(image_col_);
    row.mask = distinct ? take(mask_col_) : get(mask_col_);
    row.id = distinct ? take(id_col_) : get(id_col_);
    row.prediction = distinct ? take(prediction_col_) : get(prediction_col_);
    for (int col : keep_extra_ ? extra_cols_ : std::vector<int>{}) {
      row.columns.push_back(static_cast<size_t>(col) < rec.fields.size() ? rec.fields[col] : std::string());
    }
    if (rec.fields.size() != ncols) {
      row.error = absl::StrCat("manifest line ", rec.line, ": ", rec.fields.size(), " fields, but the header has ",
                               ncols);
    } else if (prediction_col_ >= 0 && row.prediction.empty()) {
      row.error = absl::StrCat("manifest line ", rec.line, ": empty 'prediction' field");
    } else if (row.image.empty() && prediction_col_ < 0) {
      row.error = absl::StrCat("manifest line ", rec.line, ": empty 'image' field");
    } else if (coco_ann_ids_col_ >= 0) {
      row.has_coco_ann_ids = true;
      if (absl::Status s = ParseCocoAnnIds(get(coco_ann_ids_col_), &row.coco_ann_ids); !s.ok()) {
        row.error = absl::StrCat("manifest line ", rec.line, ": ", s.message());
      }
    } else if (row.mask.empty()) {
      row.error = absl::StrCat("manifest line ", rec.line, ": empty 'mask' field");
    }
    // One file unless a;b volumes (the split only where there is a ';').
    const std::vector<std::string> channels =
        row.image.find(';') == std::string::npos ? std::vector<std::string>() : VolumeChannelFiles(row.image);
    if (row.id.empty()) {
      row.id = !row.image.empty() ? Stem(channels.empty() ? row.image : channels[0])
                                  : !row.mask.empty() ? Stem(row.mask) : absl::StrCat(row.index);
    }
    if (channels.size() > 1) {
      std::vector<std::string> resolved;
      for (const std::string& c : channels) resolved.push_back(ResolvePath(base_dir_, c));
      row.image_path = absl::StrJoin(resolved, ";");
    } else if (!row.image.empty()) {
      row.image_path = ResolvePath(base_dir_, row.image);
    }
    row.mask_path = ResolvePath(base_dir_, row.mask);
    if (!row.prediction.empty()) row.prediction_path = ResolvePath(base_dir_, row.prediction);
    rows->push_back(std::move(row));
  }
  return status;
}

absl::Status ParseCocoAnnIds(absl::string_view text, std::vector<int64_t>* ids) {
  ids->clear();
  if (absl::StripAsciiWhitespace(text).empty()) return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    part = absl::StripAsciiWhitespace(part);
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id) || id <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("coco_ann_ids '", text, "': '", part,
                                                     "' is not an annotation id (ids are positive integers joined by ';')"));
    }
    ids->push_back(id);
  }
  return absl::OkStatus();
}

namespace {
absl::StatusOr<Manifest> ReadAll(absl::StatusOr<std::unique_ptr<ManifestReader>> reader) {
  if (!reader.ok()) return reader.status();
  Manifest manifest;
  manifest.path = (*reader)->path();
  manifest.has_prediction = (*reader)->has_prediction();
  std::vector<ManifestRow> batch;
  while (true) {
    if (absl::Status s = (*reader)->NextBatch(65536, &batch); !s.ok()) return s;
    if (batch.empty()) break;
    for (ManifestRow& r : batch) manifest.rows.push_back(std::move(r));
  }
  return manifest;
}
}  // namespace

std::string ListNames(const std::vector<std::string>& names, size_t shown) {
  std::vector<std::string> first(names.begin(), names.begin() + std::min(names.size(), shown));
  std::string s = absl::StrJoin(first, ", ");
  if (names.size() > shown) absl::StrAppend(&s, " and ", names.size() - shown, " more");
  return s;
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

absl::StatusOr<Manifest> ReadManifest(const std::string& path, ManifestLimits limits) {
  return ReadAll(ManifestReader::Open(path, limits));
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& base_dir, const std::string& name,
                                       ManifestLimits limits) {
  return ReadAll(ManifestReader::FromText(text, base_dir, name, limits));
}

void DuplicateIds::Add(const std::string& id, int64_t index, int64_t line) {
  const uint64_t hash = absl::Hash<std::string>{}(id);
  entries_.push_back(Entry{hash, index, line});
  if (!seen_.insert(hash).second) repeated_.insert(hash);
}

int64_t DuplicateIds::Finish(size_t max_groups, std::vector<Group>* groups, int64_t* repeated_ids) {
  groups->clear();
  seen_.clear();
  // Only rows whose hash repeats matter (usually none: no sort of every row).
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return repeated_.count(e.hash) == 0; }),
                 entries_.end());
  repeated_.clear();
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.index < b.index;
  });
  int64_t repeated = 0;
  std::vector<Group> all;  // Only repeated hashes: few, usually none.
  for (size_t i = 0; i < entries_.size();) {
    size_t j = i + 1;
    while (j < entries_.size() && entries_[j].hash == entries_[i].hash) ++j;
    if (j - i > 1) {
      repeated += static_cast<int64_t>(j - i - 1);
      Group g;
      g.hash = entries_[i].hash;
      for (size_t k = i; k < j; ++k) g.rows.emplace_back(entries_[k].index, entries_[k].line);
      all.push_back(std::move(g));
    }
    i = j;
  }
  std::sort(all.begin(), all.end(), [](const Group& a, const Group& b) { return a.rows[1] < b.rows[1]; });
  if (repeated_ids != nullptr) *repeated_ids = static_cast<int64_t>(all.size());
  if (all.size() > max_groups) all.resize(max_groups);
  *groups = std::move(all);
  entries_.clear();
  entries_.shrink_to_fit();
  return repeated;
}

std::string DuplicateIdsMessage(int64_t rows, int64_t ids,
                                const std::vector<std::pair<std::string, std::vector<int64_t>>>& named) {
  std::vector<std::string> parts;
  for (const auto& [id, lines] : named) {
    std::vector<int64_t> shown(lines.begin(), lines.begin() + std::min<size_t>(lines.size(), 4));
    parts.push_back(absl::StrCat("'", id, "' (lines ", absl::StrJoin(shown, ", "), lines.size() > 4 ? ", ..." : "", ")"));
  }
  return absl::StrCat(rows, rows == 1 ? " row repeats" : " rows repeat", " the id of an earlier row (", ids,
                      ids == 1 ? " id" : " ids", "): ", absl::StrJoin(parts, ", "),
                      static_cast<int64_t>(named.size()) < ids ? ", ..." : "");
}

}  // namespace tally
