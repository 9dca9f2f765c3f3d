// tally verify OUT: reads a finished job's inputs again and names every row whose bytes differ now
// from what it was scored from (per_image.csv's *_xxh128 columns). The rows come from the job's
// source as report.json records it (`source`: a manifest, tar shards, two folders, a COCO or
// panoptic file), rebuilt by the same code that made them (common/sources), so a shard is indexed
// again and a member that moved is read where it is now.
#include <sys/stat.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <simdjson.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/file_util.h"
#include "client/client.h"
#include "client/verbs/verbs.h"
#include "common/security/data_roots.h"
#include "common/sources/coco_rows.h"
#include "common/sources/csv.h"
#include "common/sources/folder_pairs.h"
#include "common/sources/manifest.h"
#include "common/sources/row_files.h"
#include "common/sources/tar_shards.h"

namespace tally {
namespace {

struct Recorded {
  std::string id;
  std::string digest[3];  // image, mask, prediction: hex, "" for none.
};
constexpr const char* kRoles[3] = {"image", "mask", "prediction"};

// per_image.csv's rows by index (the first line of each: digests repeat on every class's line).
absl::Status ReadRecorded(const std::string& path, std::map<int64_t, Recorded>* out) {
  ClientFileLimits limits;
  limits.max_bytes = int64_t{64} << 30;
  limits.max_bytes_flag = "(per_image.csv)";
  ASSIGN_OR_RETURN(std::string text, ReadClientFile("per_image.csv", path, limits));
  CsvReader csv(text, path, ManifestLimits{});
  CsvRecord rec;
  absl::Status s;
  std::vector<std::string> header;
  int col[5] = {-1, -1, -1, -1, -1};  // index, id, image, mask, prediction digests.
  while (csv.Next(&rec, &s)) {
    if (header.empty()) {
      header = rec.fields;
      for (size_t i = 0; i < header.size(); ++i) {
        const std::string& h = header[i];
        const int k = h == "index" ? 0 : h == "id" ? 1 : h == "image_xxh128" ? 2 : h == "mask_xxh128" ? 3
                      : h == "prediction_xxh128" ? 4 : -1;
        if (k >= 0) col[k] = static_cast<int>(i);
      }
      if (col[0] < 0 || col[3] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("'", path, "' has no index and *_xxh128 columns: a report of ",
                                                       "a Tally that recorded no digests"));
      }
      continue;
    }
    int64_t index = -1;
    if (static_cast<int>(rec.fields.size()) <= col[0] || !absl::SimpleAtoi(rec.fields[col[0]], &index)) continue;
    if (out->count(index)) continue;
    Recorded& r = (*out)[index];
    if (col[1] >= 0 && col[1] < static_cast<int>(rec.fields.size())) r.id = rec.fields[col[1]];
    for (int k = 0; k < 3; ++k) {
      const int c = col[2 + k];
      if (c >= 0 && c < static_cast<int>(rec.fields.size())) r.digest[k] = rec.fields[c];
    }
  }
  return s;
}

std::string Str(simdjson::dom::element e, const char* key) {
  std::string_view v;
  return e[key].get_string().get(v) ? std::string() : std::string(v);
}

std::vector<std::string> Strs(simdjson::dom::element e, const char* key) {
  std::vector<std::string> out;
  simdjson::dom::array a;
  if (e[key].get_array().get(a)) return out;
  for (auto v : a) {
    std::string_view s;
    if (!v.get_string().get(s)) out.emplace_back(s);
  }
  return out;
}

// The job's rows as its source gives them now.
absl::StatusOr<std::unique_ptr<RowSource>> Rebuild(simdjson::dom::element source, std::string* kind) {
  *kind = Str(source, "kind");
  bool model = false;
  if (source["model"].get_bool().get(model)) model = false;
  if (*kind == "shards") {
    SampleConventions c;
    c.model = model;
    if (auto v = Strs(source, "image_extensions"); !v.empty()) c.image = v;
    if (auto v = Strs(source, "mask_extensions"); !v.empty()) c.mask = v;
    if (auto v = Strs(source, "prediction_extensions"); !v.empty()) c.prediction = v;
    ASSIGN_OR_RETURN(std::vector<std::string> shards, ExpandShardPatterns(Strs(source, "shards"), 100'000));
    ASSIGN_OR_RETURN(std::unique_ptr<ShardIndex> index, ShardIndex::Open(shards, c, INT64_MAX));
    return std::unique_ptr<RowSource>(std::move(index));
  }
  if (*kind == "coco" || *kind == "panoptic") {
    v1::JobSpec spec;
    spec.set_coco(Str(source, "coco"));
    spec.set_coco_images(Str(source, "coco_images"));
    spec.set_coco_panoptic(Str(source, "coco_panoptic"));
    spec.set_panoptic_dir(Str(source, "panoptic_dir"));
    spec.set_panoptic_predictions(Str(source, "panoptic_predictions"));
    spec.set_panoptic_predictions_dir(Str(source, "panoptic_predictions_dir"));
    ClientFileLimits limits;
    limits.max_bytes = int64_t{16} << 30;
    absl::StatusOr<std::unique_ptr<RowsInMemory>> rows =
        *kind == "coco" ? CocoImageRows(INT64_MAX, limits, &spec) : PanopticImageRows(INT64_MAX, limits, &spec);
    if (!rows.ok()) return rows.status();
    return std::unique_ptr<RowSource>(std::move(*rows));
  }
  const std::string manifest = Str(source, "manifest");
  struct stat st;
  if (*kind == "folders" && stat(manifest.c_str(), &st) != 0) {  // The manifest kept with the job is gone: pair again.
    ASSIGN_OR_RETURN(PairedFolders pairs, PairImagesAndMasks(Str(source, "images"), Str(source, "masks"),
                                                             Str(source, "mask_suffix"), 50'000'000));
    ASSIGN_OR_RETURN(std::unique_ptr<ManifestReader> reader, ManifestReader::FromText(pairs.manifest, "/", "folders"));
    return std::unique_ptr<RowSource>(std::move(reader));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ManifestReader> reader, ManifestReader::Open(manifest));
  return std::unique_ptr<RowSource>(std::move(reader));
}

// The digest of a file as it is now, or why it cannot be read.
absl::StatusOr<std::string> DigestNow(const std::string& path) {
  if (IsNiftiPath(path)) {
    ASSIGN_OR_RETURN(FileFacts facts, DigestFile(path));
    return Hex128(facts.xxh128);
  }
  std::string bytes;
  FileFacts facts;
  RETURN_IF_ERROR(ReadFileBytes(path, &bytes, &facts));
  return Hex128(facts.xxh128);
}

// Checks one row's files: the number that differ (each printed).
int CheckRow(const ManifestRow& row, const Recorded& rec) {
  const std::string* paths[3] = {&row.image_path, &row.mask_path, &row.prediction_path};
  int differ = 0;
  for (int k = 0; k < 3; ++k) {
    if (rec.digest[k].empty()) continue;
    const std::string& path = *paths[k];
    absl::StatusOr<std::string> now =
        path.empty() ? absl::NotFoundError("the source gives the row no such file now") : DigestNow(path);
    if (now.ok() && *now == rec.digest[k]) continue;
    ++differ;
    std::cout << "row " << row.index << " (id '" << rec.id << "'): " << kRoles[k] << " '" << DisplayPath(path) << "' "
              << (now.ok() ? absl::StrCat("differs: scored from ", rec.digest[k], ", now ", *now)
                           : absl::StrCat("cannot be read now: ", now.status().message()))
              << "\n";
  }
  return differ;
}

}  // namespace

int VerifyVerb(const VerifyFlags& flags) {
  if (flags.positional.size() != 1) {
    std::cerr << "tally verify: give the report folder (tally verify OUT)\n";
    return kExitUsage;
  }
  const std::string dir = flags.positional[0];
  simdjson::dom::parser parser;
  simdjson::dom::element report, source;
  if (parser.load(dir + "/report.json").get(report) || report["source"].get(source)) {
    std::cerr << "tally verify: '" << dir << "/report.json' is missing, unreadable or records no source\n";
    return kExitFailed;
  }
  std::map<int64_t, Recorded> recorded;
  if (absl::Status s = ReadRecorded(dir + "/per_image.csv", &recorded); !s.ok()) {
    std::cerr << "tally verify: " << s.message() << "\n";
    return kExitFailed;
  }
  std::string kind;
  absl::StatusOr<std::unique_ptr<RowSource>> rows = Rebuild(source, &kind);
  if (!rows.ok()) {
    std::cerr << "tally verify: the job's " << kind << " cannot be read now: " << rows.status().message() << "\n";
    return kExitFailed;
  }
  int64_t checked = 0, differ = 0;
  std::vector<ManifestRow> batch;
  while (true) {
    if (absl::Status s = (*rows)->NextBatch(4096, &batch); !s.ok()) {
      std::cerr << "tally verify: " << s.message() << "\n";
      return kExitFailed;
    }
    if (batch.empty()) break;
    for (const ManifestRow& row : batch) {
      auto it = recorded.find(row.index);
      if (it == recorded.end()) continue;
      ++checked;
      differ += CheckRow(row, it->second) > 0;
      recorded.erase(it);
    }
  }
  for (const auto& [index, rec] : recorded) {
    ++differ;
    std::cout << "row " << index << " (id '" << rec.id << "'): no longer in the job's " << kind << "\n";
  }
  std::cout << "tally verify: " << checked + static_cast<int64_t>(recorded.size()) << " rows, " << differ
            << (differ == 1 ? " differs" : " differ") << " from what was scored\n";
  return differ == 0 ? kExitSucceeded : kExitFailed;
}

}  // namespace tally
