// tally store stats|ls|export|gc DIR: the prediction store as a thing people look after
// (docs/prediction-store.md). stats: entries and bytes by model and settings; ls: every entry from
// its header; export --out D: every entry as a PNG label map (a volume: NIfTI) any viewer opens; gc --max-bytes N:
// drops the least recently used entries (written or scored from last longest ago) until the store
// holds at most N bytes, and temporary files a killed writer left.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flag_util.h"
#include "base/json_writer.h"
#include "client/verbs/verbs.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/formats/png.h"
#include "common/formats/volume.h"
#include "common/store/store_gc.h"
#include "common/store/store_keys.h"

namespace tally {
namespace {

using Entry = StoreFile;

int Stats(const std::vector<Entry>& entries, bool json) {
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> groups;  // -> (entries, bytes)
  int64_t bytes = 0;
  for (const Entry& e : entries) {
    auto& g = groups[{e.model, e.settings}];
    ++g.first;
    g.second += e.info.file_bytes;
    bytes += e.info.file_bytes;
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("entries", static_cast<int64_t>(entries.size())).Field("bytes", bytes);
    w.Key("groups").BeginArray();
    for (const auto& [key, g] : groups) {
      w.BeginObject().Field("model", key.first).Field("settings", key.second).Field("entries", g.first);
      w.Field("bytes", g.second).EndObject();
    }
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-16s  %-16s  %10s  %14s  %10s\n", "model", "settings", "entries", "bytes", "bytes/entry");
  for (const auto& [key, g] : groups) {
    std::cout << absl::StrFormat("%-16s  %-16s  %10d  %14d  %10d\n", key.first, key.second, g.first, g.second,
                                 g.second / std::max<int64_t>(1, g.first));
  }
  std::cout << absl::StrFormat("%d entries, %d bytes\n", entries.size(), bytes);
  return 0;
}

int List(const std::vector<Entry>& entries, bool json) {
  JsonWriter w;
  if (json) w.BeginArray();
  for (const Entry& e : entries) {
    if (json) {
      w.BeginObject().Field("model", e.model).Field("settings", e.settings).Field("input", e.input);
      w.Field("depth", e.info.depth).Field("height", e.info.height).Field("width", e.info.width);
      w.Field("classes", e.info.classes).Field("scores", e.info.score_bits > 0);
      w.Field("bytes", e.info.file_bytes).Field("path", e.path).EndObject();
    } else {
      const std::string size = e.info.depth > 1 ? absl::StrFormat("%dx%dx%d", e.info.depth, e.info.height, e.info.width)
                                                : absl::StrFormat("%dx%d", e.info.height, e.info.width);
      std::cout << absl::StrFormat("%s  %s  %s  %s  %d classes%s  %d bytes\n", e.model, e.settings, e.input, size,
                                   e.info.classes, e.info.score_bits > 0 ? " + scores" : "", e.info.file_bytes);
    }
  }
  if (json) std::cout << w.EndArray().str() << "\n";
  return 0;
}

// One entry into `dir`: a 2D label map as <input>.png (8-bit up to 256 classes, else 16-bit), a
// volume as <input>.nii.gz (uint16 labels, unit spacing: the store keeps no geometry), and kept
// scores as <input>.scores.png (16-bit, the quantised probability).
absl::Status ExportEntry(const std::string& dir, const std::string& input, const StoredPrediction& p) {
  RETURN_IF_ERROR(MakeDirs(dir));
  const std::string base = absl::StrCat(dir, "/", input);
  if (p.depth > 1) {
    VolumeGeometry g;
    g.depth = p.depth;
    g.height = p.height;
    g.width = p.width;
    for (int i = 0; i < 3; ++i) g.affine[i][i] = 1;
    return WriteNiftiLabels(base + ".nii.gz", g, p.labels.data(), 512 /* DT_UINT16 */);
  }
  if (p.classes <= 256) {
    std::vector<uint8_t> labels(p.labels.begin(), p.labels.end());
    RETURN_IF_ERROR(WritePng(base + ".png", p.height, p.width, 1, 8, labels.data(), 1));
  } else {
    RETURN_IF_ERROR(WritePng(base + ".png", p.height, p.width, 1, 16, p.labels.data(), 1));
  }
  if (!p.scores.empty()) return WritePng(base + ".scores.png", p.height, p.width, 1, 16, p.scores.data(), 1);
  return absl::OkStatus();
}

// Every entry that verifies (ExportEntry) beside a copy of its folder's settings. Entries are read,
// not used: gc's order stays.
int Export(const std::string& root, const StoreWalk& walk, const std::string& out) {
  if (out.empty()) {
    std::cerr << "tally store export: --out DIR says where the PNG and NIfTI files go\n";
    return 2;
  }
  int64_t written = 0, skipped = 0;
  std::map<std::string, absl::StatusOr<StoredSettings>> folders;
  for (const StoreFile& e : walk.entries) {
    const std::string folder = e.model + "/" + e.settings;
    auto it = folders.find(folder);
    if (it == folders.end()) {
      it = folders.emplace(folder, ReadSettingsFolder(absl::StrCat(root, "/v1/", folder), "")).first;
    }
    absl::StatusOr<StoredPrediction> p =
        it->second.ok()
            ? ReadStoreEntry(e.path, StoreKey{it->second->model, it->second->settings, e.input}, e.info.height,
                             e.info.width, e.info.depth)
            : absl::StatusOr<StoredPrediction>(it->second.status());
    absl::Status s = p.status();
    if (s.ok()) s = ExportEntry(absl::StrCat(out, "/", folder), e.input, *p);
    if (!s.ok()) {
      std::cerr << "tally store export: " << e.path << ": " << s.message() << "\n";
      ++skipped;
      continue;
    }
    ++written;
  }
  for (const auto& [folder, settings] : folders) {
    if (settings.ok()) {
      (void)WriteFileAtomically(absl::StrCat(out, "/", folder, "/settings"), SettingsFileText(settings->model, settings->text));
    }
  }
  std::cout << absl::StrFormat("exported %d entries to %s (%d skipped)\n", written, out, skipped);
  return skipped > 0 ? 1 : 0;
}

int Collect(StoreWalk walk, int64_t max_bytes) {
  const size_t total = walk.entries.size();
  const StoreCollection c = CollectStore(std::move(walk), max_bytes);
  std::cout << absl::StrFormat("dropped %d of %d entries (%d bytes; %d left), %d stale temporary files\n", c.dropped,
                               total, c.freed, c.left, c.temporaries);
  return 0;
}

}  // namespace

int StoreVerb(const StoreFlags& flags) {
  const std::vector<std::string>& p = flags.positional;
  if (p.size() != 2 || (p[0] != "stats" && p[0] != "ls" && p[0] != "gc" && p[0] != "export")) {
    std::cerr << "usage: tally store stats|ls|export|gc DIR [--out D] [--max-bytes N] [--json]\n";
    return 2;
  }
  struct stat st;
  if (stat((p[1] + "/v1").c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::cerr << "tally store: '" << p[1] << "' is not a prediction store (no v1/ folder in it)\n";
    return 1;
  }
  StoreWalk walk = WalkStore(p[1]);
  for (const std::string& e : walk.errors) std::cerr << "tally store: " << e << "\n";
  if (p[0] == "stats") return Stats(walk.entries, flags.json);
  if (p[0] == "ls") return List(walk.entries, flags.json);
  if (p[0] == "export") return Export(p[1], walk, flags.out);
  if (flags.max_bytes.empty()) {
    std::cerr << "tally store gc: --max-bytes N (e.g. 200GiB) says how much the store may keep\n";
    return 2;
  }
  absl::StatusOr<int64_t> max_bytes = ParseByteSize("--max-bytes", flags.max_bytes);
  if (!max_bytes.ok()) {
    std::cerr << "tally store gc: " << max_bytes.status().message() << "\n";
    return 2;
  }
  return Collect(std::move(walk), *max_bytes);
}

}  // namespace tally
