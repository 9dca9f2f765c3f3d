// Command-line helpers shared by the three executables' main.cc files (flags themselves are
// defined only in those files).
#ifndef TALLY_BASE_FLAG_UTIL_H_
#define TALLY_BASE_FLAG_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

// Copies argv, turning dashes in flag names into underscores (--batch-size=8 -> --batch_size=8),
// so that users can write flags either way; Abseil flag names cannot contain dashes.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);
// Removes every occurrence of a repeatable flag (`--name=V` or `--name V`, name with underscores as
// NormalizeFlagNames leaves it) from `args` and returns the values in order.
std::vector<std::string> TakeRepeatedFlag(std::vector<std::string>* args, const std::string& name);
// Pointers into `args` for absl::ParseCommandLine; valid while `args` lives.
std::vector<char*> ArgvPointers(std::vector<std::string>& args);

// `--help` of tallyd and tally-worker: every flag defined in the file whose path ends with
// `main_file` (where the binary's flags live), under the group that lists it, with its help and
// default; a flag in no group is listed under "Other" (none is ever left out). Flags are shown
// with dashes. `usage` comes first.
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;  // Names with underscores, as defined.
};
std::string GroupedFlagHelp(const std::string& usage, const std::vector<FlagGroup>& groups,
                            const std::string& main_file);
// `--help` of a tool with one list of flags (the bench and load tools): `usage`, then every flag
// defined in `main_file` with its help and default.
std::string ToolFlagHelp(const std::string& usage, const std::string& main_file);
// The start of such a tool's main(): dashes accepted in flag names; when the arguments ask for help,
// prints ToolFlagHelp to stdout and returns false (main returns 0); else parses the flags with Abseil
// (an unknown flag exits 1 with Abseil's message) and returns true.
bool ParseToolFlags(int argc, char** argv, const std::string& usage, const std::string& main_file);
// Names (underscores) of the flags defined in the file whose path ends with `main_file`, sorted.
std::vector<std::string> FlagsDefinedIn(const std::string& main_file);
// True when `args` (as NormalizeFlagNames leaves them, before "--") ask for help: --help, -h,
// -help or --helpshort. --helpfull stays Abseil's (every flag of every library).
bool AsksForHelp(const std::vector<std::string>& args);

// "0.485,0.456,0.406" -> floats. Errors name the flag.
absl::StatusOr<std::vector<float>> ParseFloatList(const std::string& flag, const std::string& value);
// The same in double precision (spacings: 0.8 must stay 0.8, as the references use it).
absl::StatusOr<std::vector<double>> ParseDoubleList(const std::string& flag, const std::string& value);
// "1GiB", "512MiB", "64KiB", "2TiB" (powers of 1024; also "1G", "512M", "1.5GiB"), "1GB", "500MB"
// (powers of 1000), or a plain number of bytes -> bytes. Errors name the flag.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& value);
// 2684354560 -> "2.5 GiB" (one decimal; MiB under 1 GiB).
std::string FormatBytes(int64_t bytes);
// "512x512" (or "512,512") -> {height, width}.
absl::StatusOr<std::pair<int, int>> ParseSize(const std::string& flag, const std::string& value);

}  // namespace tally

#endif  // TALLY_BASE_FLAG_UTIL_H_
