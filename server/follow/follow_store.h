// Follows in tallyd's database: each follow (v1::Follow: its spec and every checkpoint's state) is
// one record of service_state under "follow/<id>", replaced whole whenever it changes, so a restarted
// tallyd finds every follow where it was: checkpoints taken are not taken again, none is skipped.
#ifndef TALLY_SERVER_FOLLOW_FOLLOW_STORE_H_
#define TALLY_SERVER_FOLLOW_FOLLOW_STORE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tally.pb.h"
#include "server/store/job_store.h"

namespace tally {

absl::Status SaveFollow(JobStore* store, const v1::Follow& follow);
// Every follow, by id. DATA_LOSS naming the record when one does not parse.
absl::StatusOr<std::vector<v1::Follow>> LoadFollows(JobStore* store);
absl::Status DeleteFollow(JobStore* store, const std::string& follow_id);

}  // namespace tally

#endif  // TALLY_SERVER_FOLLOW_FOLLOW_STORE_H_
