// --prediction-store in the worker: a ModelRunner in front of the job's runner. Each batch's rows
// are looked up by (model, settings, input) digests; rows found are scored from their entries on the
// CPU, the others go to the model as a batch of their own (their labels come back to the host) and
// leave their entries once the batch is done. Everything else is the model's runner's.
#ifndef TALLY_WORKER_STORE_STORE_RUNNER_H_
#define TALLY_WORKER_STORE_STORE_RUNNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "worker/interfaces/model_runner.h"

namespace tally {

struct StoreRunnerOptions {
  std::string root;              // The store's folder.
  std::string model_digest;      // Hex (PredictionModelDigest).
  std::string settings_digest;   // Hex (PredictionSettingsDigest); the runner's layout is added per batch.
  // Python models: the manifest's other columns reach the model (prompts), so they are input too.
  bool columns_are_input = false;
  std::vector<std::string> columns;
};

// The model's digest: a TorchScript file's SHA-256 (`model_sha256`, the coordinator's); for a
// Python model, that and the class name, the interpreter, every .py file beside the model, the
// --model-option values and the bytes of every file (or folder's files) an option names.
absl::StatusOr<std::string> PredictionModelDigest(const JobConfig& config, const std::string& model_sha256);
// What can change a prediction's bits besides the model and the input: precision, input size,
// mean/std, the label map, the JPEG decoder, the device, and on GPUs the batch size (--compile jobs
// do not use the store).
// Not metrics, thresholds, the ignore index or anything else applied after the model.
std::string PredictionSettingsDigest(const JobConfig& config, ModelRunner& runner, int batch_size);

// A runner for one job over `inner` (not owned; it outlives this).
std::unique_ptr<ModelRunner> WrapWithStore(ModelRunner* inner, StoreRunnerOptions options);

}  // namespace tally

#endif  // TALLY_WORKER_STORE_STORE_RUNNER_H_
