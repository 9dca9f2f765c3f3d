// tally token NAME ROLE [--tokens-file F] [--out FILE]: a fresh token on stdout or in FILE (mode
// 0600; shown once), its hashed line for tallyd's --auth-tokens file on stderr or appended to F
// (created readable by its owner only).
#include <iostream>
#include <optional>

#include "client/verbs/verb_util.h"
#include "base/file_util.h"
#include "common/security/auth_tokens.h"

namespace tally {

int TokenVerb(const TokenFlags& f) {
  if (f.positional.size() != 2) return UsageError("token", "usage: tally token NAME client|worker|admin [--tokens-file F] [--out FILE]");
  const std::string name = f.positional[0];
  const std::optional<Role> role = ParseRole(f.positional[1]);
  if (!ValidTokenName(name)) return UsageError("token", "the token name must be 1-64 of A-Z a-z 0-9 . _ @ -");
  if (!role) return UsageError("token", "the role must be client, worker or admin");
  const std::string token = NewToken();
  const std::string line = TokenLine(name, *role, token);
  if (f.tokens_file.empty()) {
    std::cerr << "tally token: add this line to tallyd's --auth-tokens file, then send tallyd SIGHUP:\n" << line << "\n";
  } else {
    if (absl::Status s = WritePrivateFile(f.tokens_file, line + "\n", /*append=*/true); !s.ok()) return Finish(s);
    std::cerr << "tally token: added '" << name << "' (" << f.positional[1] << ") to " << f.tokens_file
              << "; send tallyd SIGHUP to load it\n";
  }
  if (!f.out.empty()) {
    // Readable by its owner only from the first byte (a shell's `> FILE` follows the umask: often 0644).
    if (absl::Status s = WritePrivateFile(f.out, token + "\n", /*append=*/false); !s.ok()) return Finish(s);
    std::cerr << "tally token: the token is in " << f.out << " (mode 0600); pass --token-file " << f.out << "\n";
    return 0;
  }
  std::cout << token << "\n";
  return 0;
}

}  // namespace tally
