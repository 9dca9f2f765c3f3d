#include "server/worker_control_service.h"

#include "server/grpc_util.h"

namespace tally {

// Worker calls commit to the database (ReportResults) but in small, bounded transactions; they
// stay on the callback threads.

grpc::ServerUnaryReactor* WorkerControlServiceImpl::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                                   const v1::RegisterWorkerRequest* request,
                                                                   v1::RegisterWorkerResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&] { return core_->RegisterWorker(*request); });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::AcquireShard(grpc::CallbackServerContext* ctx,
                                                                 const v1::AcquireShardRequest* request,
                                                                 v1::AcquireShardResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&] { return core_->AcquireShard(*request); });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::ReportResults(grpc::CallbackServerContext* ctx,
                                                                  const v1::ReportResultsRequest* request,
                                                                  v1::ReportResultsResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&] { return core_->ReportResults(*request); });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::ReportJobError(grpc::CallbackServerContext* ctx,
                                                                   const v1::ReportJobErrorRequest* request,
                                                                   v1::ReportJobErrorResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::ReportJobErrorResponse> {
    absl::Status s = core_->ReportJobError(*request);
    if (!s.ok()) return s;
    return v1::ReportJobErrorResponse();
  });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::ReleaseShard(grpc::CallbackServerContext* ctx,
                                                                 const v1::ReleaseShardRequest* request,
                                                                 v1::ReleaseShardResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::ReleaseShardResponse> {
    absl::Status s = core_->ReleaseShard(*request);
    if (!s.ok()) return s;
    return v1::ReleaseShardResponse();
  });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::ResolveLayout(grpc::CallbackServerContext* ctx,
                                                                  const v1::ResolveLayoutRequest* request,
                                                                  v1::ResolveLayoutResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&] { return core_->ResolveLayout(*request); });
}

grpc::ServerUnaryReactor* WorkerControlServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                              const v1::HeartbeatRequest* request,
                                                              v1::HeartbeatResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  return Unary(ctx, response, [&] { return core_->Heartbeat(*request); });
}

}  // namespace tally
