// tallyd: Tally's coordinator. Accepts jobs from `tally`, hands index ranges of their manifests to
// `tally-worker` processes, commits every per-image result to SQLite and builds the reports.
//
//   tallyd --state-dir /var/lib/tally                                          # 127.0.0.1:50051
//   tallyd --listen 127.0.0.1:0 --port-file /tmp/port --state-dir /tmp/tally   # any free port
//   tallyd --spawn-workers --gpus all                                          # plus one worker per GPU
//   tallyd --metrics-listen 127.0.0.1:9464                                     # Prometheus /metrics
//   tallyd --listen 0.0.0.0:50051 --tls-cert server.pem --tls-key server.key
//          --auth-tokens tokens --data-root /datasets       # on a shared network (one command line)
//
// Flags accept dashes or underscores (--state-dir == --state_dir). --data-root repeats. --help lists
// every flag, grouped, with its default.
// SIGHUP re-reads the tokens file; certificate files are re-read when they change. SECURITY.md
// has the trust model.
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/status/statusor.h"
#include "common/security/data_roots.h"
#include "base/file_util.h"
#include "base/flag_util.h"
#include "common/process/gpu_inventory.h"
#include "base/log.h"
#include "common/process/signals.h"
#include "common/job/rpc.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve on (host:port; port 0 = any free port). Beyond loopback, use TLS and tokens");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain to serve TLS with (re-read when it changes)");
ABSL_FLAG(std::string, tls_key, "", "Private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "", "Require client certificates signed by this CA (mutual TLS)");
ABSL_FLAG(std::string, auth_tokens, "",
          "Tokens file: NAME ROLE sha256:HEX per line (roles client, worker, admin; `tally token` makes one); "
          "re-read on SIGHUP");
ABSL_FLAG(std::string, state_dir, "./tally-state", "Folder for the database (tally.db) and reports");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once serving");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the read-only web dashboard (jobs, live estimates, workers, reports; same tokens and TLS as "
          "gRPC; port 0 picks one). Off by default; loopback unless told");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://host:port/metrics (port 0 = any free port; no TLS or tokens: "
          "a trusted network only). Empty: off");
ABSL_FLAG(std::vector<std::string>, http_allowed_hosts, {},
          "Host names the dashboard answers to besides IP addresses, localhost, its listen name and this machine's "
          "name (comma-separated; e.g. the name of a reverse proxy in front of it). Other Host headers get 403, "
          "against DNS rebinding");
ABSL_FLAG(double, drain_seconds, 5.0,
          "On SIGTERM: NOT_SERVING at once and no new leases; workers deliver what they hold for up to this long, "
          "then tallyd hands its workers and their leases to the next tallyd on the state folder and exits");
ABSL_FLAG(std::vector<std::string>, share_weights, {},
          "Fair share of the workers between owners (token names) with work: NAME=WEIGHT,... (default weight 1; "
          "'-' is the owner of jobs submitted without tokens)");
ABSL_FLAG(double, share_quantum, 30.0,
          "Seconds a worker stays on a job before moving to one waiting at an equal share (one worker, two jobs: "
          "each in turn)");
ABSL_FLAG(double, lease_seconds, 10.0, "A worker silent this long loses its shards to others");
ABSL_FLAG(double, heartbeat_seconds, 1.0, "How often workers heartbeat");
ABSL_FLAG(int, max_shard_attempts, 2,
          "A shard lost with a worker is split into single rows, each then leased alone; a row lost this many "
          "times in all fails, named (2: the row that crashed a worker once fails when it crashes one again)");
ABSL_FLAG(int64_t, max_manifest_rows, 50000000, "Manifests with more data rows are refused");
ABSL_FLAG(std::string, max_json_file_size, "2GiB",
          "COCO annotation, results and panoptic JSON files larger than this are refused, at submission and "
          "by workers (each is read whole into memory)");
ABSL_FLAG(double, submit_read_timeout, 300,
          "Seconds a submission may spend reading its manifest and COCO files; past them it is refused, so "
          "that no submission holds a submission thread without bound");
