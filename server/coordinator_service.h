// gRPC adapters: the Coordinator and WorkerControl services (callback API) over the plain
// Coordinator core. No logic lives here; absl::Status becomes grpc::Status in ToGrpcStatus only.
#ifndef TALLY_SERVER_COORDINATOR_SERVICE_H_
#define TALLY_SERVER_COORDINATOR_SERVICE_H_

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/tally.grpc.pb.h"
#include "server/coordinator.h"

namespace tally {

grpc::Status ToGrpcStatus(const absl::Status& status);

class CoordinatorServiceImpl final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorServiceImpl(Coordinator* core) : core_(core) {}

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

 private:
  Coordinator* core_;
};

class WorkerControlServiceImpl final : public v1::WorkerControl::CallbackService {
 public:
  explicit WorkerControlServiceImpl(Coordinator* core) : core_(core) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* AcquireShard(grpc::CallbackServerContext* ctx, const v1::AcquireShardRequest* request,
                                         v1::AcquireShardResponse* response) override;
  grpc::ServerUnaryReactor* ReportResults(grpc::CallbackServerContext* ctx, const v1::ReportResultsRequest* request,
                                          v1::ReportResultsResponse* response) override;
  grpc::ServerUnaryReactor* ReportJobError(grpc::CallbackServerContext* ctx, const v1::ReportJobErrorRequest* request,
                                           v1::ReportJobErrorResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;

 private:
  Coordinator* core_;
};

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_SERVICE_H_
