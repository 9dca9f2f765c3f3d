// Answers before the end (docs/metrics.md "Answers before the end"): which rows a sampled job evaluates and
// how its reports name the rest.
#ifndef TALLY_SERVER_COORDINATOR_LIVE_ESTIMATES_H_
#define TALLY_SERVER_COORDINATOR_LIVE_ESTIMATES_H_

#include <cstdint>
#include <string>

#include "proto/tally.pb.h"

namespace tally {

// --until-ci's floor when JobSpec.min_rows is 0.
inline constexpr int64_t kDefaultMinRows = 100;

// The rows a job evaluates: all, or --sample's N (at most the rows) or P% (rounded up).
int64_t PlannedRows(const v1::JobSpec& spec, int64_t total);

// "sampled: n of N rows (--sample 10%)" for a finished job that left rows out (a sample, or
// --until-ci reached); "sampling n of N rows (...)" while a --sample job runs; "" otherwise.
std::string SampledNote(const v1::Job& job, int64_t planned);

// What the live intervals are (Job.live_note), by the job's order.
std::string LiveNote(bool random_order);

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_LIVE_ESTIMATES_H_
