// The tar format (common/sources/tar_format.h).
#include "common/sources/tar_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tally {
namespace {

// A NUL-terminated (or full) field.
std::string Field(const char* p, size_t n) {
  return std::string(p, strnlen(p, n));
}

// An octal field (spaces and NULs around it), or GNU's base-256 (the first byte's high bit set):
// -1 when it is neither, or out of range.
int64_t Number(const char* p, size_t n) {
  const unsigned char first = static_cast<unsigned char>(p[0]);
  if (first & 0x80) {
    if (first != 0x80) return -1;  // 0xff: negative.
    int64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v > (INT64_MAX >> 8)) return -1;
      v = (v << 8) | static_cast<unsigned char>(p[i]);
    }
    return v;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  if (i == n) return 0;
  int64_t v = 0;
  bool digits = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v > (INT64_MAX >> 3)) return -1;
    v = (v << 3) | (p[i] - '0');
    digits = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return -1;
  }
  return digits ? v : -1;
}

bool ChecksumMatches(const char* block) {
  const int64_t stored = Number(block + 148, 8);
  if (stored < 0) return false;
  // The sum of the bytes with the checksum field counted as eight spaces: unsigned as POSIX says,
  // else signed, as old writers summed.
  const auto* u = reinterpret_cast<const unsigned char*>(block);
  int64_t sum = 8 * ' ';
  for (int i = 0; i < 148; ++i) sum += u[i];
  for (int i = 156; i < kTarBlock; ++i) sum += u[i];
  if (stored == sum) return true;
  int64_t signed_sum = 8 * ' ';
  for (int i = 0; i < kTarBlock; ++i) {
    if (i < 148 || i >= 156) signed_sum += static_cast<signed char>(block[i]);
  }
  return stored == signed_sum;
}

// The length of the UTF-8 character starting with `lead` (1 for a byte that starts none).
size_t Utf8Length(unsigned char lead) {
  return lead >= 0xF0 && lead < 0xF8 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
}

// Whether `member` (the name from the long-name or pax header, when there is one) is what a header
// holding `header_name` names. Writers keep at most the first 100 bytes of a longer name there (GNU
// tar's long names and pax), and pax writers may write each non-ASCII character as one '?'.
bool NameMatches(const std::string& header_name, const std::string& member) {
  auto strip = [](absl::string_view s) {
    while (s.size() >= 2 && s[0] == '.' && s[1] == '/') s.remove_prefix(2);
    return s;
  };
  const absl::string_view h = strip(header_name), m = strip(member);
  if (h == m) return true;
  size_t j = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    if (j >= m.size()) return false;
    if (h[i] == m[j]) {
      ++j;
    } else if (h[i] == '?') {
      j += Utf8Length(static_cast<unsigned char>(m[j]));
    } else {
      return false;
    }
  }
  const bool truncated = header_name.size() >= 99;  // The 100-byte field was full (or nearly: a cut character).
  return j == m.size() || (truncated && j < m.size());
}

}  // namespace

TarHeader ParseTarHeader(const char* block) {
  TarHeader h;
  static const char kZeros[kTarBlock] = {};
  h.zero = std::memcmp(block, kZeros, kTarBlock) == 0;
  if (h.zero || !ChecksumMatches(block)) return h;
  h.valid = true;
  h.type = block[156] == '\0' ? '0' : block[156];
  h.name = Field(block, 100);
  h.linkname = Field(block + 157, 100);
  h.size = Number(block + 124, 12);
  // POSIX ustar ("ustar\0" + "00") splits long names into a prefix; GNU ("ustar  \0") keeps other
  // fields there.
  if (std::memcmp(block + 257, "ustar\0", 6) == 0) {
    const std::string prefix = Field(block + 345, 155);
    if (!prefix.empty()) h.name = prefix + "/" + h.name;
  }
  return h;
}

bool MemberHeaderMatches(const char* header, const std::string& member, int64_t size, std::string* why) {
  const TarHeader h = ParseTarHeader(header);
  if (!h.valid) {
    *why = "no tar header precedes its data";
    return false;
  }
  if (h.type != '0' && h.type != '7') {
    *why = absl::StrCat("the header before its data is of type '", std::string(1, h.type), "', not a regular member");
    return false;
  }
  if (h.size != size) {
    *why = absl::StrCat("the header before its data declares ", h.size, " bytes, not ", size);
    return false;
  }
  if (!NameMatches(h.name, member)) {
    *why = absl::StrCat("the header before its data names another member ('", h.name.substr(0, 100), "')");
    return false;
  }
  return true;
}

}  // namespace tally
