#include "server/server.h"

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/grpc_util.h"

namespace tally {

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(ServerOptions options) {
  std::unique_ptr<Server> server(new Server());
  ASSIGN_OR_RETURN(server->core_, Coordinator::Create(options.coordinator));
  server->executor_ = std::make_unique<Executor>(4);
  server->coordinator_service_ =
      std::make_unique<CoordinatorServiceImpl>(server->core_.get(), server->executor_.get());
  server->worker_service_ = std::make_unique<WorkerControlServiceImpl>(server->core_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->coordinator_service_.get());
  builder.RegisterService(server->worker_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  server->grpc_server_->GetHealthCheckService()->SetServingStatus(true);
  Log("serving on ", options.listen.substr(0, options.listen.rfind(':')), ":", server->port_, ", state in ",
      options.coordinator.state_dir);
  if (!options.port_file.empty()) RETURN_IF_ERROR(WriteFileAtomically(options.port_file, absl::StrCat(server->port_, "\n")));
  if (options.spawn_workers) {
    options.workers.coordinator = absl::StrCat("127.0.0.1:", server->port_);
    options.workers.restart = true;
    ASSIGN_OR_RETURN(server->launcher_, WorkerLauncher::Start(options.workers));
    Log("spawned ", server->launcher_->size(), " worker(s)");
  }
  server->supervisor_ = std::thread([s = server.get()] { s->Supervise(); });
  return server;
}

void Server::Supervise() {
  bool serving = true;
  while (!stopping_.load()) {
    if (launcher_) launcher_->Poll();
    const bool now_serving = core_->Serving();
    if (now_serving != serving) {
      serving = now_serving;
      grpc_server_->GetHealthCheckService()->SetServingStatus(serving);
      Log("health: ", serving ? "SERVING" : "NOT_SERVING (the database cannot be written)");
    }
    for (int i = 0; i < 10 && !stopping_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Server::Wait() { grpc_server_->Wait(); }

void Server::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (supervisor_.joinable()) supervisor_.join();
  if (launcher_) launcher_->StopAll();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

Server::~Server() {
  Shutdown();
  // Blocking calls still queued finish (and answer their callers) before the server that owns
  // their reactors goes away.
  executor_.reset();
  grpc_server_.reset();
  core_.reset();
}

}  // namespace tally
