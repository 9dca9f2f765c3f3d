// SHA-256 (FIPS 180-4), for the token hashes stored in tallyd's --auth-tokens file and the files a
// job names (manifest, model). Small and dependency-free so that every role builds the same way on
// a CPU machine and on a GPU box; with the x86 SHA extensions where the CPU has them (a 120 MiB
// manifest in a fraction of a second), the portable rounds elsewhere.
#ifndef TALLY_COMMON_SECURITY_SHA256_H_
#define TALLY_COMMON_SECURITY_SHA256_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tally {

std::array<uint8_t, 32> Sha256(absl::string_view data);
// The same with the portable rounds whatever the CPU (tests hold the two paths to each other).
std::array<uint8_t, 32> Sha256Portable(absl::string_view data);
// The digest as 64 lowercase hex digits (what `sha256sum` prints).
std::string Sha256Hex(absl::string_view data);
// Of a file's bytes, read in 1 MiB blocks; "" if it cannot be read.
std::string Sha256FileHex(const std::string& path);

}  // namespace tally

#endif  // TALLY_COMMON_SECURITY_SHA256_H_
