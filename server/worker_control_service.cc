#include "server/worker_control_service.h"

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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

namespace {

// A long poll (max_wait_ms > 0): the call stays open, without a thread, until the core answers it
// (a shard granted, the wait over) or the worker cancels it. A grant whose call ended cancelled
// (the worker stopped leasing as the answer left) never reached the worker: it goes back at once,
// no attempt counted, instead of staying leased until the worker falls silent (then a loss).
class AcquireReactor final : public grpc::ServerUnaryReactor {
 public:
  AcquireReactor(Coordinator* core, grpc::CallbackServerContext* ctx, std::string worker_id)
      : core_(core), ctx_(ctx), worker_id_(std::move(worker_id)) {}

  // Called from the method handler, before gRPC may call OnDone.
  void Start(const v1::AcquireShardRequest& request, v1::AcquireShardResponse* response) {
    response_ = response;
    const int64_t id = core_->AcquireShardAsync(request, [this, response](absl::StatusOr<v1::AcquireShardResponse> r) {
      if (r.ok()) *response = std::move(*r);
      Finish(ToGrpcStatus(r.status()));
    });
    id_.store(id);
    if (id != 0 && cancelled_.load()) core_->CancelAcquire(id);  // Cancelled before the id was known.
  }

  void OnCancel() override {
    cancelled_.store(true);
    if (const int64_t id = id_.load(); id != 0) core_->CancelAcquire(id);
  }
  void OnDone() override {
    if (ctx_->IsCancelled() && response_->has_assignment()) {
      const v1::ShardAssignment& a = response_->assignment();
      v1::ReleaseShardRequest back;
      back.set_worker_id(worker_id_);
      back.set_job_id(a.job_id());
      back.set_shard_id(a.shard_id());
      back.set_lease_id(a.lease_id());
      back.set_reason(absl::StrCat("its grant (lease ", a.lease_id(), ") did not reach the worker (its call ended first)"));
      back.set_not_started(true);
      core_->ReleaseShard(back).IgnoreError();  // The worker gone or the lease over: nothing to give back.
    }
    delete this;
  }

 private:
  Coordinator* const core_;
  grpc::CallbackServerContext* const ctx_;
  const std::string worker_id_;
  v1::AcquireShardResponse* response_ = nullptr;
  std::atomic<int64_t> id_{0};
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerUnaryReactor* WorkerControlServiceImpl::AcquireShard(grpc::CallbackServerContext* ctx,
                                                                 const v1::AcquireShardRequest* request,
                                                                 v1::AcquireShardResponse* response) {
  if (absl::Status s = Authenticate(ctx); !s.ok()) return Refuse(ctx, s);
  if (request->max_wait_ms() <= 0) return Unary(ctx, response, [&] { return core_->AcquireShard(*request); });
  auto* reactor = new AcquireReactor(core_, ctx, request->worker_id());
  reactor->Start(*request, response);
  return reactor;
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
