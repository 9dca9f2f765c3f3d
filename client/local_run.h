// `tally run`: a whole evaluation on this machine in one command. Starts tallyd on a free loopback
// port (state, database and logs in OUT/.tally/), starts one worker per GPU or N CPU workers,
// submits the job, shows progress, fetches the reports into OUT/ and prints the summary table.
// Ctrl-C cancels the job and stops every process it started.
#ifndef TALLY_CLIENT_LOCAL_RUN_H_
#define TALLY_CLIENT_LOCAL_RUN_H_

#include <optional>
#include <string>
#include <vector>

#include "proto/tally.pb.h"

namespace tally {

struct LocalRunOptions {
  v1::JobSpec spec;
  std::string out_dir;
  int cpu_workers = 1;                    // Used when `gpus` is empty.
  std::vector<std::string> gpus;          // CUDA_VISIBLE_DEVICES value per worker.
  std::vector<std::string> worker_args;   // Extra flags for every worker.
  double lease_seconds = 5.0;
  // tally run --follow: this follow instead of one job (`spec` is its jobs'); the curve files go to
  // out_dir when it ends.
  std::optional<v1::FollowSpec> follow;
};

// Returns the process exit code: 0 when the job succeeded (every manifest row evaluated or failed
// with a reason; the report says which), 1 when it failed or could not run, 130 when interrupted.
int RunLocally(const LocalRunOptions& options);


}  // namespace tally

#endif  // TALLY_CLIENT_LOCAL_RUN_H_
