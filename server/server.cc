#include "server/server.h"

#include "server/follow/follow_jobs.h"
#include "base/clock.h"

#include <chrono>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/rpc.h"
#include "common/security/auth_tokens.h"
#include "base/file_util.h"
#include "base/log.h"
#include "common/process/sd_notify.h"
#include "base/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/grpc_util.h"

namespace tally {

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(ServerOptions options) {
  std::unique_ptr<Server> server(new Server());
  server->drain_seconds_ = options.drain_seconds;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, CreateServerCredentials(options.tls));
  ASSIGN_OR_RETURN(server->auth_, Authorizer::Create(options.auth_tokens));
  std::string worker_token;
  if (options.spawn_workers && server->auth_->enabled()) {
    // The workers this tallyd spawns get a token of their own, never written to disk.
    worker_token = NewToken();
    server->auth_->AddToken("tallyd-spawned-workers", Role::kWorker, worker_token);
  }
  ASSIGN_OR_RETURN(server->core_, Coordinator::Create(options.coordinator));
  server->follow_jobs_ = std::make_unique<CoordinatorFollowJobs>(server->core_.get());
  server->follows_ = std::make_unique<FollowManager>(server->core_->store(), server->follow_jobs_.get(),
                                                     options.coordinator.state_dir + "/follows");
  RETURN_IF_ERROR(server->follows_->Load());
  server->executor_ = std::make_unique<Executor>(4);
  server->coordinator_service_ = std::make_unique<CoordinatorServiceImpl>(
      server->core_.get(), server->executor_.get(), server->auth_.get(), server->follows_.get());
  server->worker_service_ = std::make_unique<WorkerControlServiceImpl>(server->core_.get(), server->auth_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  // Spawned workers of a TLS tallyd dial a Unix socket in the state folder instead (plaintext,
  // made reachable only by this user below; tokens still apply).
  const bool tls = !options.tls.cert.empty();
  const std::string socket_path = absl::StrCat(options.coordinator.state_dir, "/tallyd.sock");
  const bool local_socket = options.spawn_workers && tls;
  if (local_socket) {
    unlink(socket_path.c_str());
    builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  }
  builder.RegisterService(server->coordinator_service_.get());
  builder.RegisterService(server->worker_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Workers ping every kKeepaliveMillis to find a dead connection (worker/worker.cc); gRPC's default
  // would answer pings that often with GOAWAY (too many pings) and drop the connection.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveMillis / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  server->grpc_server_ = builder.BuildAndStart();
  if (local_socket && server->grpc_server_ != nullptr) chmod(socket_path.c_str(), 0600);
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  server->grpc_server_->GetHealthCheckService()->SetServingStatus(true);
  Log("serving on ", options.listen.substr(0, options.listen.rfind(':')), ":", server->port_,
      tls ? (options.tls.client_ca.empty() ? " (TLS)" : " (mutual TLS)") : " (plaintext)",
      server->auth_->enabled() ? ", tokens required" : "", ", state in ", options.coordinator.state_dir);
  WarnAboutExposure(options, tls, !options.auth_tokens.empty());
  if (!options.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(server->metrics_, MetricsExporter::Start(options.metrics_listen, server->core_.get(), server->follows_.get()));
    Log("metrics on http://", options.metrics_listen.substr(0, options.metrics_listen.rfind(':')), ":",
        server->metrics_->port(), "/metrics (no TLS, no tokens: keep it on a trusted network)");
  }
  if (!options.http_listen.empty()) RETURN_IF_ERROR(server->StartDashboard(options));
  if (!options.port_file.empty()) RETURN_IF_ERROR(WriteFileAtomically(options.port_file, absl::StrCat(server->port_, "\n")));
  if (options.spawn_workers) {
    options.workers.coordinator = local_socket ? "unix:" + socket_path : absl::StrCat("127.0.0.1:", server->port_);
    options.workers.restart = true;
    if (!worker_token.empty()) options.workers.env.emplace_back("TALLY_TOKEN", worker_token);
    for (const std::string& root : options.data_roots) {
      options.workers.extra_args.push_back("--data-root");
      options.workers.extra_args.push_back(root);
    }
    ASSIGN_OR_RETURN(server->launcher_, WorkerLauncher::Start(options.workers));
    Log("spawned ", server->launcher_->size(), " worker(s)");
  }
  // READY before the supervisor's first WATCHDOG=1: systemd (and test_deploy) read them in order.
  SdNotify(absl::StrCat("READY=1\nSTATUS=serving on ", options.listen));  // systemd Type=notify (deploy/).
  server->supervisor_ = std::thread([s = server.get()] { s->Supervise(); });
  server->follow_thread_ = std::thread([s = server.get()] { s->TickFollows(); });
  return server;
}

// The web dashboard (--http-listen), with the gRPC server's tokens and, with TLS, its certificate.
absl::Status Server::StartDashboard(const ServerOptions& options) {
  DashboardOptions d;
  d.listen = options.http_listen;
  const std::string host = options.http_listen.substr(0, options.http_listen.rfind(':'));
  // The names a browser may use for it besides IP addresses and localhost (DNS rebinding).
  std::vector<std::string> names = options.http_allowed_hosts;
  names.push_back(host);
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) == 0) names.push_back(hostname);
  dashboard_handler_ = std::make_unique<DashboardHandler>(core_.get(), auth_.get(), std::move(names), follows_.get());
  const bool loopback = host == "localhost" || absl::StartsWith(host, "127.") || host == "[::1]";
  if (!options.tls.cert.empty() && !DashboardCanServeTls()) {
    // Tokens must not cross a network in the clear: plain HTTP on loopback only (an SSH tunnel or a
    // TLS-terminating proxy in front), else no dashboard.
    if (!loopback) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--http-listen ", options.http_listen, ": tallyd serves gRPC with TLS, but this civetweb cannot serve HTTPS; "
          "listen on 127.0.0.1 and reach the dashboard through an SSH tunnel or a TLS-terminating proxy"));
    }
  } else if (!options.tls.cert.empty()) {  // The gRPC certificate and key, in the one file civetweb reads.
    d.tls_cert = options.coordinator.state_dir + "/dashboard.pem";
    std::string pem;
    for (const std::string& f : {options.tls.cert, options.tls.key}) {
      ASSIGN_OR_RETURN(std::string part, ReadFileToString(f));
      pem += part + "\n";
    }
    RETURN_IF_ERROR(WritePrivateFile(d.tls_cert, pem, false));
  }
  ASSIGN_OR_RETURN(dashboard_, DashboardServer::Start(d, dashboard_handler_.get()));
  Log("dashboard on ", d.tls_cert.empty() ? "http://" : "https://",
      options.http_listen.substr(0, options.http_listen.rfind(':')), ":", dashboard_->port(), "/",
      auth_->enabled() ? " (tokens required)" : " (no tokens: anyone who reaches it sees every job)");
  return absl::OkStatus();
}

