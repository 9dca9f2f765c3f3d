// Checks and phrasing of untrusted text: where text stops being valid UTF-8 or holds a control
// character (manifests, JSON strings, file names), and lists of names in a message.
#ifndef TALLY_BASE_TEXT_H_
#define TALLY_BASE_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tally {

// Index of the first byte that is not part of valid UTF-8 in `text`, or -1 when it is all valid.
int64_t FirstInvalidUtf8(absl::string_view text);
// Index of the first NUL or control character of `text` (C0 but tab, DEL, C1), or -1. Line feeds and
// carriage returns pass when `newlines_allowed`. `text` must be valid UTF-8.
int64_t FirstControlCharacter(absl::string_view text, bool newlines_allowed);

// `s`, at most its first `max_bytes`, fit for a message: control characters (C0, DEL, C1) and bytes
// that are not valid UTF-8 written as \xHH, and "..." where it was cut. For untrusted names (tar members, files).
std::string Printable(absl::string_view s, size_t max_bytes = 512);

// Why `name` (a file or member name) cannot be written into a manifest or a report as it is, or ""
// when it can: "it is not valid UTF-8 (byte 0xE9 at byte 4)", "it holds a control character (0x0D
// at byte 3)".
std::string UncarriableNameReason(absl::string_view name);

// The first `shown` of `names` joined by ", ", then " and N more" for the rest: files or rows named
// in a message without listing thousands.
std::string ListNames(const std::vector<std::string>& names, size_t shown);

}  // namespace tally

#endif  // TALLY_BASE_TEXT_H_
