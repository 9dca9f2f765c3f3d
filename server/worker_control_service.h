// The WorkerControl service (what `tally-worker` calls) over the plain Coordinator core, with the
// callback API. No logic lives here.
#ifndef TALLY_SERVER_WORKER_CONTROL_SERVICE_H_
#define TALLY_SERVER_WORKER_CONTROL_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "proto/tally.grpc.pb.h"
#include "server/access/authorizer.h"
#include "server/grpc_util.h"
#include "server/coordinator/coordinator.h"

namespace tally {

class WorkerControlServiceImpl final : public v1::WorkerControl::CallbackService {
 public:
  // `core` and `auth` must outlive the service.
  WorkerControlServiceImpl(Coordinator* core, const Authorizer* auth) : core_(core), auth_(auth) {}

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
  grpc::ServerUnaryReactor* ResolveLayout(grpc::CallbackServerContext* ctx, const v1::ResolveLayoutRequest* request,
                                          v1::ResolveLayoutResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;

 private:
  // OK if the call's token may use WorkerControl (a worker token, or no tokens configured).
  absl::Status Authenticate(grpc::CallbackServerContext* ctx) const {
    return auth_->Check(AuthorizationOf(ctx), Api::kWorkerControl).status();
  }

  Coordinator* const core_;
  const Authorizer* const auth_;
};

}  // namespace tally

#endif  // TALLY_SERVER_WORKER_CONTROL_SERVICE_H_
