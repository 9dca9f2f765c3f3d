// Shared by the two service files: the one place absl::Status becomes grpc::Status, and the
// shape of a unary callback handler.
#ifndef TALLY_SERVER_GRPC_UTIL_H_
#define TALLY_SERVER_GRPC_UTIL_H_

#include <utility>

#include "absl/status/status.h"
#include "common/security/channel_security.h"
#include "common/job/rpc.h"
#include "grpcpp/grpcpp.h"
#include "server/executor.h"

namespace tally {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// Finishes a unary call with the result of `fn` (absl::StatusOr<T>), on the callback thread: for
// calls that only touch memory.
template <typename T, typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, T* response, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto result = fn();
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

// The same, with `fn` run on `executor`: for calls that block on disk I/O.
template <typename T, typename Fn>
grpc::ServerUnaryReactor* UnaryBlocking(Executor* executor, grpc::CallbackServerContext* ctx, T* response, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor->Schedule([reactor, response, fn = std::move(fn)]() mutable {
    auto result = fn();
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

// The call's "authorization" metadata value, or "".
inline std::string AuthorizationOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kAuthorizationKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// Ends a unary call at once with an error.
inline grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Ends a server-streaming call at once with an error.
template <typename T>
class RefusedWriter final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace tally

#endif  // TALLY_SERVER_GRPC_UTIL_H_
