#include "client/local_run.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/progress.h"
#include "common/security/auth_tokens.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/job/report_files.h"
#include "common/process/subprocess.h"
#include "common/process/worker_launcher.h"

namespace tally {
namespace {

std::atomic<int> g_signal{0};

int Fail(const std::string& message) {
  std::cerr << "tally run: " << message << "\n";
  return 1;
}

// A loopback port for tallyd, chosen before it starts so that the workers, whose start-up is the
// longest (loading LibTorch, initialising CUDA), start beside tallyd instead of after it. The
// socket stays bound, never listening, until tallyd listens on the same port: SO_REUSEPORT lets
// tallyd bind it too (gRPC servers set it), and only processes of this user could join it. 0 (and
// *fd -1) when it cannot be had; tallyd then picks its own port and the workers wait for it.
int ReservePort(int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0) return 0;
  const int one = 1;
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (setsockopt(*fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
      bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(*fd);
    *fd = -1;
    return 0;
  }
  return ntohs(addr.sin_port);
}

// The run's own coordinator and workers.
struct LocalCluster {
  std::unique_ptr<Subprocess> server;
  std::string server_log;
  std::unique_ptr<WorkerLauncher> workers;
  std::string address;  // 127.0.0.1:PORT.
};

// Fresh tokens for this run's own processes, so that other users of the machine cannot reach
// its coordinator: an admin token for this client, a worker token for the workers.
absl::Status WriteRunTokens(const std::string& tokens_file, const std::string& client_token,
                            const std::string& worker_token) {
  unlink(tokens_file.c_str());
  return WritePrivateFile(tokens_file,
                          absl::StrCat(TokenLine("tally-run", Role::kAdmin, client_token), "\n",
                                       TokenLine("tally-run-workers", Role::kWorker, worker_token), "\n"),
                          /*append=*/false);
}

// The port tallyd wrote into `port_file` once listening (0 after 30 s); an error if it exited.
absl::StatusOr<int> WaitForPort(const std::string& port_file, Subprocess& server, const std::string& log) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port) return port;
    if (!server.Running()) {
      return absl::UnavailableError(absl::StrCat("tallyd exited (", server.ExitDescription(), "):\n", TailOfFile(log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// Starts tallyd on a reserved loopback port and, beside it, the workers (after it where no port
// could be reserved). Returns when tallyd listens.
absl::StatusOr<LocalCluster> StartCluster(const LocalRunOptions& options, const std::string& state_dir,
                                          const std::string& tokens_file, const std::string& worker_token) {
  const std::string tallyd = FindExecutable("tallyd");
  if (tallyd.empty()) return absl::NotFoundError("cannot find the tallyd executable next to tally or on PATH");
  const std::string port_file = state_dir + "/port";
  unlink(port_file.c_str());
  LocalCluster c;
  int reservation = -1;
  const int reserved = ReservePort(&reservation);
  SpawnOptions coordinator;
  coordinator.argv = {tallyd, "--listen", absl::StrCat("127.0.0.1:", reserved), "--port-file", port_file, "--state-dir",
                      state_dir, "--lease-seconds", absl::StrCat(options.lease_seconds), "--auth-tokens", tokens_file};
  coordinator.log_path = c.server_log = state_dir + "/tallyd.log";
  ASSIGN_OR_RETURN(c.server, Subprocess::Spawn(coordinator));
  WorkerLaunchOptions wl;
  wl.gpus = options.gpus;
  wl.cpu_workers = options.cpu_workers;
  wl.log_dir = state_dir;
  // One job, then the workers exit: no model process is started ahead for a next job (first, so
  // that a --worker-flag can still ask for one).
  if (!options.follow) wl.extra_args.push_back("--spare_interpreter=false");
  wl.extra_args.insert(wl.extra_args.end(), options.worker_args.begin(), options.worker_args.end());
  wl.env.emplace_back("TALLY_TOKEN", worker_token);
  if (reserved != 0) {  // Workers dial tallyd's port while it starts (gRPC retries the connection).
    wl.coordinator = absl::StrCat("127.0.0.1:", reserved);
    ASSIGN_OR_RETURN(c.workers, WorkerLauncher::Start(wl));
  }
  absl::StatusOr<int> port = WaitForPort(port_file, *c.server, c.server_log);
  if (reservation >= 0) close(reservation);
  if (!port.ok()) return port.status();
  if (*port == 0) return absl::DeadlineExceededError(absl::StrCat("tallyd did not start within 30 s; see ", c.server_log));
  if (reserved != 0 && *port != reserved) {
    return absl::InternalError(
        absl::StrCat("tallyd listens on port ", *port, ", not on the port reserved for it (", reserved, ")"));
  }
  c.address = absl::StrCat("127.0.0.1:", *port);
  if (reserved == 0) {
    wl.coordinator = c.address;
    ASSIGN_OR_RETURN(c.workers, WorkerLauncher::Start(wl));
  }
  return c;
}

// The run's own tallyd wrote the job's report into STATE_DIR/reports/JOB on this machine: its files
// are copied from there into `out_dir` (in the kernel, each to a temporary name, then renamed, as a
// fetch writes them) instead of streaming through gRPC (0.1-0.15 s for a 30 MB per_image.csv).
// Fails, for FetchReport to do it, when a required file is not there.
absl::StatusOr<std::vector<std::string>> CopyLocalReport(const std::string& report_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const char* f : kReportFiles) {
    if (!fs::is_regular_file(report_dir + "/" + f, ec)) return absl::NotFoundError(f);
    names.emplace_back(f);
  }
  for (const char* f : kOptionalReportFiles) {
    if (fs::is_regular_file(report_dir + "/" + f, ec)) names.emplace_back(f);
  }
  RETURN_IF_ERROR(MakeDirs(out_dir));
  std::vector<std::string> written;
  for (const std::string& f : names) {
    const std::string to = out_dir + "/" + f, tmp = absl::StrCat(out_dir, "/.", f, ".copy-", getpid());
    if (!fs::copy_file(report_dir + "/" + f, tmp, fs::copy_options::overwrite_existing, ec) ||
        std::rename(tmp.c_str(), to.c_str()) != 0) {
      const std::string why = ec ? ec.message() : std::strerror(errno);
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("copying ", f, ": ", why));
    }
    written.push_back(to);
  }
  return written;
}

// Progress until the job ends. Ctrl-C cancels it; a dead tallyd, or every worker gone before the
// job ended, sets `abort_reason`.
absl::StatusOr<v1::Job> WatchLocalJob(TallyClient& client, const std::string& job_id, LocalCluster& c,
                                      ProgressPrinter& progress, std::string* abort_reason) {
  bool cancelled = false;
  auto keep_going = [&]() -> bool {
    std::vector<std::string> exited;
    const int alive = c.workers->Poll(&exited);
    for (const std::string& e : exited) progress.Note("tally run: warning: " + e);
    if (!c.server->Running()) {
      *abort_reason = absl::StrCat("tallyd exited (", c.server->ExitDescription(), "):\n", TailOfFile(c.server_log));
      return false;
    }
    if (g_signal != 0 && !cancelled) {
      cancelled = true;
      progress.Note("tally run: interrupted; cancelling the job");
      client.Cancel(job_id).IgnoreError();
    }
    if (alive == 0 && abort_reason->empty() && !cancelled) {
      auto job = client.Get(job_id);
      if (job.ok() && !IsTerminal(job->state())) {
        *abort_reason = "every worker exited before the job finished; see the worker logs above";
        client.Cancel(job_id).IgnoreError();
      }
    }
    return true;
  };
  return client.Watch(
      job_id, 250, [&](const v1::Job& job) { progress.Update(job); }, keep_going,
      [&](const std::string& why) { progress.Note("tally run: lost the coordinator (" + why + "); reconnecting"); });
}

// The summary table and the last line of a succeeded job; returns its exit code.
int PrintOutcome(const v1::Job& last, const std::string& out_dir) {
  std::cout << "\n";
  std::cout << last.summary();
  std::cout << "\n" << last.images_evaluated() << "/" << last.images_total() << " images evaluated";
  if (last.images_failed() > 0) std::cout << ", " << last.images_failed() << " failed (see report.json 'failures')";
  // The rate `tally status` shows (from the first row leased: start-up not included); the report's
  // Throughput fact names it beside the others.
  // The report's files, the optional ones it has (groups.csv, lesions.csv, summary.json) too.
  std::vector<std::string> files(std::begin(kReportFiles), std::end(kReportFiles));
  for (const char* f : kOptionalReportFiles) {
    if (access((out_dir + "/" + f).c_str(), F_OK) == 0) files.emplace_back(f);
  }
  std::cout << absl::StrFormat("; %.1f rows/s from the first row leased. Reports: %s/{%s}\n", last.images_per_second(),
                               out_dir, absl::StrJoin(files, ","));
  const int code = JobExitCode(last);
  if (code == kExitTooManyFailedRows) {
    std::cerr << absl::StrFormat(
        "tally run: %d of %d rows failed, more than --max-failed-fraction %g allows (exit code %d); the reasons are "
        "above and in report.json 'failures'\n",
        last.images_failed(), last.images_total(), last.spec().max_failed_fraction(), code);
  }
  return code;
}

// tally run --follow: the follow's checkpoints as they are decided, until it ends (--until-step,
// --idle) or Ctrl-C stops it; then its curve files into the output folder.
int RunFollow(TallyClient& client, LocalCluster& c, const LocalRunOptions& options, const std::string& state_dir) {
  absl::StatusOr<v1::Follow> created = client.CreateFollow(*options.follow);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  const std::string id = created->follow_id();
  std::cerr << "tally run: follow " << id << " of " << options.follow->folder() << "\n";
  std::map<std::string, std::string> shown;
  absl::StatusOr<v1::Follow> f = created;
  while (true) {
    if (!c.server->Running()) {
      return Fail(absl::StrCat("tallyd exited (", c.server->ExitDescription(), "):\n", TailOfFile(c.server_log)));
    }
    if (g_signal != 0) {
      std::cerr << "tally run: interrupted; stopping the follow\n";
      client.CancelFollow(id).IgnoreError();
    }
    f = client.GetFollow(id);
    if (!f.ok()) return Fail(std::string(f.status().message()));
    for (const v1::FollowCheckpoint& cp : f->checkpoints()) {
      if (cp.state() == "settling" || cp.state() == "running" || cp.state() == "queued") continue;
      const std::string line = absl::StrFormat("step %d  %s  %s%s", cp.step(), cp.name(), cp.state(),
                                               cp.metrics_size() > 0 ? absl::StrFormat("  %s %.4f", cp.metrics(0).name(),
                                                                                       cp.metrics(0).mean())
                                                                     : std::string());
      if (shown[cp.name()] != line) std::cout << line << "\n" << std::flush;
      shown[cp.name()] = line;
    }
    if (f->state() != v1::Follow::FOLLOW_STATE_FOLLOWING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const std::string report = absl::StrCat(state_dir, "/follows/", id, "/report");
  for (const char* name : {"curve.csv", "curve.json", "curve.html"}) {
    std::error_code ec;
    std::filesystem::copy_file(report + "/" + name, options.out_dir + "/" + name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return Fail(absl::StrCat("copying ", name, ": ", ec.message()));
  }
  std::cout << "follow " << id << (f->state() == v1::Follow::FOLLOW_STATE_FINISHED ? " finished" : " stopped")
            << "; best step " << f->best_step() << ". Curve: " << options.out_dir << "/{curve.csv,curve.json,curve.html}\n";
  return f->state() == v1::Follow::FOLLOW_STATE_FINISHED ? 0 : 130;
}

}  // namespace

int RunLocally(const LocalRunOptions& options) {
  const std::string state_dir = options.out_dir + "/.tally";
  if (absl::Status s = MakeDirs(state_dir); !s.ok()) return Fail(std::string(s.message()));
  // Ctrl-C / SIGTERM: cancel the job and clean up instead of dying with children around.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = [](int sig) { g_signal = sig; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const std::string client_token = NewToken(), worker_token = NewToken();
  const std::string tokens_file = state_dir + "/tokens";
  if (absl::Status s = WriteRunTokens(tokens_file, client_token, worker_token); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  absl::StatusOr<LocalCluster> cluster = StartCluster(options, state_dir, tokens_file, worker_token);
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  const int n = cluster->workers->size();
  std::cerr << "tally run: " << n << (options.gpus.empty() ? " CPU" : " GPU") << " worker" << (n == 1 ? "" : "s")
            << ", coordinator at " << cluster->address << ", logs in " << state_dir << "\n";
  ClientSecurityOptions security;
  security.token = client_token;
  auto connected = TallyClient::Create(cluster->address, security);
  if (!connected.ok()) return Fail(std::string(connected.status().message()));
  TallyClient& client = **connected;
  if (options.follow) {
    const int code = RunFollow(client, *cluster, options, state_dir);
    connected->reset();
    cluster->workers->StopAll();
    cluster->server->Terminate(5.0);
    return code;
  }
  auto submitted = client.Submit(options.spec);
  if (!submitted.ok()) return Fail(std::string(submitted.status().message()));
  const std::string job_id = submitted->job_id();
  std::cerr << "tally run: job " << job_id << ": " << submitted->images_total() << " images, "
            << (!options.spec.model().empty()          ? options.spec.model()
                : !options.spec.coco_results().empty() ? "scoring detections " + options.spec.coco_results()
                                                       : std::string("scoring predictions"))
            << "\n";
  for (const std::string& w : submitted->spec().manifest_warnings()) std::cerr << "tally run: warning: " << w << "\n";
  ProgressPrinter progress;
  std::string abort_reason;
  absl::StatusOr<v1::Job> last = WatchLocalJob(client, job_id, *cluster, progress, &abort_reason);
  if (!abort_reason.empty()) return Fail(abort_reason);
  if (!last.ok()) return Fail(std::string(last.status().message()));
  progress.Done(*last);
  // The job has ended: the workers stop while the report is fetched (they took 0.1-0.2 s to exit,
  // which every run waited for after the fetch).
  cluster->workers->SignalAll();
  absl::StatusOr<std::vector<std::string>> files = absl::UnavailableError("no report written");
  if (last->report_ready()) files = CopyLocalReport(absl::StrCat(state_dir, "/reports/", job_id), options.out_dir);
  if (!files.ok()) files = client.FetchReport(job_id, options.out_dir);
  // The client's connection goes first: tallyd's shutdown waits for its connections to close (its
  // GOAWAY stays unread on an idle channel), which cost every run 2 s (the shutdown's deadline).
  connected->reset();
  cluster->workers->StopAll();
  cluster->server->Terminate(5.0);
  if (!files.ok()) return Fail(absl::StrCat("fetching the report failed: ", files.status().message()));
  if (g_signal != 0) {
    std::cerr << "tally run: cancelled; partial report in " << options.out_dir << "\n";
    return 130;
  }
  if (last->state() != v1::JOB_STATE_SUCCEEDED) {
    Fail(absl::StrCat("job ", job_id, " ", JobStateName(last->state()), ": ", last->error()));
    return JobExitCode(*last);
  }
  return PrintOutcome(*last, options.out_dir);
}

}  // namespace tally
