// --prediction-store in the worker: a ModelRunner in front of the job's runner. Each batch's rows
// are looked up by (model, settings, input) digests (common/store/store_keys.h); rows found are
// scored from their entries on the CPU, the others go to the model as a batch of their own (their
// labels, and the scores of a single-score output, come back to the host) and leave their entries
// once the batch is done. Volumes (PredictVolume) are looked up and kept alike, one at a time.
// Everything else is the model's runner's. `tally rescore` jobs put NoModelRunner() behind it: rows not in the store
// fail, naming what the store lacks.
#ifndef TALLY_WORKER_STORE_STORE_RUNNER_H_
#define TALLY_WORKER_STORE_STORE_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "worker/interfaces/model_runner.h"

namespace tally {

struct StoreRunnerOptions {
  std::string root;          // The store's folder.
  std::string model_digest;  // Hex (PredictionModelDigest).
  // Jobs with a model: the settings text of a batch run in this layout, its JPEGs decoded on the GPU
  // or not (JobSettingsText + RunSettingsText).
  std::function<std::string(bool channels_last, bool nvjpeg)> settings_text;
  // Rescoring: the settings digests whose entries are taken, the first found first.
  std::vector<std::string> rescore_settings;
  // Python models: the manifest's other columns reach the model (prompts), so they are input too.
  bool columns_are_input = false;
  std::vector<std::string> columns;
  int64_t max_bytes = 0;  // --store-max-bytes (0: none).
  // --thresholds: rows found in the store are counted at each from their kept scores.
  std::vector<double> thresholds;
  // --metrics calibration: rows found are counted from their kept scores (a single-score model's);
  // entries with labels only are run by the model again (rescores: their rows fail, saying why).
  bool calibration = false;
  // Rows are looked up as soon as their image's bytes are read, and those found are not decoded
  // (ModelRunner::FindHeld): for jobs whose settings cannot change while they run (no layout or
  // decoder trial) and rescores.
  bool find_before_decoding = false;
  // ...from the moment the job's memory layout is agreed (SetChannelsLast: a layout trial's end).
  bool once_layout_agreed = false;
};

// The runner of a `tally rescore` job: no model; every row it is given fails with `reason`.
std::unique_ptr<ModelRunner> NoModelRunner(std::string reason);

// A runner for one job over `inner` (not owned; it outlives this).
std::unique_ptr<ModelRunner> WrapWithStore(ModelRunner* inner, StoreRunnerOptions options);

}  // namespace tally

#endif  // TALLY_WORKER_STORE_STORE_RUNNER_H_
