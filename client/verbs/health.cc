// tally health: tallyd's answer on the standard gRPC health service, for container health checks.
#include <iostream>

#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"

namespace tally {

int HealthVerb(const ConnectionFlags& connection) {
  auto client = Connect(connection);
  if (!client.ok()) return Finish(client.status());
  absl::StatusOr<std::string> health = (*client)->Health(5);
  if (!health.ok()) return Finish(health.status());
  std::cout << *health << "\n";
  return *health == "SERVING" ? kExitSucceeded : kExitFailed;
}

}  // namespace tally
