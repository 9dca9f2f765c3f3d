#include "server/access/authorizer.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/security/channel_security.h"
#include "base/log.h"

namespace tally {

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const std::string& tokens_file) {
  std::unique_ptr<Authorizer> a(new Authorizer(tokens_file));
  if (tokens_file.empty()) return a;
  a->enabled_ = true;
  if (absl::Status s = a->Reload(); !s.ok()) return s;
  return a;
}

absl::Status Authorizer::Reload() {
  if (tokens_file_.empty()) return absl::OkStatus();
  absl::StatusOr<TokenTable> table = TokenTable::Load(tokens_file_);
  if (!table.ok()) return table.status();
  Log("auth: ", table->size(), " token(s) from ", tokens_file_);
  absl::MutexLock lock(&mu_);
  from_file_ = std::move(*table);
  return absl::OkStatus();
}

void Authorizer::AddToken(const std::string& name, Role role, const std::string& token) {
  enabled_ = true;
  absl::MutexLock lock(&mu_);
  built_in_.Add(name, role, token).IgnoreError();
}

absl::StatusOr<Caller> Authorizer::Check(absl::string_view authorization, Api api) const {
  if (!enabled_) return Caller{};
  const std::string token = BearerToken(authorization);
  if (token.empty()) {
    return absl::UnauthenticatedError("this tallyd requires a token: pass --token-file or set TALLY_TOKEN");
  }
  std::optional<Principal> who;
  {
    absl::MutexLock lock(&mu_);
    who = built_in_.Find(token);
    if (!who) who = from_file_.Find(token);
  }
  if (!who) return absl::UnauthenticatedError("unknown token");
  const bool worker_api = api == Api::kWorkerControl;
  if (worker_api != (who->role == Role::kWorker)) {
    return absl::PermissionDeniedError(absl::StrCat("token '", who->name, "' has role ", RoleName(who->role), "; ",
                                                    worker_api ? "only worker tokens may call WorkerControl"
                                                               : "worker tokens may only call WorkerControl"));
  }
  return Caller{who->name, who->role == Role::kAdmin};
}

}  // namespace tally
