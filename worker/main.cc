// tally-worker: evaluates shards of Tally jobs on one device (one process per GPU, or CPU).
// Registers with the coordinator, loads each job's TorchScript model once, runs the pipelined data
// path and streams per-image results back. Usually started by `tally run` or `tallyd
// --spawn-workers`; by hand:
//
//   tally-worker --coordinator 10.0.0.5:50051 --device cuda:0 --threads 16
//   CUDA_VISIBLE_DEVICES=3 tally-worker --coordinator host:50051 --device cuda:0
//   TALLY_TOKEN=... tally-worker --coordinator tally.lab:50051 --tls-ca ca.pem --data-root /datasets
//
// --data-root repeats: with it, models, images and masks must resolve inside one (SECURITY.md).
// SIGTERM/SIGINT: stop leasing, finish the rows in hand, send them, exit 0.
// Exit codes: 0 stopped, 1 error (coordinator unreachable past --max-connect-seconds), 2 usage,
// 3 out of service (the device does not work here, or the model file is missing on this host:
// restarting will not help), 75 a decode or forward pass ran past the job's batch timeout (the
// rows were failed or handed back; restart the worker), 77 refused by the coordinator (an unknown
// token, or one that is not a worker token, 3 times in a row).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <malloc.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <time.h>
#include <unistd.h>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/security/auth_tokens.h"
#include "common/security/data_roots.h"
#include "base/flag_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/process/signals.h"
#include "common/formats/decode.h"
#include "common/job/rpc.h"
#include "worker/early_cuda.h"
#include "worker/estimate.h"
#include "worker/worker.h"
#include "common/sources/row_files.h"
#include "common/sources/tar_members.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address host:port");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(std::string, name, "", "Name shown in reports (default host:device)");
ABSL_FLAG(int, threads, 0,
          "Decode/metric threads, and LibTorch threads on CPU (0 = all cores for a CPU worker, the cores "
          "divided by the host's GPUs for a GPU worker)");
ABSL_FLAG(int, batch_size, 0, "Batch size for jobs that leave it to the worker (0 = 8 on CPU, 32 on CUDA)");
ABSL_FLAG(double, max_connect_seconds, 0, "Give up if the coordinator stays unreachable this long (0 = never)");
ABSL_FLAG(int, max_leases, 16, "Most shards held at once (the worker leases while fewer than ~4 batches are queued)");
ABSL_FLAG(bool, count_logit_ties, false, "Count pixels whose two largest logits are exactly equal");
ABSL_FLAG(bool, cudnn_benchmark, false,
          "Let cuDNN time its algorithms per input shape (may change results between processes)");
ABSL_FLAG(bool, jit_optimize, false,
          "TorchScript's profiling optimisations (operator fusion) for the model: for models that gain from "
          "fusion, at about a second more start-up (seconds with the channels-last trial); off, the graph "
          "runs op by op as in eager PyTorch");
ABSL_FLAG(std::string, cache_dir, "auto",
          "Where --channels-last auto's trial results are kept, so a model tried on this machine starts "
          "without the trial: auto ($XDG_CACHE_HOME/tally, else $HOME/.cache/tally) or a folder; none keeps none");
ABSL_FLAG(int, warmup_batches, -1,
          "Extra passes over the first batch on CUDA before its results (-1 = 2 with --jit_optimize, whose "
          "first passes run unoptimised, else 0: the first batch's own pass is its warm-up)");
ABSL_FLAG(bool, warm_up_device, true,
          "On CUDA, a generic warm-up on the device (cuDNN's libraries, kernel loading) while the model is read");
ABSL_FLAG(bool, spare_interpreter, true,
          "Python models: once a job's model is loaded, start the next job's model process "
          "(same interpreter and environment) with the installed modules the model processes imported: the next job "
          "skips importing torch and the like. An idle model process's host memory (no GPU memory) while it waits");
ABSL_FLAG(int, staging_slots, 3, "Batches staged or in flight at once (2-16): more overlap, more host memory");
ABSL_FLAG(int, gpus_per_worker, 1,
          "GPUs this worker owns, from --device on (Python models get them all; TorchScript needs 1)");
ABSL_FLAG(std::string, tls_ca, "", "Connect with TLS, trusting this CA for tallyd's certificate");
ABSL_FLAG(std::string, tls_cert, "", "Client certificate for mutual TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "Private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "", "Name to check tallyd's certificate against (default: the host of --coordinator)");
ABSL_FLAG(std::string, token_file, "", "File holding this worker's token (default: the TALLY_TOKEN environment variable)");
ABSL_FLAG(std::string, estimate, "",
          "Instead of serving: tally estimate's trial passes for the JobSpec in this file (binary protobuf); "
          "the result goes to stdout");
