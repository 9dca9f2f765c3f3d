#include "common/manifest.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"

namespace tally {
namespace {

std::string Stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
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

absl::StatusOr<std::vector<CsvRecord>> SplitCsv(absl::string_view text, const std::string& name) {
  std::vector<CsvRecord> records;
  size_t i = 0;
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF &&
      static_cast<unsigned char>(text[1]) == 0xBB && static_cast<unsigned char>(text[2]) == 0xBF) {
    i = 3;  // UTF-8 byte order mark, as spreadsheet programs write it.
  }
  int64_t line = 1;
  const size_t n = text.size();
  while (i < n) {
    CsvRecord rec;
    rec.line = line;
    std::string field;
    bool any_content = false;
    while (true) {
      if (i < n && text[i] == '"') {
        any_content = true;
        ++i;
        const int64_t quote_line = line;
        bool closed = false;
        while (i < n) {
          char c = text[i];
          if (c == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            closed = true;
            break;
          }
          if (c == '\n') ++line;
          field.push_back(c);
          ++i;
        }
        if (!closed) {
          return absl::InvalidArgumentError(
              absl::StrCat("manifest '", name, "' line ", quote_line, ": unterminated quoted field"));
        }
        // Text after the closing quote up to the separator is kept, as most readers do.
        while (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') field.push_back(text[i++]);
      } else {
        while (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
          field.push_back(text[i++]);
          any_content = true;
        }
      }
      rec.fields.push_back(std::move(field));
      field.clear();
      if (i < n && text[i] == ',') {
        any_content = true;
        ++i;
        continue;
      }
      break;
    }
    // End of record: CRLF, LF, lone CR or end of text.
    if (i < n && text[i] == '\r') ++i;
    if (i < n && text[i] == '\n') ++i;
    ++line;
    if (any_content) records.push_back(std::move(rec));
  }
  return records;
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& base_dir,
                                       const std::string& name) {
  auto records_or = SplitCsv(text, name);
  if (!records_or.ok()) return records_or.status();
  std::vector<CsvRecord>& records = *records_or;
  if (records.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest '", name, "' is empty: expected a header row with columns 'image' and 'mask'"));
  }
  int image_col = -1, mask_col = -1, id_col = -1;
  std::vector<std::string> header;
  for (size_t c = 0; c < records[0].fields.size(); ++c) {
    std::string col = absl::AsciiStrToLower(absl::StripAsciiWhitespace(records[0].fields[c]));
    header.push_back(col);
    int* slot = col == "image" ? &image_col : col == "mask" ? &mask_col : col == "id" ? &id_col : nullptr;
    if (slot == nullptr) continue;
    if (*slot >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest '", name, "' header names column '", col, "' twice"));
    }
    *slot = static_cast<int>(c);
  }
  for (auto [col, idx] : {std::pair<const char*, int>{"image", image_col}, {"mask", mask_col}}) {
    if (idx < 0) {
      return absl::InvalidArgumentError(absl::StrCat("manifest '", name, "' has no '", col,
                                                     "' column (header: ", absl::StrJoin(header, ","),
                                                     "); required columns: image, mask"));
    }
  }
  Manifest manifest;
  manifest.path = name;
  manifest.rows.reserve(records.size() - 1);
  const size_t ncols = records[0].fields.size();
  for (size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& rec = records[r];
    ManifestRow row;
    row.index = static_cast<int64_t>(r - 1);
    row.line = rec.line;
    auto get = [&](int col) -> std::string {
      return col >= 0 && static_cast<size_t>(col) < rec.fields.size()
                 ? std::string(absl::StripAsciiWhitespace(rec.fields[col]))
                 : std::string();
    };
    row.image = get(image_col);
    row.mask = get(mask_col);
    row.id = get(id_col);
    if (rec.fields.size() != ncols) {
      row.error = absl::StrCat("manifest line ", rec.line, ": ", rec.fields.size(),
                               " fields, but the header has ", ncols);
    } else if (row.image.empty()) {
      row.error = absl::StrCat("manifest line ", rec.line, ": empty 'image' field");
    } else if (row.mask.empty()) {
      row.error = absl::StrCat("manifest line ", rec.line, ": empty 'mask' field");
    }
    if (row.id.empty()) row.id = row.image.empty() ? absl::StrCat(row.index) : Stem(row.image);
    row.image_path = ResolvePath(base_dir, row.image);
    row.mask_path = ResolvePath(base_dir, row.mask);
    manifest.rows.push_back(std::move(row));
  }
  return manifest;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  const std::string abs = AbsolutePath(path);
  struct stat st;
  if (stat(abs.c_str(), &st) != 0) {
    int err = errno;
    std::string msg = absl::StrCat("manifest '", path, "' cannot be opened: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("manifest '", path, "' is a directory, not a CSV file"));
  }
  std::ifstream in(abs, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat("manifest '", path, "' cannot be read: ", std::strerror(errno)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("manifest '", path, "': read error"));
  }
  auto manifest = ParseManifest(buf.str(), DirName(abs), path);
  if (manifest.ok()) manifest->path = abs;
  return manifest;
}

}  // namespace tally
