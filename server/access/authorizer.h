// Who may call what (SECURITY.md). Without a tokens file every call is allowed, as before tokens
// existed (tallyd warns at start-up). With one, every call must carry "authorization: Bearer
// <token>" of a listed token: the Coordinator service takes client and admin tokens, WorkerControl
// only worker tokens. A client token sees only the jobs it submitted; admin sees all.
// Thread-safe; no gRPC here (the services pass the metadata value in).
#ifndef TALLY_SERVER_ACCESS_AUTHORIZER_H_
#define TALLY_SERVER_ACCESS_AUTHORIZER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/security/auth_tokens.h"

namespace tally {

enum class Api { kCoordinator, kWorkerControl };

struct Caller {
  std::string name;       // The token's name; "" without tokens.
  bool sees_all = true;   // Admin (or no tokens): every job; else only jobs it owns.
  bool CanSee(const std::string& owner) const { return sees_all || owner == name; }
};

class Authorizer {
 public:
  // `tokens_file` empty: no authentication.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const std::string& tokens_file);

  bool enabled() const { return enabled_; }
  // Re-reads the tokens file (SIGHUP). On error the previous tokens stay in force.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // A token kept across reloads: tallyd's own for the workers it spawns. Turns authentication on.
  void AddToken(const std::string& name, Role role, const std::string& token) ABSL_LOCKS_EXCLUDED(mu_);

  // `authorization` is the call's metadata value ("Bearer <token>", or "" when absent).
  // UNAUTHENTICATED: no token or an unknown one; PERMISSION_DENIED: its role may not call `api`.
  absl::StatusOr<Caller> Check(absl::string_view authorization, Api api) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit Authorizer(std::string tokens_file) : tokens_file_(std::move(tokens_file)) {}

  const std::string tokens_file_;
  bool enabled_ = false;  // Set before the server starts (Create, AddToken), read-only after.
  mutable absl::Mutex mu_;
  TokenTable from_file_ ABSL_GUARDED_BY(mu_);
  TokenTable built_in_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_ACCESS_AUTHORIZER_H_