ABSL_FLAG(int, estimate_workers, 1, "With --estimate: workers the evaluation will run, for the prediction");
ABSL_FLAG(int, estimate_decode_threads, 0, "With --estimate: decode threads of the host in all (0 = its cores)");
ABSL_FLAG(int, estimate_max_batch, 0, "With --estimate: largest batch to try (0 = 512 on CUDA, 16 on CPU)");
ABSL_FLAG(double, estimate_seconds, 0.5, "With --estimate: timed passes per batch size last at least this long");
ABSL_FLAG(bool, estimate_json, false, "With --estimate: print JSON");
ABSL_FLAG(double, estimate_spawned_unix, 0, "With --estimate: when the client started this process (Unix time)");
ABSL_FLAG(double, gpu_memory_limit_gib, 0, "Cap this worker's GPU memory (GiB; 0 = no cap), e.g. on a shared GPU");
ABSL_FLAG(std::string, max_worker_memory, "",
          "Host memory this worker's rows may use: a size (1GiB, 512MiB), or none; a row that needs more "
          "fails with the reason and batches are split to fit (default: the cgroup's limit, else physical "
          "memory divided among the host's GPUs for a GPU worker, less what the process holds with its model)");
ABSL_FLAG(std::string, scratch_limit, "",
          "Scratch space ($TMPDIR) the decompressed copies of compressed tar shards may take together: a size "
          "(10GiB); a member beyond it fails its row (default: a quarter of $TMPDIR's free space)");
ABSL_FLAG(int, host_workers, 0,
          "Workers sharing this host's memory (tally run and tallyd --spawn-workers say how many they start): "
          "the default --max-worker-memory is this host's share (0: unknown; GPU workers then divide by the GPUs)");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "A folder whose files jobs may make this worker read (repeatable): with data roots, models, images and "
          "masks must resolve inside one (SECURITY.md). Empty: every readable path, with a warning");

