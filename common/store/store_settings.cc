#include "common/store/store_settings.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "common/security/sha256.h"

namespace tally {
namespace {

constexpr char kSettingsMagic[] = "tally-store-settings-v1";

bool IsHexDigest(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

}  // namespace

std::vector<std::pair<std::string, std::string>> StoredSettings::Lines() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t space = line.find(' ');
    out.emplace_back(std::string(line.substr(0, space)),
                     space == absl::string_view::npos ? std::string() : std::string(line.substr(space + 1)));
  }
  return out;
}

std::string StoredSettings::RunKey() const {
  std::string key;
  for (const auto& [k, v] : Lines()) {
    if (SettingsFlag(k).empty() && k != "jpeg") absl::StrAppend(&key, k, " ", v, "\n");
  }
  return key;
}

std::string SettingsFlag(const std::string& key) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"precision", "--precision"},  {"input", "--input-size"},        {"mean", "--mean"},
      {"std", "--std"},              {"label_map", "--label-map"},     {"compile", "--compile"},
      {"window", "--window"},        {"intensity", "--intensity"},     {"sliding_window", "--sliding-window"},
      {"overlap", "--overlap"},      {"sw_batch", "--sw-batch-size"},  {"keep_dtype", "--keep-dtype"}};
  for (const auto& [k, flag] : kFlags) {
    if (key == k) return flag;
  }
  return "";
}

std::string SettingsFilePath(const std::string& root, const std::string& model, const std::string& settings) {
  return absl::StrCat(root, "/v1/", model.substr(0, 16), "/", settings.substr(0, 16), "/settings");
}

std::string SettingsFileText(const std::string& model, const std::string& text) {
  return absl::StrCat(kSettingsMagic, "\nmodel ", model, "\n", text);
}

absl::StatusOr<StoredSettings> ParseSettingsFile(const std::string& bytes, const std::string& model,
                                                 const std::string& folder_name) {
  if (bytes.size() > static_cast<size_t>(kMaxSettingsFileBytes)) {
    return absl::DataLossError(absl::StrCat("a settings file of ", bytes.size(), " bytes (at most ",
                                            kMaxSettingsFileBytes, ")"));
  }
  const std::string magic = absl::StrCat(kSettingsMagic, "\nmodel ");
  if (!absl::StartsWith(bytes, magic)) return absl::DataLossError("not a Tally store settings file");
  const size_t end = bytes.find('\n', magic.size());
  StoredSettings s;
  s.model = bytes.substr(magic.size(), end == std::string::npos ? std::string::npos : end - magic.size());
  if (end == std::string::npos || !IsHexDigest(s.model) || (!model.empty() && s.model != model)) {
    return absl::DataLossError("the settings file names another model, or none");
  }
  s.text = bytes.substr(end + 1);
  s.settings = Sha256Hex(s.text);
#ifndef TALLY_FUZZING  // Digests do not stop mutated inputs.
  if (folder_name.size() != 16 || s.settings.compare(0, 16, folder_name) != 0) {
    return absl::DataLossError("the settings file does not verify against its folder's name");
  }
#endif
  return s;
}

absl::StatusOr<StoredSettings> ReadSettingsFolder(const std::string& folder, const std::string& model) {
  const std::string path = folder + "/settings";
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return absl::NotFoundError(path + ": no settings file");
  if (st.st_size > kMaxSettingsFileBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.st_size, " bytes, more than a settings file holds"));
  }
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return absl::NotFoundError(path + ": no settings file");
  absl::StatusOr<StoredSettings> s = ParseSettingsFile(*bytes, model, folder.substr(folder.rfind('/') + 1));
  if (!s.ok()) return absl::DataLossError(absl::StrCat(path, ": ", s.status().message()));
  s->folder = folder;
  return s;
}

std::vector<StoredSettings> ListStoredSettings(const std::string& root, const std::string& model) {
  std::vector<StoredSettings> out;
  const std::string dir = absl::StrCat(root, "/v1/", model.substr(0, 16));
  for (const std::string& name : ListDirectory(dir)) {
    absl::StatusOr<StoredSettings> s = ReadSettingsFolder(absl::StrCat(dir, "/", name), model);
    if (s.ok()) out.push_back(*std::move(s));
  }
  return out;
}

}  // namespace tally
