// JSON string escaping of odd strings (ids, paths, error texts), hand-worked against RFC 8259.
#include "base/json_writer.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(JsonEscapeTest, ControlCharactersQuotesAndBackslashes) {
  EXPECT_EQ(JsonEscape("a\"b\\c\nd\te\r"), "a\\\"b\\\\c\\nd\\te\\r");
  EXPECT_EQ(JsonEscape(std::string("\x00\x01\x1f", 3)), "\\u0000\\u0001\\u001f");
  EXPECT_EQ(JsonEscape("\x7f"), "\x7f");  // DEL is allowed raw.
}

TEST(JsonEscapeTest, ValidUtf8IsKeptInvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(JsonEscape("\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(JsonEscape("\xc3\x28"), fffd + "(");           // Truncated two-byte sequence.
  EXPECT_EQ(JsonEscape("\xff"), fffd);                     // Never valid.
  EXPECT_EQ(JsonEscape("\xc0\xaf"), fffd + fffd);          // Overlong '/'.
  EXPECT_EQ(JsonEscape("\xed\xa0\x80"), fffd + fffd + fffd);  // A UTF-16 surrogate.
  EXPECT_EQ(JsonEscape("\xf4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // Past U+10FFFF.
  EXPECT_EQ(JsonEscape("ok\xe4\xb8"), "ok" + fffd + fffd);  // Cut at the end.
}

TEST(JsonWriterTest, InfinityAsNumberOrString) {
  const double inf = std::numeric_limits<double>::infinity();
  JsonWriter numbers(false);
  numbers.BeginArray().Number(inf).Number(-inf).Number(std::nan("")).Number(0.5).EndArray();
  EXPECT_EQ(numbers.str(), "[1e999,-1e999,null,0.5]");
  JsonWriter strings(false, true);
  strings.BeginArray().Number(inf).Number(-inf).Number(std::nan("")).Number(0.5).EndArray();
  EXPECT_EQ(strings.str(), "[\"inf\",\"-inf\",null,0.5]");
}

}  // namespace
}  // namespace tally
