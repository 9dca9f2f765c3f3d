// `tally estimate`: will this model fit, at what batch size, and how long will the manifest take?
// Runs in tally-worker (`--estimate SPEC`, started by the client with the GPU it picked), which has
// the model backends: samples rows of the manifest (spread over it, seeded), decodes them on one
// thread to time decoding, loads the model like a job would, then runs trial passes at batch
// sizes 1, 2, 4, ... on the largest sampled image size, measuring each one's peak device memory
// (the allocator's reserved peak, the quantity `--batch-size auto` budgets) and images/s (two
// batches in flight, as the pipeline keeps them), until one runs out of memory, passes the
// budget or reaches the largest batch asked for. The prediction for the whole manifest is the
// smaller of the workers' model rate and the host's decode rate.
#ifndef TALLY_WORKER_ESTIMATE_H_
#define TALLY_WORKER_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tally.pb.h"
#include "worker/worker.h"

namespace tally {

struct EstimateOptions {
  v1::JobSpec spec;               // As `tally submit` would send it (model, manifest, precision, ...).
  WorkerOptions worker;           // device, gpus_per_worker, threads, as the evaluation's workers.
  int workers = 1;                // Workers the evaluation will run (GPUs / GPUs per worker, or CPU workers).
  int decode_threads = 0;         // Threads decoding on the host in all; 0 = every core this process may use.
  int max_batch = 0;              // Largest batch tried; 0 = 512 on CUDA, 16 on CPU.
  double seconds_per_trial = 0.5; // Timed passes per batch size last at least this long (and 2 passes).
  int sample_rows = 32;
  bool json = false;
  double spawned_unix = 0;        // When the client started this process (wall clock); 0: unknown.
};

struct EstimateTrial {
  int batch_size = 0;
  int64_t peak_memory_bytes = 0;  // 0 on CPU.
  double images_per_second = 0;
  bool fits = false;              // Ran, under the memory budget.
  std::string error;              // "out of memory", or why the trials stopped here.
};

struct EstimateResult {
  std::string model;
  std::string manifest;
  std::string device;
  std::string gpu_name;
  int64_t memory_total_bytes = 0;
  int64_t memory_budget_bytes = 0;
  int64_t rows = 0;               // Data rows of the manifest.
  int64_t rows_with_errors = 0;   // Malformed rows (they fail without a model pass).
  int sampled_rows = 0;
  int decode_failures = 0;        // Sampled rows whose image or mask could not be read.
  std::vector<std::vector<int64_t>> sample_sizes;  // [height, width, count], most common first.
  int height = 0;                 // The trial size: the largest sampled image.
  int width = 0;
  double decode_seconds_per_row = 0;  // Image + mask, read and decoded on one thread.
  double load_seconds = 0;
  std::vector<EstimateTrial> trials;
  int batch_size = 0;             // The largest that fits (0: none).
  double images_per_second = 0;   // One worker at batch_size.
  double startup_seconds = 0;     // Process start, CUDA initialisation and model load.
  int prediction_batch_size = 0;  // The job's batch size (or the workers' default), capped at what fits.
  double prediction_images_per_worker = 0;
  int workers = 1;
  int decode_threads = 1;
  double predicted_images_per_second = 0;
  double predicted_seconds = 0;   // The whole manifest, start-up included.
  std::string limited_by;         // "model" or "decoding".
};

absl::StatusOr<EstimateResult> RunEstimate(const EstimateOptions& options);
std::string EstimateText(const EstimateResult& r);
std::string EstimateJson(const EstimateResult& r);

}  // namespace tally

#endif  // TALLY_WORKER_ESTIMATE_H_
