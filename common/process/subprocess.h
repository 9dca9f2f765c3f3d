// Child processes for `tally run` and `tallyd --spawn-workers`: fork/exec with extra environment,
// output appended to a log file, and death of the child when the parent dies (PR_SET_PDEATHSIG).
// A Subprocess is owned by one thread; the destructor sends SIGTERM, then SIGKILL after a grace
// period, and reaps the child.
#ifndef TALLY_COMMON_PROCESS_SUBPROCESS_H_
#define TALLY_COMMON_PROCESS_SUBPROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the executable path.
  std::vector<std::pair<std::string, std::string>> env;  // Added to / replacing the parent's.
  std::string log_path;           // stdout and stderr appended here; empty = inherit.
  std::vector<int> cpu_affinity;  // CPUs the child may run on; empty = unchanged.
  // Unless set (or `env` names GLIBC_TUNABLES), the child's glibc malloc asks for transparent huge
  // pages (WithHugePageMalloc).
  bool keep_malloc_tunables = false;
};

// GLIBC_TUNABLES for a child of Tally's: `tunables` (the parent's, may be null) plus
// glibc.malloc.hugetlb=1 unless it sets glibc.malloc.hugetlb already (0 turns it off). With it,
// malloc marks its large areas for transparent huge pages (glibc >= 2.35; older glibc ignores it):
// tallyd and the workers fill hundreds of MB of fresh memory per job (a COCO results file, its
// parse, label maps), and on a VM each 4 KiB page's first-touch fault and TLB miss cost more than
// the work on it (the whole one-core COCO command 11-18% faster on the 2-core development VM; no
// difference measured on the H200 GPU box, BENCHMARKS.md).
std::string WithHugePageMalloc(const char* tunables);

class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& options);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Non-blocking: true while the child has not exited.
  bool Running();
  // Exit description once exited ("exit code 1", "killed by signal 9"), empty while running.
  std::string ExitDescription() const { return exit_description_; }
  int exit_code() const { return exit_code_; }
  void Signal(int sig);
  // Sends SIGTERM and waits up to `grace_seconds`, then SIGKILL. Blocks until reaped.
  void Terminate(double grace_seconds = 5.0);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  void Reaped(int status);

  pid_t pid_;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string exit_description_;
};

// Path of the running executable's folder (from /proc/self/exe).
std::string ExecutableDir();

// Folder holding Tally's Python package (`tally/stub.py`): $TALLY_PYTHON_DIR, else next to the
// executable (../python, ../share/tally/python), else the source tree this binary was built from.
std::string PythonPackageDir();

// Finds a sibling executable `name` next to this program, else on PATH. Empty if not found.
std::string FindExecutable(const std::string& name);

// Last `max_bytes` of a text file, for error messages that quote a child's log.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

// CPUs this process may run on (sched_getaffinity).
std::vector<int> AllowedCpus();

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_SUBPROCESS_H_
