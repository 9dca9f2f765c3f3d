#include "common/security/auth_tokens.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security/sha256.h"

namespace tally {
namespace {

constexpr absl::string_view kHashPrefix = "sha256:";

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string RoleName(Role role) {
  switch (role) {
    case Role::kClient: return "client";
    case Role::kWorker: return "worker";
    case Role::kAdmin: return "admin";
  }
  return "client";
}

std::optional<Role> ParseRole(absl::string_view name) {
  if (name == "client") return Role::kClient;
  if (name == "worker") return Role::kWorker;
  if (name == "admin") return Role::kAdmin;
  return std::nullopt;
}

bool ValidTokenName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '@' || c == '-')) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the tokens file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, const std::string& name) {
  TokenTable table;
  std::map<std::string, int> names;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("tokens file '", name, "' line ", line_no, ": ", what,
                                                     "; expected: NAME ROLE sha256:HEX (see `tally token`)"));
    };
    if (f.size() != 3) return bad(absl::StrCat(f.size(), " fields"));
    if (!ValidTokenName(f[0])) return bad("the name must be 1-64 of A-Z a-z 0-9 . _ @ -");
    const std::optional<Role> role = ParseRole(f[1]);
    if (!role) return bad("the role must be client, worker or admin");
    if (!absl::StartsWith(f[2], kHashPrefix) || f[2].size() != kHashPrefix.size() + 64 ||
        !IsLowerHex(f[2].substr(kHashPrefix.size()))) {
      return bad("the third field must be sha256: and 64 lowercase hex digits (the token itself is never stored)");
    }
    if (!names.emplace(std::string(f[0]), line_no).second) {
      return bad(absl::StrCat("the name is already used on line ", names[std::string(f[0])]));
    }
    const std::string hash(f[2].substr(kHashPrefix.size()));
    if (table.by_hash_.count(hash)) return bad("the same token is listed twice");
    table.by_hash_[hash] = Principal{std::string(f[0]), *role};
  }
  return table;
}

absl::Status TokenTable::Add(const std::string& name, Role role, absl::string_view token) {
  if (!ValidTokenName(name)) return absl::InvalidArgumentError(absl::StrCat("invalid token name '", name, "'"));
  by_hash_[Sha256Hex(token)] = Principal{name, role};
  return absl::OkStatus();
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  if (token.empty()) return std::nullopt;
  auto it = by_hash_.find(Sha256Hex(token));
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

std::string NewToken() {
  uint8_t bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::abort();  // No entropy source: never hand out a guessable token.
    got += static_cast<size_t>(n);
  }
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out = "tally_";
  uint32_t acc = 0;
  int bits = 0;
  for (uint8_t b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      out.push_back(kAlphabet[(acc >> (bits - 6)) & 63]);
      bits -= 6;
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return out;
}

std::string TokenLine(const std::string& name, Role role, absl::string_view token) {
  return absl::StrCat(name, " ", RoleName(role), " ", kHashPrefix, Sha256Hex(token));
}

absl::StatusOr<std::string> ReadToken(const std::string& token_file) {
  if (token_file.empty()) {
    const char* env = std::getenv("TALLY_TOKEN");
    return std::string(env == nullptr ? "" : absl::StripAsciiWhitespace(env));
  }
  std::ifstream in(token_file);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the token file '", token_file, "'"));
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("the token file '", token_file, "' is empty"));
  return token;
}

}  // namespace tally
