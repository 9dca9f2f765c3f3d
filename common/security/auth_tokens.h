// Bearer tokens with roles (SECURITY.md). tallyd's --auth-tokens file holds one token per line:
//
//   # name  role    hash of the token
//   alice   client  sha256:<64 hex digits>
//   gpu-7   worker  sha256:<64 hex digits>
//
// Only SHA-256 hashes are stored; `tally token NAME ROLE` makes a token and its line. Blank lines
// and lines starting with '#' are skipped. Names are [A-Za-z0-9._@-]{1,64} and unique.
#ifndef TALLY_COMMON_SECURITY_AUTH_TOKENS_H_
#define TALLY_COMMON_SECURITY_AUTH_TOKENS_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// client: submits jobs and sees, watches, cancels, fetches and deletes its own; admin: the same
// for every job; worker: only the WorkerControl service.
enum class Role { kClient, kWorker, kAdmin };

std::string RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct Principal {
  std::string name;
  Role role = Role::kClient;
};

class TokenTable {
 public:
  // Errors name the file and the line, never its content.
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, const std::string& name);

  // Adds a token at run time (tallyd's own token for the workers it spawns).
  absl::Status Add(const std::string& name, Role role, absl::string_view token);
  // The principal the token belongs to, or nullopt.
  std::optional<Principal> Find(absl::string_view token) const;
  size_t size() const { return by_hash_.size(); }

 private:
  std::map<std::string, Principal> by_hash_;  // Hex SHA-256 of the token -> its holder.
};

// A fresh random token: "tally_" and 43 base64url characters (256 bits from getrandom).
std::string NewToken();
// The --auth-tokens line for a token.
std::string TokenLine(const std::string& name, Role role, absl::string_view token);
bool ValidTokenName(absl::string_view name);

// The token a client or worker sends: the first line of `token_file` if given, else the
// TALLY_TOKEN environment variable, else empty (no token). Errors name the file.
absl::StatusOr<std::string> ReadToken(const std::string& token_file);

}  // namespace tally

#endif  // TALLY_COMMON_SECURITY_AUTH_TOKENS_H_
