// tally estimate: the model's trial passes run in a tally-worker (it has the model backends) on
// the first of the chosen GPUs (or the CPU); the worker prints the table or the JSON itself.
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_flags.h"
#include "client/verbs/verb_util.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "common/process/subprocess.h"

namespace tally {
namespace {

// tally-worker --estimate's command line for the spec in `spec_file`.
std::vector<std::string> EstimateArgv(const EstimateFlags& f, const std::string& worker, const std::string& spec_file,
                                      const std::vector<std::string>& gpu_groups) {
  const bool gpu = !gpu_groups.empty();
  const int workers = gpu ? static_cast<int>(gpu_groups.size()) : std::max(1, f.local.workers);
  std::vector<std::string> argv = {worker, "--estimate", spec_file, "--device", gpu ? "cuda:0" : "cpu",
                                   absl::StrCat("--gpus-per-worker=", gpu ? f.local.gpus_per_worker : 1),
                                   absl::StrCat("--estimate-workers=", workers),
                                   absl::StrCat("--estimate-max-batch=", f.max_batch)};
  if (f.local.worker_threads > 0) {
    argv.push_back(absl::StrCat("--threads=", f.local.worker_threads));
    argv.push_back(absl::StrCat("--estimate-decode-threads=", f.local.worker_threads * workers));
  }
  if (f.json) argv.push_back("--estimate-json");
  for (const std::string& flag : f.local.worker_flags) argv.push_back(flag);
  return argv;
}

}  // namespace

int EstimateVerb(const EstimateFlags& f) {
  auto spec = SpecFromFlags(f.job);
  if (!spec.ok()) return UsageError("estimate", std::string(spec.status().message()));
  if (spec->model().empty()) return UsageError("estimate", "tally estimate needs --model: it measures the model");
  if (f.max_batch < 0) return UsageError("estimate", "--max-batch must be >= 0");
  const std::string worker = FindExecutable("tally-worker");
  if (worker.empty()) return Finish(absl::NotFoundError("tally-worker not found next to tally or on PATH"));
  std::vector<std::string> gpu_groups;
  if (const int rc = SelectWorkerGpus("estimate", f.local, spec->model(), &gpu_groups); rc != 0) return rc;
  char path[] = "/tmp/tally-estimate-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return Finish(absl::InternalError("cannot create a temporary file in /tmp"));
  close(fd);
  if (absl::Status s = WriteFileAtomically(path, spec->SerializeAsString()); !s.ok()) return Finish(s);
  SpawnOptions options;
  options.argv = EstimateArgv(f, worker, path, gpu_groups);
  if (!gpu_groups.empty()) options.env.emplace_back("CUDA_VISIBLE_DEVICES", gpu_groups.front());
  options.argv.push_back(absl::StrFormat("--estimate-spawned-unix=%.6f", NowUnix()));
  auto child = Subprocess::Spawn(options);
  if (!child.ok()) {
    unlink(path);
    return Finish(child.status());
  }
  while ((*child)->Running()) absl::SleepFor(absl::Milliseconds(20));
  unlink(path);
  return (*child)->exit_code() >= 0 ? (*child)->exit_code() : 1;
}

}  // namespace tally
