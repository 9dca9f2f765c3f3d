// What a prediction store entry is keyed on (docs/prediction-store.md "What an entry is keyed on"),
// computed alike by the worker that writes entries and by `tally rescore`, which reads them with no
// model: the model's digest, and the settings as text whose SHA-256 is the settings digest.
//
// The settings text is "key value" lines in two parts: what the job's flags set (precision, input
// size, mean, std, label map, compile, --window where given; for volume jobs a `volume on` line and the intensity
// preprocessing, sliding window, overlap, patches a pass, --keep-dtype) and what the run decided (decoder, device, batch size on
// GPUs, memory layout, whether the batch's JPEGs were decoded on the GPU). Each settings folder of a
// store holds a `settings` file: "tally-store-settings-v1", the model digest, then the text, so the
// store says what made its predictions and a reader without the GPU can find them.
#ifndef TALLY_COMMON_STORE_STORE_KEYS_H_
#define TALLY_COMMON_STORE_STORE_KEYS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/store/store_settings.h"

namespace tally {

// A TorchScript file: its SHA-256 (`model_sha256` when known, else the file's). A Python model: that
// and the class name, the interpreter, every .py file beside the model, the --model-option values
// and the bytes of every file (or folder's files) an option names.
absl::StatusOr<std::string> PredictionModelDigest(const JobConfig& config, const std::string& model_sha256);

// The settings the job's flags set, as text lines.
std::string JobSettingsText(const JobConfig& config);
// The settings the run decided, as text lines. `batch_size` counts only on GPUs.
std::string RunSettingsText(const JobConfig& config, bool cuda, const std::string& gpu_name, int batch_size,
                            bool channels_last, bool nvjpeg);

}  // namespace tally

#endif  // TALLY_COMMON_STORE_STORE_KEYS_H_
