// The `settings` file of each settings folder of a prediction store (docs/prediction-store.md "What
// an entry is keyed on"): "tally-store-settings-v1", "model <model digest>", then the settings text,
// "key value" lines whose SHA-256 is the folder's settings digest. It says what made the folder's
// entries, so `tally rescore` finds them without the GPU and names a flag that differs. The files
// sit in a folder other hosts and users write to: each is held to 64 KiB before it is read and
// verified against its folder's name before it is believed.
#ifndef TALLY_COMMON_STORE_STORE_SETTINGS_H_
#define TALLY_COMMON_STORE_STORE_SETTINGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

// The most bytes a settings file may hold.
inline constexpr int64_t kMaxSettingsFileBytes = 1 << 16;

// One settings folder of a store, from its `settings` file.
struct StoredSettings {
  std::string model;     // Hex digest.
  std::string settings;  // Hex digest (SHA-256 of `text`).
  std::string text;      // JobSettingsText + RunSettingsText (common/store/store_keys.h).
  std::string folder;
  // The text's lines, key and value.
  std::vector<std::pair<std::string, std::string>> Lines() const;
  // The run's part: the lines after the job's (decode, device, batch, layout), without the
  // per-batch JPEG line; two folders with the same RunKey come from one run.
  std::string RunKey() const;
};

// The `settings` file's path and text for a settings folder.
std::string SettingsFilePath(const std::string& root, const std::string& model, const std::string& settings);
std::string SettingsFileText(const std::string& model, const std::string& text);

// A settings file's bytes, for the folder named `folder_name` (16 hex) of a model: the model the file
// names (any, when `model` is empty; else it must be that one) and the text, whose digest must
// begin with the folder's name. DATA_LOSS, saying why, otherwise.
absl::StatusOr<StoredSettings> ParseSettingsFile(const std::string& bytes, const std::string& model,
                                                 const std::string& folder_name);

// The settings folder `folder` (ROOT/v1/<model 16>/<settings 16>) from its file: read when it is a
// regular file of at most kMaxSettingsFileBytes, then parsed. NOT_FOUND when there is none.
absl::StatusOr<StoredSettings> ReadSettingsFolder(const std::string& folder, const std::string& model);

// Every settings folder the store holds for `model` (sorted by digest); folders whose file is
// missing or does not verify are skipped.
std::vector<StoredSettings> ListStoredSettings(const std::string& root, const std::string& model);

// The flag a settings line's key comes from ("input" -> "--input-size"), or "" for run lines.
std::string SettingsFlag(const std::string& key);

}  // namespace tally

#endif  // TALLY_COMMON_STORE_STORE_SETTINGS_H_
