// A small streaming JSON writer for reports. Non-finite numbers: NaN is written as null and
// +/-infinity as 1e999 / -1e999, which is valid JSON that Python's json and JavaScript's
// JSON.parse read back as infinity. Not thread-safe.
#ifndef TALLY_BASE_JSON_WRITER_H_
#define TALLY_BASE_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

namespace tally {

class JsonWriter {
 public:
  // `infinity_as_string`: +/-infinity as the strings "inf" / "-inf" instead of 1e999 / -1e999.
  explicit JsonWriter(bool pretty = true, bool infinity_as_string = false)
      : pretty_(pretty), infinity_as_string_(infinity_as_string) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Number(double value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // Key + value shorthands.
  JsonWriter& Field(absl::string_view key, absl::string_view value) { return Key(key).String(value); }
  JsonWriter& Field(absl::string_view key, const char* value) { return Key(key).String(value); }
  JsonWriter& Field(absl::string_view key, double value) { return Key(key).Number(value); }
  JsonWriter& Field(absl::string_view key, int64_t value) { return Key(key).Int(value); }
  JsonWriter& Field(absl::string_view key, int value) { return Key(key).Int(value); }
  JsonWriter& Field(absl::string_view key, bool value) { return Key(key).Bool(value); }

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();
  void Newline();

  bool pretty_;
  bool infinity_as_string_;
  std::string out_;
  std::vector<bool> first_;  // Per open container: no element written yet.
  bool after_key_ = false;
};

// Escapes a string for JSON (without the quotes). Bytes that are not valid UTF-8 become U+FFFD.
std::string JsonEscape(absl::string_view s);

}  // namespace tally

#endif  // TALLY_BASE_JSON_WRITER_H_
