// The Coordinator service (what `tally` calls) over the plain Coordinator core, with the
// callback API. No logic lives here. Blocking work (submission streams the manifest into the
// database; deletion) runs on an executor, never on a callback thread.
#ifndef TALLY_SERVER_COORDINATOR_SERVICE_H_
#define TALLY_SERVER_COORDINATOR_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "proto/tally.grpc.pb.h"
#include "server/access/authorizer.h"
#include "server/coordinator/coordinator.h"
#include "server/executor.h"
#include "server/follow/follow_manager.h"

namespace tally {

class CoordinatorServiceImpl final : public v1::Coordinator::CallbackService {
 public:
  // `core`, `executor` and `auth` must outlive the service.
  // `follows` may be null (no follows: their calls are UNIMPLEMENTED).
  CoordinatorServiceImpl(Coordinator* core, Executor* executor, const Authorizer* auth,
                         FollowManager* follows = nullptr)
      : core_(core), executor_(executor), auth_(auth), follows_(follows) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* request,
                                   v1::Job* response) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::ReportChunk>* FetchReport(grpc::CallbackServerContext* ctx,
                                                         const v1::FetchReportRequest* request) override;
  grpc::ServerWriteReactor<v1::ReportChunk>* MergeReports(grpc::CallbackServerContext* ctx,
                                                          const v1::MergeReportsRequest* request) override;
  grpc::ServerWriteReactor<v1::ReportChunk>* CompareJobs(grpc::CallbackServerContext* ctx,
                                                         const v1::CompareJobsRequest* request) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* CreateFollow(grpc::CallbackServerContext* ctx, const v1::CreateFollowRequest* request,
                                         v1::Follow* response) override;
  grpc::ServerUnaryReactor* GetFollow(grpc::CallbackServerContext* ctx, const v1::GetFollowRequest* request,
                                      v1::Follow* response) override;
  grpc::ServerUnaryReactor* ListFollows(grpc::CallbackServerContext* ctx, const v1::ListFollowsRequest* request,
                                        v1::ListFollowsResponse* response) override;
  grpc::ServerUnaryReactor* CancelFollow(grpc::CallbackServerContext* ctx, const v1::CancelFollowRequest* request,
                                         v1::Follow* response) override;
  grpc::ServerUnaryReactor* DeleteFollow(grpc::CallbackServerContext* ctx, const v1::DeleteFollowRequest* request,
                                         v1::DeleteFollowResponse* response) override;

 private:
  // The caller, if its token may use this service.
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* ctx) const;
  // The job, if the caller may see it; a job it may not see is NOT_FOUND, as a missing one.
  absl::StatusOr<v1::Job> VisibleJob(const Caller& caller, const std::string& job_id) const;
  // OK if the caller may see every one of the jobs; else the first one's NOT_FOUND.
  absl::Status AllVisible(const Caller& caller, const std::vector<std::string>& job_ids) const;

  Coordinator* const core_;
  Executor* const executor_;
  const Authorizer* const auth_;
  FollowManager* const follows_;

  // The follow, if the caller may see it (its owner's, or every one for a token that sees all).
  absl::StatusOr<v1::Follow> VisibleFollow(const Caller& caller, const std::string& follow_id) const;
};

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_SERVICE_H_
