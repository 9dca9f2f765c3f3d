// Internal to the Python backend: starting the stub process (`python -u -m tally.stub`), and the
// spare one a long-lived worker starts for its next job (python/tally/spare.py): a stub that
// imports, before its job is known, the installed modules the last model process of the same
// interpreter imported, and is handed to the next channel whose stub would get the same
// interpreter and environment.
#ifndef TALLY_WORKER_PYTHON_STUB_PROCESS_H_
#define TALLY_WORKER_PYTHON_STUB_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {
namespace python_internal {

class OutputTail;  // worker/python/python_channel.h

// A started stub: its pid (a child of this process), this end of its socket, and its output
// (forwarded line by line into this worker's log).
struct StubProcess {
  pid_t pid = -1;
  int sock = -1;
  std::shared_ptr<OutputTail> output;
  bool reaped = false;  // It exited and was waited for (its pid may be another process's now).
};

// The stub's environment: this process's, with Tally's package first on PYTHONPATH and the
// socket's descriptor named; with `inductor_cache`, torch.compile's caches there (every worker of
// the host shares them: the second worker and the second job start warm); with `bytecode_cache`, the
// folder where the stub keeps bytecode that its packages lack (python/tally/bytecode.py); with
// `preload_dir`, where it keeps the list of installed modules it imported (python/tally/spare.py).
std::vector<std::string> StubEnvironment(const std::string& package_dir, const std::string& inductor_cache,
                                         const std::string& bytecode_cache, const std::string& preload_dir);

// posix_spawnp of `python -u -m tally.stub` with `env`: stdin /dev/null, stdout and stderr into the
// worker's log, the socket as fd 3; its own process group, an empty signal mask and default
// dispositions. NOT_FOUND when the interpreter cannot be started.
absl::StatusOr<StubProcess> StartStubProcess(const std::string& python, const std::vector<std::string>& env);

// The spare stub when it was started with this interpreter and environment and is still running
// (it is then no longer the spare); else none, and a spare of another kind is stopped (its memory
// first: the next model may need it).
std::optional<StubProcess> TakeSpareStub(const std::string& python, const std::vector<std::string>& env);
// Starts the spare stub for this interpreter and environment unless it runs already (one spare per
// worker: a spare of another kind is stopped). A failed start is logged and leaves none.
void PrepareSpareStub(const std::string& python, const std::vector<std::string>& env);

}  // namespace python_internal
}  // namespace tally

#endif  // TALLY_WORKER_PYTHON_STUB_PROCESS_H_
