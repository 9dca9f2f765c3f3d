// tallyd's process-level wiring: the Coordinator core, its gRPC services, the standard health
// service (SERVING once the database is open and jobs are resumed) and, optionally, local
// workers it spawns and keeps running.
#ifndef TALLY_SERVER_SERVER_H_
#define TALLY_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security/channel_security.h"
#include "common/process/worker_launcher.h"
#include "grpcpp/grpcpp.h"
#include "server/access/authorizer.h"
#include "server/coordinator/coordinator.h"
#include "server/follow/follow_manager.h"
#include "server/coordinator_service.h"
#include "server/executor.h"
#include "server/http/dashboard.h"
#include "server/http/metrics_exporter.h"
#include "server/worker_control_service.h"

namespace tally {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free port.
  std::string port_file;                   // If set, the bound port is written here once serving.
  std::string metrics_listen;              // host:port of the Prometheus /metrics endpoint; empty: none.
  std::string http_listen;                 // host:port of the web dashboard (server/http/dashboard.h); empty: none.
  std::vector<std::string> http_allowed_hosts;  // Host names the dashboard answers to besides IPs and localhost.
  ServerTlsOptions tls;                    // No certificate: plaintext.
  std::string auth_tokens;                 // Tokens file (common/security/auth_tokens.h); empty: no authentication.
  // Folders clients may name files in; empty: any. Enforced in this process (the caller sets the
  // process data roots, common/security/data_roots.h) and passed to the workers it spawns.
  std::vector<std::string> data_roots;
  CoordinatorOptions coordinator;
  bool spawn_workers = false;
  WorkerLaunchOptions workers;           // `coordinator` is filled in with the bound address.
  // A graceful stop (SIGTERM) lets workers deliver what they hold for at most this long (--drain-seconds).
  double drain_seconds = 5.0;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(ServerOptions options);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const;  // 0 without --metrics-listen.
  int http_port() const { return dashboard_ ? dashboard_->port() : 0; }
  // Blocks until Shutdown() is called (from a signal handler thread, say).
  void Wait();
  // A graceful stop: NOT_SERVING at once, no new leases, workers deliver what they hold for up to
  // --drain-seconds (spawned workers finish theirs and exit meanwhile), the workers and their leases
  // handed to the next tallyd (coordinator_handoff.cc), then the server stops.
  void Shutdown();
  // SIGHUP: re-reads the tokens file (certificate files are watched and re-read by themselves).
  void Reload();

 private:
  Server() = default;
  // Once a second: health follows the database's writability; spawned workers are restarted.
  void Supervise();
  // Once a second: every follow's folder looked at, its jobs checked (FollowManager::Tick).
  void TickFollows();
  absl::Status StartDashboard(const ServerOptions& options);

  // What start-up says about who can reach and control this tallyd.
  static void WarnAboutExposure(const ServerOptions& options, bool tls, bool tokens);

  std::unique_ptr<Coordinator> core_;
  // Follows (server/follow/): over core_'s jobs, ticked once a second by follow_thread_.
  std::unique_ptr<FollowJobs> follow_jobs_;
  std::unique_ptr<FollowManager> follows_;
  std::thread follow_thread_;
  std::unique_ptr<MetricsExporter> metrics_;  // Declared after core_: stops before it.
  std::unique_ptr<DashboardHandler> dashboard_handler_;
  std::unique_ptr<DashboardServer> dashboard_;  // After the handler and core_: stops first.
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<Executor> executor_;  // Blocking client calls (submission, deletion).
  std::unique_ptr<CoordinatorServiceImpl> coordinator_service_;
  std::unique_ptr<WorkerControlServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<WorkerLauncher> launcher_;
  std::thread supervisor_;
  std::atomic<bool> stopping_{false};
  double drain_seconds_ = 5.0;
  int port_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_SERVER_H_
