// tally rescore --from-store DIR [the run's flags]: a new report from the prediction store alone
// (docs/prediction-store.md "Rescoring"). No model runs: the model's file is read for its digest only,
// the settings are those of the run that made the entries (found by the `settings` file of each
// settings folder), and every row is scored from its entry on CPU workers; a row the store lacks
// fails, naming what is missing. Flags that would change a prediction must be the run's own: a
// difference is refused, naming the flag and both values.
#include <iostream>
#include <map>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "client/job_flags.h"
#include "client/local_run.h"
#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"
#include "common/store/store_keys.h"

namespace tally {
namespace {

// The lines of `stored` (the job's part) that differ from `wanted`, as "--flag: VALUE here, STORED in the store".
std::vector<std::string> Differences(const StoredSettings& stored, const std::string& wanted) {
  std::map<std::string, std::string> want;
  StoredSettings w;
  w.text = wanted;
  for (const auto& [k, v] : w.Lines()) want[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : stored.Lines()) {
    const std::string flag = SettingsFlag(k);
    if (flag.empty() || want[k] == v) continue;
    out.push_back(absl::StrCat(flag, " '", want[k], "' here, '", v, "' in the stored run"));
  }
  return out;
}

// The text of a run's settings lines, for messages: "settings 1a2b... (device cuda NVIDIA H200, batch 32, ...)".
std::string Describe(const StoredSettings& s) {
  std::vector<std::string> run;
  for (const auto& [k, v] : s.Lines()) {
    if (SettingsFlag(k).empty()) run.push_back(absl::StrCat(k, " ", v));
  }
  return absl::StrCat("settings ", s.settings.substr(0, 16), " (", absl::StrJoin(run, ", "), ")");
}

// The settings digests to take entries from: those of one stored run whose job settings are the
// rescore's own. Errors say what the store has instead.
absl::StatusOr<std::vector<std::string>> ChooseSettings(const std::string& root, const std::string& model,
                                                        const std::string& wanted, const std::string& prefix) {
  const std::vector<StoredSettings> all = ListStoredSettings(root, model);
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat("the prediction store ", root, " has no predictions of this model (digest ",
                                            model.substr(0, 16), "): it was run with other bytes, options or files, "
                                            "or not with --prediction-store ", root));
  }
  std::map<std::string, std::vector<const StoredSettings*>> runs;  // RunKey -> its folders.
  std::vector<std::string> refused;
  for (const StoredSettings& s : all) {
    const std::vector<std::string> diff = Differences(s, wanted);
    if (!diff.empty()) {
      refused.push_back(absl::StrCat(Describe(s), ": ", absl::StrJoin(diff, "; ")));
    } else if (absl::StartsWith(s.settings, prefix)) {
      runs[s.RunKey()].push_back(&s);
    }
  }
  if (runs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the store's predictions of this model were made with other settings, which rescoring cannot change "
        "(give the run's own flags",
        prefix.empty() ? "" : absl::StrCat(", or another --store-settings than '", prefix, "'"), "): ",
        absl::StrJoin(refused, " | ")));
  }
  if (runs.size() > 1) {
    std::vector<std::string> listed;
    for (const auto& [key, folders] : runs) listed.push_back(Describe(*folders.front()));
    return absl::FailedPreconditionError(absl::StrCat(
        "the store holds this model's predictions from ", runs.size(), " runs whose last bits may differ; choose one "
        "with --store-settings PREFIX: ", absl::StrJoin(listed, " | ")));
  }
  std::vector<std::string> out;
  for (const StoredSettings* s : runs.begin()->second) out.push_back(s->settings);
  return out;
}

// What rescoring cannot do: flags naming work a model's run would do, and outputs the store does not keep.
absl::Status RefuseFlags(const RescoreFlags& f, const v1::JobSpec& spec, const JobConfig& config) {
  if (!f.job.prediction_store.empty()) {
    return absl::InvalidArgumentError("--prediction-store: tally rescore reads the store named by --from-store");
  }
  for (const auto& [name, flag] : {std::pair<const char*, const char*>{"channels_last", "--channels-last"},
                                   {"decode", "--decode"},
                                   {"compile", "--compile"}}) {
    const absl::CommandLineFlag* given = absl::FindCommandLineFlag(name);
    if (given != nullptr && given->CurrentValue() != given->DefaultValue()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " changes how a model runs, and tally rescore runs none: it takes the stored run's choice "
                "(--store-settings picks a run)"));
    }
  }
  if (spec.model().empty()) {
    return absl::InvalidArgumentError("--model is required: it names the model whose stored predictions are scored "
                                      "(its file is read for its digest, not loaded)");
  }
  if (!config.thresholds.empty() || config.instance_job() || !spec.coco_panoptic().empty()) {
    return absl::InvalidArgumentError(
        "the prediction store keeps label maps: score outputs (--thresholds), instances (--coco) and panoptic "
        "segments are not kept, so they cannot be rescored");
  }
  if (config.volume_job()) {
    return absl::InvalidArgumentError("volumes are not kept in the prediction store yet, so they cannot be rescored");
  }
  return absl::OkStatus();
}

}  // namespace

int RescoreVerb(const RescoreFlags& f) {
  if (f.out.empty()) return UsageError("rescore", "--out is required");
  if (f.from_store.empty()) return UsageError("rescore", "--from-store DIR names the prediction store to score from");
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags(f.job, "");
  if (!spec.ok()) return UsageError("rescore", std::string(spec.status().message()));
  const std::string root = AbsolutePath(f.from_store);
  spec->set_prediction_store(root);
  absl::StatusOr<JobConfig> config = JobConfigFromSpec(*spec);
  if (!config.ok()) return UsageError("rescore", std::string(config.status().message()));
  if (absl::Status s = RefuseFlags(f, *spec, *config); !s.ok()) return UsageError("rescore", std::string(s.message()));
  absl::StatusOr<std::string> model = PredictionModelDigest(*config, "");
  if (!model.ok()) return Finish(model.status());
  absl::StatusOr<std::vector<std::string>> settings =
      ChooseSettings(root, *model, JobSettingsText(*config), f.store_settings);
  if (!settings.ok()) {
    std::cerr << "tally rescore: " << settings.status().message() << "\n";
    return kExitUsage;
  }
  spec->set_rescore(true);
  spec->set_store_model(*model);
  for (const std::string& s : *settings) spec->add_store_settings(s);
  LocalRunOptions options;
  options.spec = *spec;
  options.out_dir = AbsolutePath(f.out);
  options.lease_seconds = f.local.lease_seconds;
  if (f.local.workers < 1) return UsageError("rescore", "--workers must be >= 1");
  options.cpu_workers = f.local.workers;
  for (const std::string& flag : f.local.worker_flags) options.worker_args.push_back(flag);
  if (f.local.worker_threads > 0) options.worker_args.push_back(absl::StrCat("--threads=", f.local.worker_threads));
  if (!f.local.max_worker_memory.empty()) options.worker_args.push_back("--max-worker-memory=" + f.local.max_worker_memory);
  return RunLocally(options);
}

}  // namespace tally