ABSL_FLAG(double, retain_days, 0, "Delete finished jobs (rows, results, reports) after this many days; 0 = keep");
ABSL_FLAG(bool, spawn_workers, false, "Start and supervise local workers (--gpus or --workers)");
ABSL_FLAG(std::string, gpus, "", "With --spawn-workers: all or 0,1,... (one worker per GPU)");
ABSL_FLAG(int, gpus_per_worker, 1, "With --spawn-workers --gpus: GPUs per worker (for Python models spread over them)");
ABSL_FLAG(int, workers, 0, "With --spawn-workers and no --gpus: number of CPU workers");
ABSL_FLAG(std::string, worker_binary, "", "Path of tally-worker (default: next to tallyd, else PATH)");
ABSL_FLAG(std::string, max_worker_memory, "",
          "With --spawn-workers: each worker's --max-worker-memory (a size such as 8GiB, or none; default: the "
          "worker's own, from its cgroup or the machine's memory)");
ABSL_FLAG(std::string, prediction_store, "",
          "Jobs with a model that name no --prediction-store keep and take predictions in this folder "
          "(docs/prediction-store.md); a job's --prediction-store off opts out");
ABSL_FLAG(std::string, store_max_bytes, "",
          "With --prediction-store: the most it may hold (e.g. 500GiB), for jobs that set no bound of their own");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "A folder whose files clients may name (repeatable): with data roots, manifests, "
          "models, images and masks must resolve inside one (SECURITY.md). Empty: every readable path");