int Server::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

void Server::Supervise() {
  bool serving = true;
  SdWatchdog watchdog;  // WatchdogSec= of the unit: the coordinator answering Serving() proves it alive.
  while (!stopping_.load()) {
    if (launcher_) launcher_->Poll();
    const bool now_serving = core_->Serving();
    watchdog.Kick();
    if (now_serving != serving) {
      serving = now_serving;
      grpc_server_->GetHealthCheckService()->SetServingStatus(serving);
      Log("health: ", serving ? "SERVING" : "NOT_SERVING (the database cannot be written)");
    }
    for (int i = 0; i < 10 && !stopping_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Server::TickFollows() {
  while (!stopping_.load()) {
    follows_->Tick(NowUnix());
    // Five times a second: a race decided is a job stopped, and a second's wait is a second of GPU
    // spent on a checkpoint already known to be worse.
    for (int i = 0; i < 2 && !stopping_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Server::WarnAboutExposure(const ServerOptions& options, bool tls, bool tokens) {
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  const bool loopback = host == "localhost" || absl::StartsWith(host, "127.") || host == "[::1]" ||
                        absl::StartsWith(options.listen, "unix:");
  if (!tokens) {
    Log("WARNING: no --auth-tokens", tls ? "" : " and no TLS", ": ",
        loopback ? "every user of this machine" : "anyone who can reach this port",
        " controls this tallyd: submits jobs (whose models run as code on the workers), reads, cancels and "
        "deletes every job, and can pose as a worker. See SECURITY.md.");
  } else if (!tls && !loopback) {
    Log("WARNING: no TLS on ", options.listen, ": tokens, paths and results cross the network in plaintext. "
        "See SECURITY.md.");
  }
  if (options.data_roots.empty()) {
    Log("WARNING: no --data-root: jobs may name any file that tallyd and its workers can read");
  }
}

void Server::Reload() {
  if (absl::Status s = auth_->Reload(); !s.ok()) {
    Log("reload: ", s.message(), "; the previous tokens stay in force");
  }
}

void Server::Wait() { grpc_server_->Wait(); }

void Server::Shutdown() {
  if (stopping_.exchange(true)) return;
  SdNotify("STOPPING=1");
  const auto start = std::chrono::steady_clock::now();
  grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  if (supervisor_.joinable()) supervisor_.join();
  if (follow_thread_.joinable()) follow_thread_.join();  // Follows start no job past this point.
  core_->BeginDrain();  // No new leases; workers' long polls answer now.
  if (launcher_) launcher_->SignalAll();  // Spawned workers finish the rows in hand, deliver them and exit.
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(drain_seconds_ * 1000));
  int64_t held = core_->LeasesOutstanding();
  Log("stopping: NOT_SERVING, no new leases; workers deliver what they hold (", held, " shard(s) out, up to ",
      drain_seconds_, " s)");
  while (std::chrono::steady_clock::now() < deadline &&
         (core_->LeasesOutstanding(/*spawned=*/false) > 0 || (launcher_ && launcher_->Running() > 0))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (launcher_) launcher_->StopAll(0.5);  // Whatever is still running after the drain.
  held = core_->LeasesOutstanding(/*spawned=*/false);
  if (absl::Status s = core_->SaveHandoff(true); !s.ok()) {
    Log("stopping: cannot save the workers for the next tallyd (", s.message(), "); they will register again");
  }
  Log("stopping: ", held == 0 ? "every shard delivered" : absl::StrCat(held, " shard(s) still out: their workers "
                                                                          "deliver them to the next tallyd"),
      "; stopped after ", absl::StrFormat("%.1f", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()),
      " s");
  core_->StopWaiting();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

Server::~Server() {
  Shutdown();
  dashboard_.reset();  // No request in flight uses the coordinator after this.
  // Blocking calls still queued finish (and answer their callers) before the server that owns
  // their reactors goes away.
  executor_.reset();
  grpc_server_.reset();
  core_.reset();
}

}  // namespace tally
