// What the three roles agree on about the wire besides tally.proto itself: the largest message,
// and the names and terminal states of jobs.
#ifndef TALLY_COMMON_JOB_RPC_H_
#define TALLY_COMMON_JOB_RPC_H_

#include <string>

#include "proto/tally.pb.h"

namespace tally {

// Largest gRPC message any role sends or accepts.
inline constexpr int kMaxMessageBytes = 64 << 20;
// How often a worker pings tallyd over a quiet connection to find it dead (gRPC keepalive); tallyd
// accepts pings at twice this rate.
inline constexpr int kKeepaliveMillis = 10000;

// "queued", "running", "succeeded", "failed", "cancelled" (as in report.json and the CLI).
std::string JobStateName(v1::JobState state);
// The state so named (JobStateName's inverse); JOB_STATE_UNSPECIFIED for any other name.
v1::JobState JobStateFromName(const std::string& name);
// A message in protobuf's JSON mapping with tally.proto's field names (`--json`, the dashboard);
// "{}" if it cannot be printed.
std::string ToJson(const google::protobuf::Message& m);
// Succeeded, failed or cancelled: the job will not change again.
bool IsTerminal(v1::JobState state);

// Holds a reference on the gRPC library until the process exits. gRPC starts threads here, which
// inherit the caller's signal mask: a binary that waits for termination signals on one thread calls
// it after blocking them (common/process/signals.h), or a SIGTERM may end the process unhandled.
// With gRPC 1.51 (Debian's), dropping the last reference (the server's or the last channel's
// destructor) runs grpc_shutdown, which joins gRPC's executor threads; one of them may sit in the
// TCP backup poller's wait after a large write that met a full socket (a big lease, a report) and
// let it run out: seconds of an exit spent on nothing (seen on a GPU box: `tally run` lingering 5 s, tallyd
// killed by its caller's grace period, a worker SIGKILLed after its stop). Everything Tally must
// keep is written before that point, so the process exit ends those threads instead.
void KeepGrpcUntilExit();

}  // namespace tally

#endif  // TALLY_COMMON_JOB_RPC_H_
