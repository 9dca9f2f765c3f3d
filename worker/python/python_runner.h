// The Python model backend: a ModelRunner whose model is a user's Python class, run in a stub
// process beside the worker (as Triton's Python backend runs model.py in a stub beside its server).
//
//   worker (this runner)                          stub (python/tally/stub.py, the user's interpreter)
//   AllocateHost -> memfd buffers  --SCM_RIGHTS-> mapped once per buffer
//   Launch -> predict request (offsets, rows) ---> model.predict(images, rows) on views of the buffer
//   Wait   <- result (kind, channels, errors) <--- outputs written to a memfd output buffer
//   confusion counts, thresholds (C++)
//
// Control messages are JSON forms of the StubRequest/StubResponse protos (proto/tally.proto), each
// framed by a 4-byte little-endian length, over a Unix socket pair; pixels never cross the socket.
// Requests are answered in order; a reader thread hands each response to its PendingBatch, so
// several batches can be in flight while the next ones are decoded and staged.
//
// Failures: predict raising -> ABORTED naming the exception (the pipeline splits the batch down to
// the guilty rows); an out-of-memory exception -> RESOURCE_EXHAUSTED; the stub dying -> the runner
// restarts it (re-running __init__) and the batch gets ABORTED "model process died (signal N)",
// except that a single image is retried once first, so a row fails only after killing the stub
// twice. __init__ raising or the class missing -> Create fails with INVALID_ARGUMENT quoting the
// traceback's tail. The stub's stdout and stderr go to the worker's log, prefixed "[model]"; it
// exits when the worker does (it watches its parent) and is killed when the runner is destroyed.
//
// Thread-compatible like every ModelRunner: one thread launches; Wait() may run on another.
#ifndef TALLY_WORKER_PYTHON_PYTHON_RUNNER_H_
#define TALLY_WORKER_PYTHON_PYTHON_RUNNER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/interfaces/model_runner.h"

namespace tally {

// `options.model_path` is the .py file, `options.class_name` the class; `options.devices` what the
// model is given. Errors: NOT_FOUND when the file, the interpreter or Tally's Python package is
// missing on this host; INVALID_ARGUMENT when the class is missing or its __init__ raised.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreatePythonRunner(const ModelRunnerOptions& options);

}  // namespace tally

#endif  // TALLY_WORKER_PYTHON_PYTHON_RUNNER_H_
