// tally rescore --from-store DIR [the run's flags]: a new report from the prediction store alone
// (docs/prediction-store.md "Rescoring"). No model runs: the model's file is read for its digest only,
// the settings are those of the run that made the entries (found by the `settings` file of each
// settings folder), and every row is scored from its entry on CPU workers; a row the store lacks
// fails, naming what is missing. Flags that would change a prediction must be the run's own: a
// difference is refused, naming the flag and both values.
#include <algorithm>
#include <iostream>
#include <map>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "client/job_flags.h"
#include "client/local_run.h"
#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"
#include "common/store/store_keys.h"

namespace tally {
namespace {

// The flagged lines of `stored` (the job's part) and of `wanted` that differ, either way, as
// "--flag 'VALUE' here, 'STORED' in the stored run".
std::vector<std::string> Differences(const StoredSettings& stored, const std::string& wanted) {
  std::map<std::string, std::string> want, have;
  StoredSettings w;
  w.text = wanted;
  for (const auto& [k, v] : w.Lines()) want[k] = v;
  for (const auto& [k, v] : stored.Lines()) have[k] = v;
  std::map<std::string, std::string> keys = want;
  keys.insert(have.begin(), have.end());
  std::vector<std::string> out;
  for (const auto& [k, unused] : keys) {
    const std::string flag = SettingsFlag(k);
    if (flag.empty() || want[k] == have[k]) continue;
    out.push_back(absl::StrCat(flag, " '", want[k], "' here, '", have[k], "' in the stored run"));
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
                                                        const JobConfig& config, const std::string& prefix) {
  const std::vector<StoredSettings> all = ListStoredSettings(root, model);
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat("the prediction store ", root, " has no predictions of this model (digest ",
                                            model.substr(0, 16), "): it was run with other bytes, options or files, "
                                            "or not with --prediction-store ", root));
  }
  std::map<std::string, std::vector<const StoredSettings*>> runs;  // RunKey -> its folders.
  std::vector<std::string> refused;
  for (const StoredSettings& s : all) {
    // Whether the rows are volumes, tallyd finds out from the manifest: a stored volume run's
    // settings are compared with the rescore's as a volume job's.
    JobConfig as_stored = config;
    as_stored.volume_inputs = false;
    for (const auto& [k, v] : s.Lines()) as_stored.volume_inputs |= k == "volume";
    const std::vector<std::string> diff = Differences(s, JobSettingsText(as_stored));
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
  if (config.instance_job() || !spec.coco_panoptic().empty()) {
    return absl::InvalidArgumentError(
        "the prediction store keeps label maps and single scores: instances (--coco) and panoptic segments are not "
        "kept, so they cannot be rescored");
  }
  return absl::OkStatus();
}

// `tally rescore JOB`: the job's model, data, prediction settings and store, as if given as flags
// (flags given on the command line win: those that would change a prediction are then refused).
absl::StatusOr<RescoreFlags> FromJob(const RescoreFlags& given) {
  ASSIGN_OR_RETURN(std::unique_ptr<TallyClient> client, Connect(given.connection));
  ASSIGN_OR_RETURN(const std::string id, ResolveJobId(*client, given.positional[0]));
  ASSIGN_OR_RETURN(const v1::Job job, client->Get(id));
  const v1::JobSpec& spec = job.spec();
  if (spec.prediction_store().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " kept no predictions (no --prediction-store)"));
  }
  RescoreFlags f = given;
  JobFlags& j = f.job;
  if (f.from_store.empty()) f.from_store = spec.prediction_store();
  auto fill = [](std::string* flag, const std::string& value) {
    if (flag->empty()) *flag = value;
  };
  fill(&j.model, spec.model());
  fill(&j.manifest, spec.manifest());
  if (spec.shards_size() > 0) fill(&j.shards, spec.shards(0));
  fill(&j.coco_images, spec.images_dir());
  fill(&j.masks, spec.masks_dir());
  fill(&j.mask_suffix, spec.mask_suffix());
  fill(&j.python, spec.python());
  if (j.model_options.empty()) {
    for (const auto& [k, v] : spec.model_options()) j.model_options.push_back(absl::StrCat(k, "=", v));
    std::sort(j.model_options.begin(), j.model_options.end());
  }
  // Floats printed so that they parse back to the same float.
  auto floats = [](const google::protobuf::RepeatedField<float>& v) {
    std::vector<std::string> out;
    for (float x : v) out.push_back(absl::StrFormat("%.9g", x));
    return absl::StrJoin(out, ",");
  };
  fill(&j.mean, floats(spec.mean()));
  fill(&j.std, floats(spec.std()));
  if (spec.input_height() > 0) fill(&j.input_size, absl::StrCat(spec.input_height(), "x", spec.input_width()));
  std::vector<std::string> map;
  for (const auto& [from, to] : spec.label_map()) map.push_back(absl::StrCat(from, ":", to));
  std::sort(map.begin(), map.end());
  fill(&j.label_map, absl::StrJoin(map, ","));
  const auto defaulted = [](const char* name) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    return flag == nullptr || flag->CurrentValue() == flag->DefaultValue();
  };
  if (!spec.precision().empty() && defaulted("precision")) j.precision = spec.precision();
  if (spec.window_width() != 0) {
    fill(&j.window, absl::StrFormat("%.17g,%.17g", spec.window_center(), spec.window_width()));
  }
  // Volume jobs' settings.
  std::vector<std::string> window;
  for (int v : spec.sliding_window()) window.push_back(absl::StrCat(v));
  fill(&j.sliding_window, absl::StrJoin(window, ","));
  fill(&j.intensity, spec.intensity());
  if (spec.has_overlap() && defaulted("overlap")) j.overlap = spec.overlap();
  if (spec.sw_batch_size() > 0 && defaulted("sw_batch_size")) j.sw_batch_size = spec.sw_batch_size();
  if (defaulted("keep_dtype")) j.keep_dtype = spec.keep_dtype();
  return f;
}

}  // namespace

int RescoreVerb(const RescoreFlags& given) {
  if (given.positional.size() > 1) return UsageError("rescore", "tally rescore takes one job id");
  RescoreFlags f = given;
  if (!given.positional.empty()) {
    absl::StatusOr<RescoreFlags> from_job = FromJob(given);
    if (!from_job.ok()) return Finish(from_job.status());
    f = *std::move(from_job);
  }
  if (f.out.empty()) return UsageError("rescore", "--out is required");
  if (f.from_store.empty()) {
    return UsageError("rescore", "--from-store DIR names the prediction store to score from (or give a JOB that kept one)");
  }
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
      ChooseSettings(root, *model, *config, f.store_settings);
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
