#include "common/sources/manifest.h"

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
#include "base/file_util.h"
#include "base/text.h"

namespace tally {
namespace {


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
  // The header is not echoed: the file may not be a manifest at all (docs/data.md "Bad input").
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
