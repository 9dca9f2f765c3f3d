// Prediction store settings files (common/store/store_settings.cc): read from a folder other hosts
// and users write to, before `tally rescore` believes what made a folder's entries. The first byte
// says whether the model is named (bit 0); the rest is the file. A parsed file names a 64-hex model,
// splits into lines whose keys hold no space or newline, and writes back to a file that parses
// the same. (The fuzz build skips the folder name's digest check, so mutations get past it.)
#include "common/store/store_settings.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string model = (data[0] & 1) ? std::string(64, 'a') : std::string();
  absl::StatusOr<tally::StoredSettings> s = tally::ParseSettingsFile(FuzzInput(data + 1, size - 1), model,
                                                                     "0123456789abcdef");
  if (!s.ok()) return 0;
  FUZZ_CHECK(s->model.size() == 64 && (model.empty() || s->model == model));
  for (const auto& [k, v] : s->Lines()) {
    FUZZ_CHECK(k.find(' ') == std::string::npos && k.find('\n') == std::string::npos);
    FUZZ_CHECK(v.find('\n') == std::string::npos);
    (void)tally::SettingsFlag(k);
  }
  (void)s->RunKey();
  absl::StatusOr<tally::StoredSettings> again =
      tally::ParseSettingsFile(tally::SettingsFileText(s->model, s->text), s->model, "0123456789abcdef");
  FUZZ_CHECK(again.ok() && again->text == s->text && again->settings == s->settings);
  return 0;
}
