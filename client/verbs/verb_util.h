// What several verbs share: usage errors and exit codes, connecting to tallyd, job ids by prefix,
// and printing jobs.
#ifndef TALLY_CLIENT_VERBS_VERB_UTIL_H_
#define TALLY_CLIENT_VERBS_VERB_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/verbs/verbs.h"
#include "common/job/rpc.h"  // ToJson
#include "google/protobuf/message.h"
#include "proto/tally.pb.h"

namespace tally {

// A usage error of `tally VERB` (VERB empty: no verb yet): the message and where to look, on
// stderr; returns kExitUsage.
int UsageError(const std::string& verb, const std::string& error);
// 0 for OK; else the message on stderr and kExitUnreachable (UNAVAILABLE) or kExitFailed.
int Finish(const absl::Status& s);

// A client of the tallyd `flags` name, with their TLS and token.
absl::StatusOr<std::unique_ptr<TallyClient>> Connect(const ConnectionFlags& flags);
// A job id, or an unambiguous prefix of one (the caller's visible jobs).
absl::StatusOr<std::string> ResolveJobId(TallyClient& client, const std::string& id);
absl::StatusOr<std::vector<std::string>> ResolveJobIds(TallyClient& client, const std::vector<std::string>& ids);
// How long tally wait and tally watch wait, without --timeout, for a tallyd that does not answer
// (a restart: its jobs resume where they were).
inline constexpr double kUnreachableSeconds = 120;
// tally wait's and tally watch's ResolveJobIds of f.jobs, through a tallyd that is restarting:
// UNAVAILABLE is retried with backoff until --timeout (without one, for kUnreachableSeconds), saying
// once on stderr that `verb` waits for tallyd. Returns kExitSucceeded with `ids` set, or the exit code
// of what it reported (kExitTimedOut: --timeout passed and tallyd never answered).
int ResolveJobIdsPatiently(TallyClient& client, const JobVerbFlags& f, const std::string& verb,
                           std::vector<std::string>* ids);

// --gpus and --gpus-per-worker of tally run and tally estimate: each worker's CUDA_VISIBLE_DEVICES
// into `groups` (none: CPU workers). Returns 0, or the exit code of the error it reported.
int SelectWorkerGpus(const std::string& verb, const LocalWorkerFlags& flags, const std::string& model,
                     std::vector<std::string>* groups);

// A job's one-line state (and its error, stall and held rows).
void PrintJob(const v1::Job& job);

}  // namespace tally

#endif  // TALLY_CLIENT_VERBS_VERB_UTIL_H_
