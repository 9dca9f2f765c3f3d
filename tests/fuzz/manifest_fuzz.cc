// The manifest parser on arbitrary bytes: no crash, rows numbered in order, and no error message
// that carries the header's bytes (a non-manifest must not leak its content, SECURITY.md).
#include "common/sources/manifest.h"
#include "fuzz_util.h"
#include "base/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = FuzzInput(data, size);
  tally::ManifestLimits limits;
  limits.max_rows = 5000;
  absl::StatusOr<tally::Manifest> m = tally::ParseManifest(text, "/data", "fuzz.csv", limits);
  if (!m.ok()) {
    // A first line with a character no error template uses (so it cannot be the template's own
    // words) must never be echoed.
    const size_t eol = text.find('\n');
    const std::string first = text.substr(0, eol);
    if (first.size() >= 8 && first.find_first_of("~^`|") != std::string::npos && first.find(',') == std::string::npos &&
        first.find('"') == std::string::npos) {
      FUZZ_CHECK(std::string(m.status().message()).find(first) == std::string::npos);
    }
    return 0;
  }
  for (size_t i = 0; i < m->rows.size(); ++i) {
    FUZZ_CHECK(m->rows[i].index == static_cast<int64_t>(i));
    if (m->rows[i].error.empty() && !m->has_prediction) FUZZ_CHECK(!m->rows[i].image.empty());
    FUZZ_CHECK(tally::FirstInvalidUtf8(m->rows[i].id) < 0);
  }
  return 0;
}
