#include "base/text.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally {

namespace {
// Eight bytes of `p`, as one word.
uint64_t Word(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}
constexpr uint64_t kHighBits = 0x8080808080808080ull;
constexpr uint64_t kOnes = 0x0101010101010101ull;
// Whether any byte of `w` (all below 0x80) is below 0x20 or is 0x7F.
bool AnyControl(uint64_t w) {
  const uint64_t del = w ^ (0x7F * kOnes);
  return (((w - 0x20 * kOnes) & ~w) | ((del - kOnes) & ~del)) & kHighBits;
}
}  // namespace

int64_t FirstInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && (Word(p + i) & kHighBits) == 0) {  // Eight ASCII bytes at once.
      i += 8;
      continue;
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
    const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

int64_t FirstControlCharacter(absl::string_view s, bool newlines_allowed) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t start = 0;  // Runs of eight printable ASCII bytes are skipped at once.
  while (start + 8 <= s.size()) {
    const uint64_t w = Word(p + start);
    if ((w & kHighBits) != 0 || AnyControl(w)) break;
    start += 8;
  }
  for (size_t i = start; i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b == '\t' || (newlines_allowed && (b == '\n' || b == '\r'))) continue;
    if (b < 0x20 || b == 0x7F) return static_cast<int64_t>(i);
    // C1 controls U+0080..U+009F: C2 80..C2 9F in UTF-8 (the text is valid UTF-8 by now).
    if (b == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9F) return static_cast<int64_t>(i);
  }
  return -1;
}
std::string ListNames(const std::vector<std::string>& names, size_t shown) {
  std::vector<std::string> first(names.begin(), names.begin() + std::min(names.size(), shown));
  std::string s = absl::StrJoin(first, ", ");
  if (names.size() > shown) absl::StrAppend(&s, " and ", names.size() - shown, " more");
  return s;
}

std::string Printable(absl::string_view s, size_t max_bytes) {
  const absl::string_view shown = s.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size());
  for (size_t i = 0; i < shown.size();) {
    const unsigned char c = static_cast<unsigned char>(shown[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len > 1 && (i + len > shown.size() || FirstInvalidUtf8(shown.substr(i, len)) >= 0)) len = 0;
    if (len == 2 && c == 0xC2 && static_cast<unsigned char>(shown[i + 1]) < 0xA0) len = 0;  // C1 controls.
    if (len == 0 || (len == 1 && (c < 0x20 || c == 0x7F))) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      ++i;
      continue;
    }
    out.append(shown.data() + i, len);
    i += len;
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

std::string UncarriableNameReason(absl::string_view name) {
  if (const int64_t at = FirstInvalidUtf8(name); at >= 0) {
    return absl::StrCat("it is not valid UTF-8 (byte 0x",
                        absl::AsciiStrToUpper(absl::StrCat(absl::Hex(static_cast<unsigned char>(name[at]), absl::kZeroPad2))),
                        " at byte ", at, ")");
  }
  if (const int64_t at = FirstControlCharacter(name, false); at >= 0) {
    return absl::StrCat("it holds a control character (0x",
                        absl::AsciiStrToUpper(absl::StrCat(absl::Hex(static_cast<unsigned char>(name[at]), absl::kZeroPad2))),
                        " at byte ", at, ")");
  }
  return "";
}

}  // namespace tally
