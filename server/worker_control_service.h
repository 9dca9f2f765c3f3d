// The WorkerControl service (what `tally-worker` calls) over the plain Coordinator core, with the
// callback API. No logic lives here.
#ifndef TALLY_SERVER_WORKER_CONTROL_SERVICE_H_
#define TALLY_SERVER_WORKER_CONTROL_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "proto/tally.grpc.pb.h"
#include "server/coordinator.h"

namespace tally {

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
  grpc::ServerUnaryReactor* ReleaseShard(grpc::CallbackServerContext* ctx, const v1::ReleaseShardRequest* request,
                                         v1::ReleaseShardResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;

 private:
  Coordinator* const core_;
};

}  // namespace tally

#endif  // TALLY_SERVER_WORKER_CONTROL_SERVICE_H_
