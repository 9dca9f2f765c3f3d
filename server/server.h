// tallyd's process-level wiring: the Coordinator core, its gRPC services, the standard health
// service (SERVING once the database is open and jobs are resumed) and, optionally, local
// workers it spawns and keeps running.
#ifndef TALLY_SERVER_SERVER_H_
#define TALLY_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/worker_launcher.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator.h"
#include "server/coordinator_service.h"
#include "server/executor.h"
#include "server/worker_control_service.h"

namespace tally {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // host:port; port 0 picks a free port.
  std::string port_file;                 // If set, the bound port is written here once serving.
  CoordinatorOptions coordinator;
  bool spawn_workers = false;
  WorkerLaunchOptions workers;           // `coordinator` is filled in with the bound address.
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(ServerOptions options);
  ~Server();

  int port() const { return port_; }
  // Blocks until Shutdown() is called (from a signal handler thread, say).
  void Wait();
  void Shutdown();

 private:
  Server() = default;
  // Once a second: health follows the database's writability; spawned workers are restarted.
  void Supervise();

  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<Executor> executor_;  // Blocking client calls (submission, deletion).
  std::unique_ptr<CoordinatorServiceImpl> coordinator_service_;
  std::unique_ptr<WorkerControlServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<WorkerLauncher> launcher_;
  std::thread supervisor_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_SERVER_H_