namespace {

const std::vector<tally::FlagGroup>& HelpGroups() {
  static const auto* groups = new std::vector<tally::FlagGroup>{
      {"Serving", {"listen", "port_file", "state_dir", "metrics_listen", "http_listen", "http_allowed_hosts",
                   "drain_seconds"}},
      {"Sharing the workers", {"share_weights", "share_quantum"}},
      {"Security (SECURITY.md)", {"tls_cert", "tls_key", "tls_client_ca", "auth_tokens", "data_root"}},
      {"Workers", {"spawn_workers", "gpus", "gpus_per_worker", "workers", "worker_binary", "max_worker_memory",
                   "lease_seconds", "heartbeat_seconds"}},
      {"Prediction store", {"prediction_store", "store_max_bytes"}},
      {"Limits", {"max_shard_attempts", "max_manifest_rows", "max_json_file_size", "submit_read_timeout",
                  "retain_days"}},
  };
  return *groups;
}

// The server's options from the flags; an error (exit 2) for a flag that cannot be used.
absl::StatusOr<tally::ServerOptions> ReadOptions(std::vector<std::string> data_roots) {
  tally::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  for (const std::string& root : absl::GetFlag(FLAGS_data_root)) data_roots.push_back(root);
  auto roots = tally::DataRoots::Create(data_roots);
  if (!roots.ok()) return roots.status();
  options.data_roots = roots->roots();
  tally::SetProcessDataRoots(*std::move(roots));
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.http_allowed_hosts = absl::GetFlag(FLAGS_http_allowed_hosts);
  options.coordinator.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.coordinator.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
  options.coordinator.heartbeat_seconds = absl::GetFlag(FLAGS_heartbeat_seconds);
  options.coordinator.max_shard_attempts = absl::GetFlag(FLAGS_max_shard_attempts);
  options.coordinator.max_manifest_rows = absl::GetFlag(FLAGS_max_manifest_rows);
  options.coordinator.retain_days = absl::GetFlag(FLAGS_retain_days);
  if (const std::string store = absl::GetFlag(FLAGS_prediction_store); !store.empty()) {
    options.coordinator.prediction_store = tally::AbsolutePath(store);
  }
  if (const std::string bound = absl::GetFlag(FLAGS_store_max_bytes); !bound.empty()) {
    auto bytes = tally::ParseByteSize("store-max-bytes", bound);
    if (!bytes.ok()) return bytes.status();
    if (options.coordinator.prediction_store.empty()) {
      return absl::InvalidArgumentError("--store-max-bytes bounds --prediction-store");
    }
    options.coordinator.store_max_bytes = *bytes;
  }
  options.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (!(options.drain_seconds >= 0)) return absl::InvalidArgumentError("--drain-seconds must be 0 or more");
  options.coordinator.share_quantum_seconds = absl::GetFlag(FLAGS_share_quantum);
  for (const std::string& item : absl::GetFlag(FLAGS_share_weights)) {
    const size_t eq = item.find('=');
    double weight = 0;
    if (eq == std::string::npos || !absl::SimpleAtod(item.substr(eq + 1), &weight) || !(weight > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--share-weights: '", item, "' is not NAME=WEIGHT with a weight above 0"));
    }
    const std::string name = item.substr(0, eq);
    options.coordinator.owner_weights[name == "-" ? "" : name] = weight;
  }
  auto json_bytes = tally::ParseByteSize("max-json-file-size", absl::GetFlag(FLAGS_max_json_file_size));
  if (!json_bytes.ok()) return json_bytes.status();
  if (*json_bytes < 1) return absl::InvalidArgumentError("--max-json-file-size must be at least 1 byte");
  options.coordinator.max_json_file_bytes = *json_bytes;
  options.coordinator.submit_read_seconds = absl::GetFlag(FLAGS_submit_read_timeout);
  if (!(options.coordinator.submit_read_seconds > 0)) {
    return absl::InvalidArgumentError("--submit-read-timeout must be more than 0 seconds");
  }
  options.spawn_workers = absl::GetFlag(FLAGS_spawn_workers);
  if (!options.spawn_workers) return options;
  options.workers.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  options.workers.log_dir = options.coordinator.state_dir;
  if (const std::string memory = absl::GetFlag(FLAGS_max_worker_memory); !memory.empty()) {
    if (memory != "none") {
      if (absl::Status s = tally::ParseByteSize("max-worker-memory", memory).status(); !s.ok()) return s;
    }
    options.workers.extra_args.push_back("--max-worker-memory=" + memory);
  }
  if (absl::GetFlag(FLAGS_gpus).empty()) {
    options.workers.cpu_workers = std::max(1, absl::GetFlag(FLAGS_workers));
    return options;
  }
  auto gpus = tally::SelectGpus(absl::GetFlag(FLAGS_gpus));
  if (!gpus.ok()) return gpus.status();
  auto grouped = tally::GroupGpus(*gpus, absl::GetFlag(FLAGS_gpus_per_worker));
  if (!grouped.ok()) return grouped.status();
  options.workers.gpus = *grouped;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  tally::SetLogName("tallyd");
  const std::string usage = "Tally coordinator. Usage: tallyd [--listen host:port] [--state-dir DIR] [flags]";
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> normalized = tally::NormalizeFlagNames(argc, argv);
  if (tally::AsksForHelp(normalized)) {
    std::cout << tally::GroupedFlagHelp(usage, HelpGroups(), "server/main.cc");
    return 0;
  }
  const std::vector<std::string> data_roots = tally::TakeRepeatedFlag(&normalized, "data_root");
  std::vector<char*> args = tally::ArgvPointers(normalized);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());

  tally::BlockTerminationSignals();
  tally::DumpStacksOnQuitSignal();
  tally::BlockReloadSignal();
  // After the masks: gRPC's threads start here and inherit them (a termination or reload signal
  // must reach only the thread that waits for it). Exits do not wait on those threads (rpc.h).
  tally::KeepGrpcUntilExit();
  absl::StatusOr<tally::ServerOptions> options = ReadOptions(data_roots);
  if (!options.ok()) {
    std::cerr << "tallyd: " << options.status().message() << "\n";
    return 2;
  }
  auto server = tally::Server::BuildAndStart(*options);
  if (!server.ok()) {
    std::cerr << "tallyd: " << server.status().message() << "\n";
    return 1;
  }
  tally::HandleReloadSignals([s = server->get()] {
    tally::Log("received SIGHUP: re-reading the tokens file");
    s->Reload();
  });
  std::thread waiter = tally::WaitForTerminationSignal([&](int sig) {
    tally::Log("received signal ", sig, ", shutting down");
    (*server)->Shutdown();
  });
  (*server)->Wait();
  waiter.join();
  return 0;
}
