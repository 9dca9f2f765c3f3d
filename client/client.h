// A synchronous client of the Coordinator service, used by every `tally` subcommand.
#ifndef TALLY_CLIENT_CLIENT_H_
#define TALLY_CLIENT_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "common/security/channel_security.h"
#include "common/job/rpc.h"
#include "proto/tally.grpc.pb.h"

namespace tally {

// Exit codes of `tally` (docs/cli.md "CLI"): 0 succeeded, 1 failed (or an error), 2 bad usage, 3 the job
// succeeded but more rows failed than its max_failed_fraction allows, 4 cancelled, 5 tallyd could
// not be reached, 6 timed out (watch/wait --timeout), 130 interrupted.
inline constexpr int kExitSucceeded = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTooManyFailedRows = 3;
inline constexpr int kExitCancelled = 4;
inline constexpr int kExitUnreachable = 5;
inline constexpr int kExitTimedOut = 6;      // watch/wait --timeout passed; the jobs go on.
inline constexpr int kExitInterrupted = 130;
// The exit code a finished job gives.
int JobExitCode(const v1::Job& job);

class TallyClient {
 public:
  // Errors: a TLS file that cannot be read (common/security/channel_security.h).
  static absl::StatusOr<std::unique_ptr<TallyClient>> Create(const std::string& server,
                                                             const ClientSecurityOptions& security = {});

  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // Follows (docs/follow.md).
  absl::StatusOr<v1::Follow> CreateFollow(const v1::FollowSpec& spec);
  absl::StatusOr<v1::Follow> GetFollow(const std::string& follow_id);
  absl::StatusOr<v1::ListFollowsResponse> ListFollows();
  absl::StatusOr<v1::Follow> CancelFollow(const std::string& follow_id);
  absl::Status DeleteFollow(const std::string& follow_id);
  // `filter`: its state and labels narrow the listing.
  absl::StatusOr<v1::ListJobsResponse> List(int limit, const std::string& page_token = "",
                                            const v1::ListJobsRequest& filter = v1::ListJobsRequest());
  absl::Status Delete(const std::string& job_id);
  absl::StatusOr<v1::ListWorkersResponse> Workers();
  // Calls `on_update` for every snapshot until the job has ended and its report is ready; returns
  // the last snapshot. `keep_going` is polled between updates (and while reconnecting): returning
  // false stops watching. When the coordinator goes away (restarted, say), the watch reconnects
  // with backoff for up to `reconnect_seconds`, calling `on_reconnect` with the reason each time.
  absl::StatusOr<v1::Job> Watch(const std::string& job_id, int interval_ms,
                                const std::function<void(const v1::Job&)>& on_update,
                                const std::function<bool()>& keep_going = nullptr,
                                const std::function<void(const std::string&)>& on_reconnect = nullptr,
                                double reconnect_seconds = 600);
  // Writes the job's report files into `dir` (created if needed). Returns the file paths.
  // `partial`: a running job's report over the rows committed so far.
  absl::StatusOr<std::vector<std::string>> FetchReport(const std::string& job_id, const std::string& dir,
                                                       bool partial = false);
  // One report over several finished jobs' rows, in the order given, written into `dir`.
  absl::StatusOr<std::vector<std::string>> MergeReports(const std::vector<std::string>& job_ids, const std::string& dir);
  // Two finished runs of the same manifest compared (B - A), written into `dir`.
  absl::StatusOr<std::vector<std::string>> CompareJobs(const std::string& a, const std::string& b,
                                                       const std::string& dir);
  // tallyd's answer on the standard gRPC health service (grpc.health.v1.Health/Check, the one
  // Kubernetes' grpc probes ask): "SERVING", "NOT_SERVING" (its database cannot be written), ...
  absl::StatusOr<std::string> Health(double timeout_seconds);
  // True once the server answers (used while tallyd starts).
  bool WaitUntilReady(double seconds);

 private:
  // Reads a stream of report chunks into files in `dir`.
  absl::StatusOr<std::vector<std::string>> WriteReportFiles(grpc::ClientReader<v1::ReportChunk>* reader,
                                                            const std::string& dir);
  explicit TallyClient(std::string server) : server_(std::move(server)) {}

  std::string server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace tally

#endif  // TALLY_CLIENT_CLIENT_H_
