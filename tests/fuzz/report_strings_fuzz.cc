// The report writers' handling of odd strings (ids, paths, error texts): JSON string escaping
// must give a valid JSON string of valid UTF-8 whatever the bytes, a CSV field must read back
// as exactly the bytes written, and an untrusted name made printable (base/text.h Printable) must
// be valid UTF-8 without control characters.
#include <string>

#include "common/sources/manifest.h"
#include "fuzz_util.h"
#include "base/json_writer.h"
#include "base/text.h"

namespace {

// Parses one JSON string literal; false if it is not one. Checks RFC 8259's rules: no raw control
// characters, only the defined escapes, valid UTF-8.
bool ValidJsonString(const std::string& s) {
  if (s.size() < 2 || s.front() != '"' || s.back() != '"') return false;
  const std::string body = s.substr(1, s.size() - 2);
  if (tally::FirstInvalidUtf8(body) >= 0) return false;
  for (size_t i = 0; i < body.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(body[i]);
    if (c < 0x20) return false;
    if (c == '"') return false;
    if (c != '\\') continue;
    if (++i >= body.size()) return false;
    const char e = body[i];
    if (e == 'u') {
      if (i + 4 >= body.size()) return false;
      for (int k = 1; k <= 4; ++k) {
        if (!isxdigit(static_cast<unsigned char>(body[i + k]))) return false;
      }
      i += 4;
    } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
      return false;
    }
  }
  return true;
}

// RFC 4180 reading of one field.
std::string ReadCsvField(const std::string& f) {
  if (f.empty() || f[0] != '"') return f;
  std::string out;
  for (size_t i = 1; i + 1 < f.size(); ++i) {
    out.push_back(f[i]);
    if (f[i] == '"') ++i;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s = FuzzInput(data, size);
  tally::JsonWriter w(false);
  w.BeginObject().Field("id", s).EndObject();
  const std::string& json = w.str();
  // {"id":"..."}
  FUZZ_CHECK(json.size() >= 9);
  FUZZ_CHECK(ValidJsonString(json.substr(6, json.size() - 7)));
  const std::string field = tally::CsvField(s);
  FUZZ_CHECK(ReadCsvField(field) == s);
  if (field == s) FUZZ_CHECK(s.find_first_of(",\"\n\r") == std::string::npos);
  // Untrusted names in messages: valid UTF-8 without control characters, whatever the bytes.
  const std::string shown = tally::Printable(s, 64);
  FUZZ_CHECK(tally::FirstInvalidUtf8(shown) < 0 && tally::FirstControlCharacter(shown, false) < 0);
  FUZZ_CHECK(tally::UncarriableNameReason(s).empty() ==
             (tally::FirstInvalidUtf8(s) < 0 && tally::FirstControlCharacter(s, false) < 0));
  return 0;
}
