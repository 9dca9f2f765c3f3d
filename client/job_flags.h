// The job flags of `tally run`, `submit` and `estimate` (client/verbs/verbs.h JobFlags) checked and
// turned into the JobSpec tallyd receives. Errors are usage errors naming the flag.
#ifndef TALLY_CLIENT_JOB_FLAGS_H_
#define TALLY_CLIENT_JOB_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/verbs/verbs.h"
#include "proto/tally.pb.h"

namespace tally {

// `manifest`, when not empty, replaces flags.manifest (tally run --predictions/--references).
absl::StatusOr<v1::JobSpec> SpecFromFlags(const JobFlags& flags, const std::string& manifest = "");

// KEY=VALUE pairs of a repeatable flag (--label, --model-option) into a map. Errors name the flag.
absl::Status ParsePairs(const char* flag, const std::vector<std::string>& pairs,
                        google::protobuf::Map<std::string, std::string>* out);

}  // namespace tally

#endif  // TALLY_CLIENT_JOB_FLAGS_H_
