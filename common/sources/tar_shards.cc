#include "common/sources/tar_shards.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <glob.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "common/security/data_roots.h"
#include "common/security/sha256.h"
#include "base/text.h"

namespace tally {
namespace {

bool HasTarExtension(absl::string_view path) {
  for (const char* e : {".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tar.xz", ".tar.bz2"}) {
    if (absl::EndsWithIgnoreCase(path, e)) return true;
  }
  return false;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern, size_t max) {
  if (pattern.find_first_of("*?[") == std::string::npos) return std::vector<std::string>{pattern};
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc && out.size() <= max; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    return absl::NotFoundError(absl::StrCat("--shards: no file matches '", pattern, "'"));
  }
  if (rc != 0) return absl::InvalidArgumentError(absl::StrCat("--shards: cannot match '", pattern, "'"));
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadShardList(const std::string& path, size_t max) {
  ClientFileLimits limits;
  limits.max_bytes = int64_t{256} << 20;
  limits.max_bytes_flag = "(a shard list's limit)";
  absl::StatusOr<std::string> text = ReadClientFile("shard list", path, limits);
  if (!text.ok()) return text.status();
  if (FirstInvalidUtf8(*text) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard list '", path, "' is not UTF-8 text"));
  }
  std::vector<std::string> out;
  int line = 0;
  for (absl::string_view l : absl::StrSplit(*text, '\n')) {
    ++line;
    l = absl::StripAsciiWhitespace(l);
    if (l.empty() || l[0] == '#') continue;
    if (FirstControlCharacter(l, false) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("shard list '", path, "' line ", line, ": a control character"));
    }
    out.push_back(ResolvePath(Dirname(path), std::string(l)));
    if (out.size() > max) break;
  }
  return out;
}

// Whether `ext` is one of `names` (case-insensitively).
bool ExtensionIn(absl::string_view ext, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return absl::EqualsIgnoreCase(ext, n); });
}

// Key and extension of a member name (WebDataset: up to / after the first dot of the base name).
void SplitMemberName(const std::string& name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) {
    *key = name;
    ext->clear();
  } else {
    *key = name.substr(0, dot);
    *ext = name.substr(dot + 1);
  }
}

std::string Printable(absl::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 512)) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > 512) out += "...";
  return out;
}

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveCloser>;

std::string EntryKind(archive_entry* e) {
  switch (archive_entry_filetype(e)) {
    case AE_IFDIR:
      return "a directory";
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(e);
      return absl::StrCat("a symbolic link to '", Printable(target ? target : ""), "'");
    }
    case AE_IFCHR:
    case AE_IFBLK:
      return "a device";
    case AE_IFIFO:
      return "a FIFO";
    case AE_IFSOCK:
      return "a socket";
    default:
      break;
  }
  if (archive_entry_hardlink(e) != nullptr) {
    return absl::StrCat("a hard link to '", Printable(archive_entry_hardlink(e)), "'");
  }
  return "not a regular file";
}

