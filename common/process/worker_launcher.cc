#include "common/process/worker_launcher.h"

#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/process/cpu_placement.h"

namespace tally {

absl::StatusOr<std::unique_ptr<WorkerLauncher>> WorkerLauncher::Start(WorkerLaunchOptions options) {
  if (options.worker_binary.empty()) options.worker_binary = FindExecutable("tally-worker");
  if (options.worker_binary.empty()) {
    return absl::NotFoundError("cannot find the tally-worker executable next to this program or on PATH");
  }
  const bool gpu = !options.gpus.empty();
  const int n = gpu ? static_cast<int>(options.gpus.size()) : std::max(1, options.cpu_workers);
  // Each worker's cores: on its GPU's NUMA node when the topology says (cpu_placement.h);
  // TALLY_CPU_PLACEMENT=contiguous ignores the GPUs' nodes.
  const std::vector<int> cpus = AllowedCpus();
  std::vector<std::vector<int>> near(n);
  const char* placement = std::getenv("TALLY_CPU_PLACEMENT");
  for (int i = 0; gpu && (placement == nullptr || std::string(placement) != "contiguous") && i < n; ++i) {
    near[i] = GpuLocalCpus(options.gpus[i].substr(0, options.gpus[i].find(',')));
  }
  const std::vector<std::vector<int>> placed = PlaceWorkers(n, cpus, near, CoreOfCpus(cpus));
  std::unique_ptr<WorkerLauncher> launcher(new WorkerLauncher(options));
  for (int i = 0; i < n; ++i) {
    Worker w;
    const std::vector<int>& mine = placed[i];
    // A worker owning several GPUs (--gpus-per-worker) sees them as cuda:0..K-1.
    const int owned = gpu ? static_cast<int>(std::count(options.gpus[i].begin(), options.gpus[i].end(), ',')) + 1 : 0;
    w.spawn.argv = {options.worker_binary, "--coordinator", options.coordinator, "--device", gpu ? "cuda:0" : "cpu",
                    "--threads", absl::StrCat(mine.size()), "--name",
                    gpu ? absl::StrCat("gpu", absl::StrReplaceAll(options.gpus[i], {{",", "+"}}))
                        : absl::StrCat("cpu", i)};
    if (owned > 1) {
      w.spawn.argv.push_back("--gpus-per-worker");
      w.spawn.argv.push_back(absl::StrCat(owned));
    }
    // The host's memory is split among the workers started on it (each takes its share by default).
    w.spawn.argv.push_back(absl::StrCat("--host-workers=", n));
    for (const std::string& a : options.extra_args) w.spawn.argv.push_back(a);
    if (gpu) w.spawn.env.emplace_back("CUDA_VISIBLE_DEVICES", options.gpus[i]);
    for (const auto& kv : options.env) w.spawn.env.push_back(kv);
    w.spawn.env.emplace_back("TALLY_SPAWNED_BY", absl::StrCat(getpid()));  // It ends with this process.
    w.spawn.cpu_affinity = mine;
    if (gpu) {
      const std::set<int> mine_set(mine.begin(), mine.end());
      const bool local = !near[i].empty() && std::includes(near[i].begin(), near[i].end(), mine_set.begin(), mine_set.end());
      Log("worker ", i, " (GPU ", options.gpus[i], "): CPUs ", absl::StrJoin(mine, ","),
          near[i].empty() ? " (its GPU's NUMA node unknown)" : local ? " (on its GPU's NUMA node)" : " (not only its GPU's node)");
    }
    if (!options.log_dir.empty()) {
      w.log_path = absl::StrCat(options.log_dir, "/worker-", i, ".log");
      w.spawn.log_path = w.log_path;
    }
    ASSIGN_OR_RETURN(w.process, Subprocess::Spawn(w.spawn));
    launcher->workers_.push_back(std::move(w));
  }
  return launcher;
}

WorkerLauncher::~WorkerLauncher() { StopAll(); }

int WorkerLauncher::Poll(std::vector<std::string>* exited) {
  int alive = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (w.process && w.process->Running()) {
      ++alive;
      continue;
    }
    if (!w.process || w.reported) continue;
    w.reported = true;
    std::string line = absl::StrCat("worker ", i, " (pid ", w.process->pid(), ") ", w.process->ExitDescription());
    if (!w.log_path.empty()) absl::StrAppend(&line, "; end of ", w.log_path, ":\n", TailOfFile(w.log_path, 1500));
    if (exited) exited->push_back(line);
    Log(line);
    if (ShouldRestart(w)) {
      auto p = Subprocess::Spawn(w.spawn);
      if (p.ok()) {
        Log("restarted worker ", i, " as pid ", (*p)->pid());
        w.process = std::move(*p);
        w.reported = false;
        ++alive;
      }
    }
  }
  return alive;
}

bool WorkerLauncher::ShouldRestart(Worker& w) const {
  constexpr int kExitUsage = 2, kExitOutOfService = 3, kExitRestart = 75, kExitRefused = 77;  // worker/worker.h
  const int code = w.process->exit_code();
  // Killed by a signal (128 + N): a crash on a row (SIGSEGV, SIGABRT, ...) or the kernel's OOM kill.
  // The coordinator gives its rows to others and tries the suspect ones alone; the worker comes back.
  const bool signaled = code > 128 && code != 128 + SIGTERM && code != 128 + SIGINT;
  const bool wanted = code == kExitRestart || signaled ||
                      (options_.restart && code != kExitUsage && code != kExitOutOfService && code != kExitRefused);
  if (!wanted) return false;
  const double now = NowUnix();
  w.restarts.erase(std::remove_if(w.restarts.begin(), w.restarts.end(), [&](double t) { return now - t > 60; }),
                   w.restarts.end());
  if (w.restarts.size() >= 5) {
    Log("worker (pid ", w.process->pid(), ") restarted ", w.restarts.size(), " times within a minute; leaving it down");
    return false;
  }
  w.restarts.push_back(now);
  return true;
}

void WorkerLauncher::SignalAll() {
  for (Worker& w : workers_) {
    if (w.process) w.process->Signal(SIGTERM);
  }
}

void WorkerLauncher::StopAll(double grace_seconds) {
  SignalAll();  // All at once: each then exits while the others are waited for.
  for (Worker& w : workers_) {
    if (w.process) w.process->Terminate(grace_seconds);
  }
}

int WorkerLauncher::Running() {
  int n = 0;
  for (Worker& w : workers_) n += w.process && w.process->Running() ? 1 : 0;
  return n;
}

}  // namespace tally
