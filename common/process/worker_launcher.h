// Starts and supervises `tally-worker` processes on this machine: one per selected GPU (each with
// CUDA_VISIBLE_DEVICES set to its GPU, so it sees it as cuda:0) or N CPU workers. Each worker gets
// its share of the CPU cores (pinned with sched_setaffinity, passed as --threads) and a log file.
// Used by `tally run` and `tallyd --spawn-workers`. Owned by one thread.
#ifndef TALLY_COMMON_PROCESS_WORKER_LAUNCHER_H_
#define TALLY_COMMON_PROCESS_WORKER_LAUNCHER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/process/subprocess.h"

namespace tally {

struct WorkerLaunchOptions {
  std::string worker_binary;             // Empty: tally-worker next to this program, else on PATH.
  std::string coordinator;               // host:port the workers dial.
  std::vector<std::string> gpus;         // CUDA_VISIBLE_DEVICES values; empty = CPU workers.
  int cpu_workers = 1;                   // Used when `gpus` is empty.
  std::string log_dir;                   // worker-<i>.log files go here.
  std::vector<std::string> extra_args;   // Passed to every worker.
  std::vector<std::pair<std::string, std::string>> env;  // Set for every worker (TALLY_TOKEN).
  // Service mode: restart a worker that exits, unless with code 2 (usage), 3 (out of service: its
  // device or files are broken here) or 77 (the coordinator refused its token). Without it, only a
  // worker killed by a signal (a crash on a row, the kernel's OOM kill; not SIGTERM or SIGINT) and
  // exit code 75 (the worker timed out in a decode or forward pass and asks to be restarted) are
  // restarted. Either way a worker restarted 5 times within a minute is left down.
  bool restart = false;
};

class WorkerLauncher {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerLauncher>> Start(WorkerLaunchOptions options);
  ~WorkerLauncher();  // Stops all workers.

  int size() const { return static_cast<int>(workers_.size()); }
  // Non-blocking check. Returns the number of workers still running; restarts exited ones when
  // `restart` is set. `exited` (optional) receives one line per worker that exited since the
  // last call, with its exit status and the tail of its log.
  int Poll(std::vector<std::string>* exited = nullptr);
  pid_t pid(int i) const { return workers_[i].process ? workers_[i].process->pid() : -1; }
  const std::string& log_path(int i) const { return workers_[i].log_path; }
  // SIGTERM to every worker without waiting (they finish the rows in hand and exit); StopAll then
  // waits for them.
  void SignalAll();
  // Waits up to `grace_seconds` for each, then SIGKILL.
  void StopAll(double grace_seconds = 5.0);
  // Workers running now; restarts none (a stopping tallyd's drain).
  int Running();

 private:
  struct Worker {
    SpawnOptions spawn;
    std::string log_path;
    std::unique_ptr<Subprocess> process;
    bool reported = false;
    std::vector<double> restarts;  // Times of recent restarts.
  };
  bool ShouldRestart(Worker& w) const;
  explicit WorkerLauncher(WorkerLaunchOptions options) : options_(std::move(options)) {}

  WorkerLaunchOptions options_;
  std::vector<Worker> workers_;
};

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_WORKER_LAUNCHER_H_
