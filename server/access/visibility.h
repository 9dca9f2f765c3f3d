// What a caller may see (SECURITY.md): a client token sees its own jobs and follows only, over gRPC
// and the dashboard alike.
#ifndef TALLY_SERVER_ACCESS_VISIBILITY_H_
#define TALLY_SERVER_ACCESS_VISIBILITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/access/authorizer.h"
#include "server/coordinator/coordinator.h"
#include "server/follow/follow_manager.h"

namespace tally {

// The job, or NOT_FOUND when it does not exist or the caller may not see it (the same answer).
absl::StatusOr<v1::Job> VisibleJob(Coordinator* core, const Caller& caller, const std::string& job_id);

// A job id, or a prefix of exactly one job id the caller may see (as the CLI takes them): the full
// id. NOT_FOUND when none matches, INVALID_ARGUMENT naming a few when several do.
absl::StatusOr<std::string> ResolveVisibleJobId(Coordinator* core, const Caller& caller, const std::string& id);

// The workers as the caller may see them: another owner's job ids, and the reasons its rows took a
// worker out of service (they name its files), never.
v1::ListWorkersResponse VisibleWorkers(Coordinator* core, const Caller& caller);

// The follow, or NOT_FOUND when it does not exist or the caller may not see it (the same answer).
absl::StatusOr<v1::Follow> VisibleFollow(const FollowManager& follows, const Caller& caller, const std::string& follow_id);

// The follows the caller may see, by id.
v1::ListFollowsResponse VisibleFollows(const FollowManager& follows, const Caller& caller);

}  // namespace tally

#endif  // TALLY_SERVER_ACCESS_VISIBILITY_H_