// After a member's header: its data read (a JSON member, when asked) or skipped. False when the
// archive ends inside it (its problem then says so).
bool ReadOrSkipData(archive* a, int64_t file_size, bool read_json, TarMember* m) {
  std::string key, ext;
  SplitMemberName(m->name, &key, &ext);
  const bool json = read_json && m->regular && absl::EqualsIgnoreCase(ext, "json") && m->problem.empty();
  if (file_size >= 0 && m->size > file_size) {
    m->problem = absl::StrCat("its header claims ", m->size, " bytes, more than the whole shard (", file_size,
                              "): truncated or corrupt");
  }
  const bool read_data = json && m->size <= kMaxJsonMemberBytes && m->problem.empty();
  if (json && !read_data && m->problem.empty()) {
    m->problem = absl::StrCat("a JSON member of ", m->size, " bytes (the limit is ", kMaxJsonMemberBytes, ")");
  }
  int rc = ARCHIVE_OK;
  if (read_data) {
    m->data.resize(static_cast<size_t>(m->size));
    size_t done = 0;
    while (done < m->data.size()) {
      const la_ssize_t n = archive_read_data(a, m->data.data() + done, m->data.size() - done);
      if (n <= 0) {
        rc = n < 0 ? ARCHIVE_FATAL : ARCHIVE_EOF;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (done < m->data.size()) m->data.clear();
  }
  if (rc == ARCHIVE_OK) rc = archive_read_data_skip(a);
  if (rc == ARCHIVE_OK) return true;
  m->offset = -1;
  if (m->problem.empty()) {
    m->problem = absl::StrCat("the shard ends inside it (",
                              archive_error_string(a) ? archive_error_string(a) : "truncated", ")");
  }
  return false;
}

// Lists an opened archive. A member's data offset is the count of (uncompressed) bytes the tar
// reader has consumed once its header is read: every header before the data, pax and GNU long-name
// ones included, is behind it, so this holds for every tar flavour and needs no later header.
absl::StatusOr<TarListing> ListOpened(archive* a, const std::string& name, int64_t file_size, bool read_json) {
  TarListing out;
  archive_entry* e = nullptr;
  bool first = true;
  while (true) {
    const int r = archive_read_next_header(a, &e);
    if (first) out.compressed = archive_filter_code(a, 0) != ARCHIVE_FILTER_NONE;
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      if (first) {
        return absl::InvalidArgumentError(absl::StrCat("shard '", name, "' is not a tar Tally reads (",
                                                       archive_error_string(a) ? archive_error_string(a) : "unknown",
                                                       ")"));
      }
      out.ended_early = archive_error_string(a) ? archive_error_string(a) : "the archive ends early";
      break;
    }
    first = false;
    TarMember m;
    const char* path = archive_entry_pathname(e);
    m.name = path ? path : "";
    if (m.name.empty()) m.name = "(unnamed)";
    m.size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    const bool directory = archive_entry_filetype(e) == AE_IFDIR;
    m.regular = archive_entry_filetype(e) == AE_IFREG && archive_entry_hardlink(e) == nullptr;
    if (!m.regular) m.kind = EntryKind(e);
    if (m.regular && archive_entry_sparse_count(e) > 0) m.problem = "it is a sparse member";
    if (m.size < 0) m.problem = "its header gives a negative size";
    if (directory) {
      if (archive_read_data_skip(a) != ARCHIVE_OK) {
        out.ended_early = archive_error_string(a) ? archive_error_string(a) : "the archive ends early";
        break;
      }
      continue;
    }
    m.offset = archive_filter_bytes(a, 0);
    if (m.offset < 0) {
      m.offset = -1;
      if (m.problem.empty()) m.problem = "its header is inconsistent";
    }
    out.members.push_back(std::move(m));
    // A compressed member may be larger than the whole compressed shard.
    if (!ReadOrSkipData(a, out.compressed ? -1 : file_size, read_json, &out.members.back())) {
      out.ended_early = out.members.back().problem;
      break;
    }
  }
  // Uncompressed: every member's data inside the file.
  for (TarMember& m : out.members) {
    if (m.problem.empty() && m.regular && file_size >= 0 && !out.compressed && m.offset + m.size > file_size) {
      m.problem = absl::StrCat("its header claims ", m.size, " bytes, past the end of the shard (", file_size,
                               " bytes): truncated or corrupt");
    }
  }
  return out;
}

ArchivePtr NewTarReader() {
  ArchivePtr a(archive_read_new());
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  return a;
}

// JSON object fields as column values: strings as they are, other values as their JSON text.
absl::Status JsonFields(const std::string& text, std::vector<std::pair<std::string, std::string>>* out) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto e = parser.parse(text).get(doc); e) return absl::InvalidArgumentError(simdjson::error_message(e));
  simdjson::dom::object object;
  if (auto e = doc.get_object().get(object); e) return absl::InvalidArgumentError("not a JSON object");
  for (auto field : object) {
    std::string v;
    if (field.value.is_string()) {
      std::string_view s;
      if (auto e = field.value.get_string().get(s); e) return absl::InvalidArgumentError(simdjson::error_message(e));
      v = std::string(s);
    } else {
      v = simdjson::minify(field.value);
    }
    out->emplace_back(std::string(field.key), std::move(v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern, size_t max_results) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) return std::vector<std::string>{pattern};
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--shards: '", pattern, "' opens a brace it does not close"));
  }
  const std::string head = pattern.substr(0, open), body = pattern.substr(open + 1, close - open - 1);
  absl::StatusOr<std::vector<std::string>> tails = ExpandBraces(pattern.substr(close + 1), max_results);
  if (!tails.ok()) return tails.status();
  std::vector<std::string> items;
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    int64_t lo = 0, hi = 0;
    if (a.empty() || b.empty() || a.size() > 18 || b.size() > 18 || !absl::SimpleAtoi(a, &lo) ||
        !absl::SimpleAtoi(b, &hi) || lo < 0 || hi < lo || a.find_first_not_of("0123456789") != std::string::npos ||
        b.find_first_not_of("0123456789") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--shards: '{", body, "}' is not a range like {000000..000999}"));
    }
    if (static_cast<uint64_t>(hi - lo) >= max_results) {
      return absl::InvalidArgumentError(absl::StrCat("--shards: '{", body, "}' names more than ", max_results, " shards"));
    }
    const int width = static_cast<int>(a.size());
    for (int64_t v = lo; v <= hi; ++v) {
      std::string s = absl::StrCat(v);
      if (static_cast<int>(s.size()) < width) s.insert(0, width - s.size(), '0');
      items.push_back(std::move(s));
    }
  } else {
    items = absl::StrSplit(body, ',');
  }
  std::vector<std::string> out;
  for (const std::string& item : items) {
    for (const std::string& tail : *tails) {
      out.push_back(absl::StrCat(head, item, tail));
      if (out.size() > max_results) {
        return absl::InvalidArgumentError(absl::StrCat("--shards: '", pattern, "' names more than ", max_results, " shards"));
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(const std::vector<std::string>& patterns,
                                                             size_t max_shards) {
  std::vector<std::string> out;
  for (const std::string& pattern : patterns) {
    struct stat st;
    if (patterns.size() == 1 && !HasTarExtension(pattern) && pattern.find_first_of("{*?[") == std::string::npos &&
        stat(pattern.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      return ReadShardList(pattern, max_shards);
    }
    absl::StatusOr<std::vector<std::string>> braces = ExpandBraces(pattern, max_shards);
    if (!braces.ok()) return braces.status();
    for (const std::string& b : *braces) {
      absl::StatusOr<std::vector<std::string>> matched = Glob(b, max_shards);
      if (!matched.ok()) return matched.status();
      out.insert(out.end(), matched->begin(), matched->end());
      if (out.size() > max_shards) {
        return absl::InvalidArgumentError(absl::StrCat("--shards names more than ", max_shards, " shards"));
      }
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--shards names no shard");
  return out;
}

absl::StatusOr<TarListing> ListTarFd(int fd, const std::string& name, int64_t file_size, bool read_json) {
  ArchivePtr a = NewTarReader();
  if (archive_read_open_fd(a.get(), fd, 64 << 10) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("shard '", name, "' cannot be read (",
                                                   archive_error_string(a.get()) ? archive_error_string(a.get()) : "unknown", ")"));
  }
  return ListOpened(a.get(), name, file_size, read_json);
}

absl::StatusOr<TarListing> ListTarBytes(absl::string_view bytes, const std::string& name, bool read_json) {
  ArchivePtr a = NewTarReader();
  if (archive_read_open_memory(a.get(), bytes.data(), bytes.size()) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("shard '", name, "' cannot be read (",
                                                   archive_error_string(a.get()) ? archive_error_string(a.get()) : "unknown", ")"));
  }
  return ListOpened(a.get(), name, static_cast<int64_t>(bytes.size()), read_json);
}

namespace {

// A run of adjacent members with one key.
struct Sample {
  std::string key;
  std::vector<const TarMember*> members;
  std::vector<std::string> exts;
};

std::vector<Sample> GroupSamples(const TarListing& listing) {
  std::vector<Sample> samples;
  for (const TarMember& m : listing.members) {
    std::string key, ext;
    SplitMemberName(m.name, &key, &ext);
    if (samples.empty() || samples.back().key != key) samples.push_back({key, {}, {}});
    samples.back().members.push_back(&m);
    samples.back().exts.push_back(ext);
  }
  return samples;
}

// Each sample's JSON fields (or why its JSON member is not an object); the columns from the first
// listing seen.
void ReadJsonFields(const std::vector<Sample>& samples, SampleRowsState* state,
                    std::vector<std::vector<std::pair<std::string, std::string>>>* fields,
                    std::vector<std::string>* errors) {
  fields->assign(samples.size(), {});
  errors->assign(samples.size(), "");
  for (size_t s = 0; s < samples.size(); ++s) {
    for (size_t i = 0; i < samples[s].members.size(); ++i) {
      const TarMember& m = *samples[s].members[i];
      if (!absl::EqualsIgnoreCase(samples[s].exts[i], "json") || !m.problem.empty() || !m.regular) continue;
      if (absl::Status js = JsonFields(m.data, &(*fields)[s]); !js.ok()) {
        (*errors)[s] = absl::StrCat("member '", m.name, "' is not a JSON object (", js.message(), ")");
      }
    }
  }
  if (state->columns_fixed) return;
  for (const auto& f : *fields) {
    for (const auto& [k, v] : f) {
      if (std::find(state->columns.begin(), state->columns.end(), k) == state->columns.end()) state->columns.push_back(k);
    }
  }
}

// The sample's image, mask and prediction members (null where it has none); `fail` gets what is wrong.
struct Parts {
  const TarMember* image = nullptr;
  const TarMember* mask = nullptr;
  const TarMember* prediction = nullptr;
};
Parts FindParts(const Sample& sample, const SampleConventions& c, const std::function<void(std::string)>& fail) {
  Parts p;
  for (size_t i = 0; i < sample.members.size(); ++i) {
    const TarMember* m = sample.members[i];
    const std::string& ext = sample.exts[i];
    const TarMember** slot = ExtensionIn(ext, c.mask)         ? &p.mask
                             : ExtensionIn(ext, c.prediction) ? &p.prediction
                             : ExtensionIn(ext, c.image)      ? &p.image
                                                              : nullptr;
    if (slot == nullptr && !absl::EqualsIgnoreCase(ext, "json")) continue;
    if (!m->regular) {
      fail(absl::StrCat("member '", Printable(m->name), "' is ", m->kind, "; Tally reads regular members only"));
      continue;
    }
    if (!m->problem.empty()) {
      fail(absl::StrCat("member '", Printable(m->name), "' cannot be read: ", m->problem));
      continue;
    }
    if (slot == nullptr) continue;
    if (*slot != nullptr) {
      fail(absl::StrCat("two ", slot == &p.mask ? "mask" : slot == &p.prediction ? "prediction" : "image", " members ('",
                        Printable((*slot)->name), "', '", Printable(m->name), "')"));
      continue;
    }
    *slot = m;
  }
  if (c.model && p.image == nullptr) fail(absl::StrCat("no image member (", absl::StrJoin(c.image, ", "), ")"));
  if (p.mask == nullptr) fail(absl::StrCat("no mask member (", absl::StrJoin(c.mask, ", "), ")"));
  if (!c.model && p.prediction == nullptr) {
    fail(absl::StrCat("no prediction member (", absl::StrJoin(c.prediction, ", "), ")"));
  }
  return p;
}

}  // namespace

std::vector<ManifestRow> SampleRows(const TarListing& listing, const std::string& shard,
                                    const SampleConventions& conventions, int64_t first_index,
                                    SampleRowsState* state) {
  const std::vector<Sample> samples = GroupSamples(listing);
  std::vector<std::vector<std::pair<std::string, std::string>>> fields;
  std::vector<std::string> json_errors;
  if (conventions.keep_columns) ReadJsonFields(samples, state, &fields, &json_errors);
  state->columns_fixed = true;
  std::vector<ManifestRow> rows;
  rows.reserve(samples.size());
  for (size_t s = 0; s < samples.size(); ++s) {
    const Sample& sample = samples[s];
    ManifestRow row;
    row.index = first_index + static_cast<int64_t>(s);
    row.line = static_cast<int64_t>(s) + 1;
    row.id = sample.key;
    std::string error;
    auto fail = [&](std::string why) {
      if (error.empty()) error = absl::StrCat("shard '", shard, "', sample '", Printable(sample.key), "': ", why);
    };
    if (FirstInvalidUtf8(sample.key) >= 0 || FirstControlCharacter(sample.key, false) >= 0) {
      row.id = Printable(sample.key);
      fail("its key is not printable UTF-8 text");
    }
    if (row.id.size() > 4096) {
      row.id.resize(4096);
      fail("its key is longer than 4096 bytes");
    }
    if (!state->seen_keys.insert(sample.key).second) {
      fail("an earlier sample has the same key (a sample's members must be adjacent, and keys unique across shards)");
    }
    const Parts parts = FindParts(sample, conventions, fail);
    if (conventions.keep_columns && !json_errors[s].empty()) fail(json_errors[s]);
    auto set = [&](const TarMember* m, std::string* written, std::string* path) {
      if (m == nullptr) return;
      *written = absl::StrCat(shard, ":", m->name);
      *path = MemberLocator(shard, m->offset, m->size, listing.compressed, m->name);
    };
    set(parts.image, &row.image, &row.image_path);
    set(parts.mask, &row.mask, &row.mask_path);
    set(parts.prediction, &row.prediction, &row.prediction_path);
    if (row.image.empty() && row.mask.empty()) row.image = absl::StrCat(shard, ":", Printable(sample.key));
    if (conventions.keep_columns) {
      row.columns.assign(state->columns.size(), "");
      for (const auto& [k, v] : fields[s]) {
        auto it = std::find(state->columns.begin(), state->columns.end(), k);
        if (it != state->columns.end()) {
          row.columns[it - state->columns.begin()] = v;
        } else if (std::find(state->later_keys.begin(), state->later_keys.end(), k) == state->later_keys.end() &&
                   state->later_keys.size() < 16) {
          state->later_keys.push_back(k);
        }
      }
    }
    row.error = std::move(error);
    rows.push_back(std::move(row));
  }
  return rows;
}

ShardIndex::ShardIndex(std::vector<std::string> shards, SampleConventions conventions, int64_t max_rows)
    : shards_(std::move(shards)), conventions_(std::move(conventions)), max_rows_(max_rows) {
  description_ = shards_.size() == 1 ? shards_[0]
                                      : absl::StrCat(shards_.size(), " shards: ", shards_.front(), " ... ", shards_.back());
}

absl::StatusOr<std::unique_ptr<ShardIndex>> ShardIndex::Open(std::vector<std::string> shards,
                                                             SampleConventions conventions, int64_t max_rows) {
  if (shards.empty()) return absl::InvalidArgumentError("no shards");
  return std::unique_ptr<ShardIndex>(new ShardIndex(std::move(shards), std::move(conventions), max_rows));
}

absl::Status ShardIndex::IndexNext() {
  const std::string& path = shards_[next_shard_++];
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("shard", path);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("shard '", path, "': ", file.status().message()));
  }
  absl::StatusOr<TarListing> listing = ListTarFd(file->fd, path, file->size, conventions_.keep_columns);
  close(file->fd);
  if (!listing.ok()) return listing.status();
  tar_starts_.push_back(next_index_);
  tar_compressed_.push_back(listing->compressed);
  if (!listing->ended_early.empty()) {
    ended_early_.push_back(absl::StrCat("shard '", path, "' ends early after ", listing->members.size(), " members (",
                                        listing->ended_early, ")"));
  }
  std::string index_text = absl::StrCat(path, "\n");
  for (const TarMember& m : listing->members) absl::StrAppend(&index_text, m.name, "\t", m.offset, "\t", m.size, "\n");
  digests_ += Sha256Hex(index_text);
  pending_ = SampleRows(*listing, path, conventions_, next_index_, &state_);
  pending_at_ = 0;
  if (next_index_ + static_cast<int64_t>(pending_.size()) > max_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("the shards hold more than ", max_rows_,
                                                   " samples (tallyd --max-manifest-rows)"));
  }
  return absl::OkStatus();
}

absl::Status ShardIndex::NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) {
  rows->clear();
  while (rows->size() < max_rows) {
    if (pending_at_ == pending_.size()) {
      if (next_shard_ == shards_.size()) break;
      if (absl::Status s = IndexNext(); !s.ok()) return s;
      continue;
    }
    rows->push_back(std::move(pending_[pending_at_++]));
    next_index_++;
  }
  return absl::OkStatus();
}

std::vector<std::string> ShardIndex::Warnings() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < ended_early_.size() && i < 8; ++i) out.push_back(ended_early_[i]);
  if (ended_early_.size() > 8) out.push_back(absl::StrCat(ended_early_.size() - 8, " more shards end early"));
  if (!state_.later_keys.empty()) {
    out.push_back(absl::StrCat("JSON field(s) ", absl::StrJoin(state_.later_keys, ", "),
                               " first appear after the first shard and are not columns (the columns are the first "
                               "shard's JSON fields: ",
                               state_.columns.empty() ? "none" : absl::StrJoin(state_.columns, ", "), ")"));
  }
  return out;
}

std::string ShardIndex::IndexSha256() const { return Sha256Hex(digests_); }

}  // namespace tally
