// Checks a submitted JobSpec and completes it: canonical metric, precision and policy names, every
// default written out (spacing, pixel limit, batch timeout) and the batch alignment that shards and
// workers follow (common/job/job_config.h). The coordinator stores the completed spec; workers and
// the report writer read it through JobConfigFromSpec; the client checks the fields before it sends
// one (usage errors before anything starts). Errors name the field.
#ifndef TALLY_COMMON_JOB_JOB_SPEC_VALIDATION_H_
#define TALLY_COMMON_JOB_JOB_SPEC_VALIDATION_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "proto/tally.pb.h"

namespace tally {

// Bounds on what a client may submit (docs/data.md "Bad input").
inline constexpr size_t kMaxJobNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;

// INVALID_ARGUMENT for a bad field, NOT_FOUND when the model file does not exist. Paths are made
// absolute against this process's working directory. `check_files` false: the fields alone, no file
// looked at (the client's check before it sends a spec, exit code 2 for what it finds: the files are
// the coordinator's to find).
absl::StatusOr<v1::JobSpec> ValidateJobSpec(const v1::JobSpec& spec, bool check_files = true);

}  // namespace tally

#endif  // TALLY_COMMON_JOB_JOB_SPEC_VALIDATION_H_