namespace {

// Seconds since this process was exec'd, from /proc (10 ms resolution); -1 if unknown. A GPU
// worker spends about half a second in the dynamic loader and LibTorch's static initialisers
// before main runs: the first line of its log says how long.
double ProcessAgeSeconds() {
  std::ifstream stat("/proc/self/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // The command name may hold spaces.
  if (paren == std::string::npos || paren + 2 > text.size()) return -1;
  std::istringstream fields(text.substr(paren + 2));  // From field 3 (state) on.
  std::string field;
  for (int i = 3; fields >> field; ++i) {
    if (i != 22) continue;  // starttime, in clock ticks after boot.
    timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    const double started = std::strtod(field.c_str(), nullptr) / static_cast<double>(sysconf(_SC_CLK_TCK));
    return static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - started;
  }
  return -1;
}

// tally-worker --estimate SPEC: tally estimate's trials (worker/estimate.h), run by `tally estimate`.
int RunEstimateCommand(const tally::WorkerOptions& worker) {
  tally::EstimateOptions options;
  std::string bytes;
  if (absl::Status s = tally::ReadFileBytes(absl::GetFlag(FLAGS_estimate), &bytes); !s.ok()) {
    std::cerr << "tally-worker: " << s.message() << "\n";
    return 2;
  }
  if (!options.spec.ParseFromString(bytes)) {
    std::cerr << "tally-worker: --estimate " << absl::GetFlag(FLAGS_estimate) << ": not a JobSpec\n";
    return 2;
  }
  options.worker = worker;
  options.worker.spare_interpreter = false;  // One model, then this process exits.
  options.workers = std::max(1, absl::GetFlag(FLAGS_estimate_workers));
  options.decode_threads = absl::GetFlag(FLAGS_estimate_decode_threads);
  options.max_batch = absl::GetFlag(FLAGS_estimate_max_batch);
  options.seconds_per_trial = absl::GetFlag(FLAGS_estimate_seconds);
  options.json = absl::GetFlag(FLAGS_estimate_json);
  options.spawned_unix = absl::GetFlag(FLAGS_estimate_spawned_unix);
  absl::StatusOr<tally::EstimateResult> r = tally::RunEstimate(options);
  if (!r.ok()) {
    std::cerr << "tally estimate: " << r.status().message() << "\n";
    return absl::IsInvalidArgument(r.status()) || absl::IsNotFound(r.status()) ? 2 : 1;
  }
  std::cout << (options.json ? tally::EstimateJson(*r) : tally::EstimateText(*r)) << std::flush;
  return 0;
}

const std::vector<tally::FlagGroup>& HelpGroups() {
  static const auto* groups = new std::vector<tally::FlagGroup>{
      {"Coordinator", {"coordinator", "name", "max_connect_seconds"}},
      {"Security (SECURITY.md)", {"tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file", "data_root"}},
      {"Device and model", {"device", "gpus_per_worker", "threads", "batch_size", "count_logit_ties", "cudnn_benchmark",
                            "jit_optimize", "cache_dir", "warmup_batches", "warm_up_device", "spare_interpreter"}},
      {"Limits", {"max_worker_memory", "host_workers", "scratch_limit", "max_leases", "staging_slots",
                  "gpu_memory_limit_gib"}},
      {"tally estimate (run by `tally estimate`)",
       {"estimate", "estimate_workers", "estimate_decode_threads", "estimate_max_batch", "estimate_seconds",
        "estimate_json", "estimate_spawned_unix"}},
  };
  return *groups;
}

// --cache-dir: auto ($XDG_CACHE_HOME/tally, else $HOME/.cache/tally), none (""), or the folder.
std::string CacheDir(const std::string& flag) {
  if (flag == "none") return "";
  if (flag != "auto") return flag;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return xdg != nullptr && xdg[0] == '/'     ? std::string(xdg) + "/tally"
         : home != nullptr && home[0] == '/' ? std::string(home) + "/.cache/tally"
                                             : std::string();
}

// The worker's options from the flags (the token read from --token-file or TALLY_TOKEN); an error
// (exit 2) for a flag that cannot be used.
absl::StatusOr<tally::WorkerOptions> ReadOptions() {
  auto token = tally::ReadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return token.status();
  tally::WorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.security.token = *token;
  options.device = absl::GetFlag(FLAGS_device);
  options.name = absl::GetFlag(FLAGS_name);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.default_batch_size = absl::GetFlag(FLAGS_batch_size);
  options.max_connect_seconds = absl::GetFlag(FLAGS_max_connect_seconds);
  options.max_leases = absl::GetFlag(FLAGS_max_leases);
  if (const char* parent = std::getenv("TALLY_SPAWNED_BY"); parent != nullptr) options.spawned_by = std::atoi(parent);
  options.count_logit_ties = absl::GetFlag(FLAGS_count_logit_ties);
  options.cudnn_benchmark = absl::GetFlag(FLAGS_cudnn_benchmark);
  options.jit_optimize = absl::GetFlag(FLAGS_jit_optimize);
  options.cache_dir = CacheDir(absl::GetFlag(FLAGS_cache_dir));
  options.warmup_batches = absl::GetFlag(FLAGS_warmup_batches);
  if (options.warmup_batches < 0) options.warmup_batches = options.jit_optimize ? 2 : 0;
  options.warm_up_device = absl::GetFlag(FLAGS_warm_up_device);
  options.spare_interpreter = absl::GetFlag(FLAGS_spare_interpreter);
  options.staging_slots = std::clamp(absl::GetFlag(FLAGS_staging_slots), 2, 16);
  options.gpu_memory_limit_gib = absl::GetFlag(FLAGS_gpu_memory_limit_gib);
  options.gpus_per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
  if (options.gpus_per_worker < 1) return absl::InvalidArgumentError("--gpus-per-worker must be >= 1");
  if (const std::string memory = absl::GetFlag(FLAGS_max_worker_memory); memory == "none") {
    options.max_worker_memory = -1;
  } else if (!memory.empty()) {
    ASSIGN_OR_RETURN(options.max_worker_memory, tally::ParseByteSize("max-worker-memory", memory));
  }
  options.host_workers = std::max(0, absl::GetFlag(FLAGS_host_workers));
  if (const std::string scratch = absl::GetFlag(FLAGS_scratch_limit); !scratch.empty()) {
    ASSIGN_OR_RETURN(const int64_t bytes, tally::ParseByteSize("scratch-limit", scratch));
    tally::SetScratchLimit(bytes);
  }
  return options;
}

// A worker spawned by tallyd ends with it: a tallyd killed with SIGKILL sends no SIGTERM to
// deliver (PR_SET_PDEATHSIG follows the thread that spawned, not the process), and a worker left
// behind would hold its GPU's memory until a new tallyd refused it. Its leases expire there.
void WatchParent(int parent) {
  std::thread([parent] {
    while (getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    tally::Log("tallyd (pid ", parent, ") has ended; this worker it spawned exits now");
    std::fflush(nullptr);
    std::_Exit(0);
  }).detach();
}

// Serves until a termination signal (finishing the rows in hand) or an error; the exit code.
int Serve(const tally::WorkerOptions& options) {
  // Termination signals go to one thread (WaitForTerminationSignal): blocked before any thread starts.
  tally::BlockTerminationSignals();
  // After the mask: gRPC's threads start here and inherit it (a termination signal must reach only
  // the thread that waits for it). Exits do not wait on those threads (common/job/rpc.h).
  tally::KeepGrpcUntilExit();
  tally::DumpStacksOnQuitSignal();
  auto worker = tally::Worker::Create(options);
  if (!worker.ok()) {
    std::cerr << "tally-worker: " << worker.status().message() << "\n";
    return 2;
  }
  std::thread waiter = tally::WaitForTerminationSignal([&](int sig) {
    tally::Log("received signal ", sig, ", stopping");
    (*worker)->Stop();
  });
  waiter.detach();
  if (options.spawned_by > 0) WatchParent(options.spawned_by);
  absl::Status s = (*worker)->Run();
  // Stopped on request while it was (re)connecting: it held nothing, so this is a clean stop.
  if (absl::IsCancelled(s)) {
    tally::Log(s.message());
    return 0;
  }
  if (!s.ok()) {
    tally::Log(s.message());
    std::cerr << "tally-worker: " << s.message() << "\n";
    // Out of service (this host's device or files), or refused by the coordinator (the token): a
    // restart would fail the same way.
    if (absl::IsPermissionDenied(s)) return tally::kExitRefused;
    return absl::IsFailedPrecondition(s) ? tally::kExitOutOfService : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double started_after = ProcessAgeSeconds();
  std::atexit(tally::JoinEarlyCuda);  // Before any exit path: see worker/early_cuda.h.
  const std::string usage = "Tally worker. Usage: tally-worker --coordinator host:port --device cpu|cuda:N [flags]";
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> normalized = tally::NormalizeFlagNames(argc, argv);
  if (tally::AsksForHelp(normalized)) {
    std::cout << tally::GroupedFlagHelp(usage, HelpGroups(), "worker/main.cc");
    return 0;
  }
  std::vector<std::string> data_roots = tally::TakeRepeatedFlag(&normalized, "data_root");
  std::vector<char*> args = tally::ArgvPointers(normalized);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  tally::SetLogName("tally-worker[" + absl::GetFlag(FLAGS_device) + "]");
  if (absl::GetFlag(FLAGS_estimate).empty() && started_after >= 0) {
    tally::Log("starting: main reached ", absl::StrFormat("%.2f", started_after),
               " s after exec (loading and initialising libraries)");
  }
  // Fixed allocator thresholds. glibc otherwise raises its mmap threshold to the largest block
  // freed (up to 32 MiB) and its trim threshold to twice that, so one large image leaves every
  // decode thread's arena holding tens of MiB for the rest of the process. Blocks of 16 MiB and
  // more (a 2300x2300 RGB image) are mapped and go straight back to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
  for (const std::string& root : absl::GetFlag(FLAGS_data_root)) data_roots.push_back(root);
  auto roots = tally::DataRoots::Create(data_roots);
  if (!roots.ok()) {
    std::cerr << "tally-worker: " << roots.status().message() << "\n";
    return 2;
  }
  if (roots->empty() && absl::GetFlag(FLAGS_estimate).empty()) {
    tally::Log("WARNING: no --data-root: jobs may make this worker read any file it can (SECURITY.md)");
  }
  tally::SetProcessDataRoots(*std::move(roots));
  absl::StatusOr<tally::WorkerOptions> options = ReadOptions();
  if (!options.ok()) {
    std::cerr << "tally-worker: " << options.status().message() << "\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_estimate).empty()) return RunEstimateCommand(*options);
  const int code = Serve(*options);
  // Everything the worker owed is sent (Serve returns after the rows in hand are delivered) and its
  // log lines are written unbuffered: the process ends here, without running the libraries' exit
  // handlers and static destructors (LibTorch's, CUDA's), which took 0.1-0.15 s of every `tally run`'s
  // shutdown. Python model processes end with it (PR_SET_PDEATHSIG).
  tally::JoinEarlyCuda();
  std::fflush(nullptr);
  std::_Exit(code);
}
