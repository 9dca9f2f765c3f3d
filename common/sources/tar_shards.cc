#include "common/sources/tar_shards.h"

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
#include <utility>

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
  bool first = true;
  int column = -1;  // A CSV list (a header first): the column of the shards' paths.
  for (absl::string_view l : absl::StrSplit(*text, '\n')) {
    ++line;
    l = absl::StripAsciiWhitespace(l);
    if (l.empty() || l[0] == '#') continue;
    if (FirstControlCharacter(l, false) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("shard list '", path, "' line ", line, ": a control character"));
    }
    if (std::exchange(first, false)) {
      // A CSV header ("path", "shard,samples"): then the column named so, else the first.
      auto named = [](absl::string_view n) {
        const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(n));
        return lower == "path" || lower == "shard" || lower == "shards" || lower == "url" || lower == "file" ||
               lower == "tar";
      };
      if (absl::StrContains(l, ',') || named(l)) {
        const std::vector<absl::string_view> names = absl::StrSplit(l, ',');
        column = 0;
        for (size_t i = 0; i < names.size(); ++i) {
          if (named(names[i])) column = static_cast<int>(i);
        }
        continue;
      }
    }
    if (column >= 0) {
      const std::vector<absl::string_view> fields = absl::StrSplit(l, ',');
      if (column >= static_cast<int>(fields.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard list '", path, "' line ", line, ": no column ", column + 1, " (its header names it)"));
      }
      l = absl::StripAsciiWhitespace(fields[column]);
      if (l.size() >= 2 && l.front() == '"' && l.back() == '"') l = l.substr(1, l.size() - 2);
    }
    if (out.size() == max) {
      return absl::InvalidArgumentError(absl::StrCat("shard list '", path, "' names more than ", max,
                                                     " shards (line ", line, "); the limit of one job"));
    }
    out.push_back(ResolvePath(Dirname(path), std::string(l)));
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

// JSON object fields as column values: strings as they are, other values as their JSON text. A
// sample's fields are held to a manifest row's limits (ManifestLimits: fields, bytes a field).
absl::Status JsonFields(const std::string& text, std::vector<std::pair<std::string, std::string>>* out) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto e = parser.parse(text).get(doc); e) return absl::InvalidArgumentError(simdjson::error_message(e));
  simdjson::dom::object object;
  if (auto e = doc.get_object().get(object); e) return absl::InvalidArgumentError("not a JSON object");
  const ManifestLimits limits;
  for (auto field : object) {
    if (out->size() >= limits.max_fields) {
      out->clear();
      return absl::InvalidArgumentError(absl::StrCat("more than ", limits.max_fields, " fields (a row's limit)"));
    }
    if (field.key.size() > limits.max_field_bytes) {
      out->clear();
      return absl::InvalidArgumentError(absl::StrCat("a field name of ", field.key.size(), " bytes (the limit is ",
                                                     limits.max_field_bytes, ")"));
    }
    std::string v;
    if (field.value.is_string()) {
      std::string_view s;
      if (auto e = field.value.get_string().get(s); e) return absl::InvalidArgumentError(simdjson::error_message(e));
      v = std::string(s);
    } else {
      v = simdjson::minify(field.value);
    }
    if (v.size() > limits.max_field_bytes) {
      const std::string key(field.key.substr(0, 64));
      out->clear();
      return absl::InvalidArgumentError(absl::StrCat("field '", key, "' holds ", v.size(), " bytes (the limit is ",
                                                     limits.max_field_bytes, ")"));
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
  const size_t max_columns = ManifestLimits{}.max_fields;
  for (const auto& f : *fields) {
    for (const auto& [k, v] : f) {
      if (state->columns.size() < max_columns &&
          std::find(state->columns.begin(), state->columns.end(), k) == state->columns.end()) {
        state->columns.push_back(k);
      }
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
    // A member whose own name could not be read (too long) may be any of the sample's parts.
    if (slot == nullptr && !absl::EqualsIgnoreCase(ext, "json") && !m->name_lost) continue;
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
                                    SampleRowsState* state, const ShardIdentity& identity) {
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
    if (state->shards.empty() || state->shards.back() != shard) state->shards.push_back(shard);
    const auto [first, added] =
        state->seen_keys.emplace(sample.key, static_cast<uint32_t>(state->shards.size() - 1));
    if (!added) {
      const std::string& where = state->shards[first->second];
      fail(absl::StrCat("its key is that of an earlier sample ",
                        where == shard ? std::string("in this shard") : absl::StrCat("in shard '", where, "'"),
                        " (a sample's members must be adjacent, and keys unique across shards)"));
    }
    const Parts parts = FindParts(sample, conventions, fail);
    if (conventions.keep_columns && !json_errors[s].empty()) fail(json_errors[s]);
    auto set = [&](const TarMember* m, std::string* written, std::string* path) {
      if (m == nullptr) return;
      *written = absl::StrCat(shard, ":", m->name);
      *path = MemberLocator(shard, m->offset, m->size, listing.compressed, m->name, identity);
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
  TarListOptions list;
  list.read_json = conventions_.keep_columns;
  list.max_member_bytes = conventions_.max_member_bytes;
  list.deadline = conventions_.deadline;
  const ShardIdentity identity = IdentityOf(file->fd);
  absl::StatusOr<TarListing> listing = ListTarFd(file->fd, path, file->size, list);
  close(file->fd);
  if (!listing.ok()) return listing.status();
  tar_starts_.push_back(next_index_);
  tar_compressed_.push_back(listing->compressed);
  std::string index_text = absl::StrCat(path, "\n");
  for (const TarMember& m : listing->members) absl::StrAppend(&index_text, m.name, "\t", m.offset, "\t", m.size, "\n");
  digests_ += Sha256Hex(index_text);
  pending_ = SampleRows(*listing, path, conventions_, next_index_, &state_, identity);
  pending_at_ = 0;
  if (!listing->ended_early.empty()) {
    // What the index could not reach is in no row: one more row says so, failed, and the job is
    // not complete (TarListing::ended_early).
    const std::string why = absl::StrCat("shard '", path, "' ends early after ", listing->members.size(), " members: ",
                                         listing->ended_early, "; whatever samples follow are not in the job");
    ended_early_.push_back(why);
    ManifestRow row;
    row.index = next_index_ + static_cast<int64_t>(pending_.size());
    row.line = static_cast<int64_t>(pending_.size()) + 1;
    row.id = absl::StrCat(path, ":(the rest)");
    row.image = row.id;
    row.error = why;
    pending_.push_back(std::move(row));
  }
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
  if (!ended_early_.empty()) {
    out.push_back(absl::StrCat(ended_early_.size(), " shard(s) end early; their samples after that point are in no ",
                               "row (each has a failed row saying so), so the job cannot be complete"));
  }
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
