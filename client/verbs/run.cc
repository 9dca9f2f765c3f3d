// tally run: a whole evaluation on this machine (client/local_run.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/job_flags.h"
#include "common/job/job_config.h"
#include "common/sources/folder_pairs.h"
#include "common/sources/tar_listing.h"
#include "common/sources/tar_shards.h"
#include "client/local_run.h"
#include "client/verbs/verb_util.h"
#include "base/file_util.h"
#include "base/flag_util.h"

namespace tally {
namespace {

// --predictions/--references: nnU-Net's folders paired into a manifest under OUT/.tally; "" when
// neither is given. Returns 0 or the exit code of the error it reported.
int PairedManifest(const RunFlags& f, std::string* manifest, std::vector<std::string>* warnings) {
  if (f.predictions.empty() && f.references.empty()) return 0;
  if (f.predictions.empty() || f.references.empty()) return UsageError("run", "--predictions and --references go together");
  if (!f.job.manifest.empty() || !f.job.model.empty()) {
    return UsageError("run", "--predictions/--references replace --manifest and --model");
  }
  auto paired = PairFolders(f.predictions, f.references, f.file_ending, AbsolutePath(f.out) + "/.tally", warnings);
  if (!paired.ok()) return Finish(paired.status());
  *manifest = *paired;
  return 0;
}

// What can be known of the job's data before any process starts (docs/cli.md "Flags of tally run"):
// tar shards that --order random cannot read, folders whose masks pair with too few images. Returns
// 0, or the exit code of the error it reported: 2 for flags that cannot work together or a
// --mask-suffix no mask carries, 3 when fewer than half the images have a mask.
int CheckSourcesFirst(const v1::JobSpec& spec) {
  if (spec.shards_size() > 0 && spec.random_order()) {
    auto shards = ExpandShardPatterns({spec.shards().begin(), spec.shards().end()}, 100'000);
    if (!shards.ok()) return UsageError("run", std::string(shards.status().message()));
    for (const std::string& shard : *shards) {
      if (IsCompressedFile(shard)) {
        return UsageError("run", absl::StrCat("--order random reads samples scattered over the shards, and '", shard,
                                              "' is compressed (read front to back only): decompress the shards "
                                              "(.tar), or keep the shards' order"));
      }
    }
  }
  if (!spec.images_dir().empty() && !spec.masks_dir().empty()) {
    auto paired = PairImagesAndMasks(spec.images_dir(), spec.masks_dir(), spec.mask_suffix(), 50'000'000);
    if (!paired.ok()) return UsageError("run", std::string(paired.status().message()));
    if (2 * paired->pairs < paired->images) {
      for (const std::string& w : paired->warnings) std::cerr << "tally run: " << w << "\n";
      std::cerr << "tally run: only " << paired->pairs << " of " << paired->images
                << " images have a mask; nothing was started\n";
      return kExitTooManyFailedRows;
    }
  }
  return 0;
}

}  // namespace

int RunVerb(const RunFlags& given) {
  if (given.out.empty()) return UsageError("run", "--out is required");
  RunFlags f = given;
  if (!f.follow.empty()) {
    if (!f.job.model.empty() && !ParseModelRef(f.job.model).python) {
      return UsageError("run", "--follow DIR: each checkpoint in DIR is the model; drop --model (or give a Python "
                               "model class, which takes each checkpoint's path as its `checkpoint` option)");
    }
    if (f.follow_flags.until_step <= 0 && f.follow_flags.idle <= 0) {
      return UsageError("run", "--follow needs --until-step N or --idle S: when the run ends (tally follow has neither)");
    }
    if (f.job.model.empty()) f.job.model = AbsolutePath(f.follow) + "/checkpoint.pt";  // Each checkpoint's, set by tallyd.
  }
  std::string manifest;
  std::vector<std::string> warnings;
  if (const int rc = PairedManifest(f, &manifest, &warnings); rc != 0) return rc;
  auto spec = SpecFromFlags(f.job, manifest);
  if (!spec.ok()) return UsageError("run", std::string(spec.status().message()));
  for (const std::string& w : warnings) spec->add_client_warnings(w);
  if (const int rc = CheckSourcesFirst(*spec); rc != 0) return rc;
  LocalRunOptions options;
  options.spec = *spec;
  if (!f.follow.empty()) {
    FollowFlags ff = f.follow_flags;
    ff.job = given.job;  // As typed: without the placeholder model standing for each checkpoint.
    absl::StatusOr<v1::FollowSpec> follow = FollowSpecFromFlags(ff, f.follow);
    if (!follow.ok()) return UsageError("run", std::string(follow.status().message()));
    *follow->mutable_job() = *spec;
    options.follow = *std::move(follow);
  }
  options.out_dir = AbsolutePath(f.out);
  options.lease_seconds = f.local.lease_seconds;
  if (const int rc = SelectWorkerGpus("run", f.local, spec->model(), &options.gpus); rc != 0) return rc;
  if (options.gpus.empty()) {
    if (f.local.workers < 1) return UsageError("run", "--workers must be >= 1");
    options.cpu_workers = f.local.workers;
  }
  if (f.local.count_logit_ties) options.worker_args.push_back("--count_logit_ties");
  for (const std::string& flag : f.local.worker_flags) options.worker_args.push_back(flag);
  if (f.local.worker_threads > 0) options.worker_args.push_back(absl::StrCat("--threads=", f.local.worker_threads));
  if (!f.local.max_worker_memory.empty()) {
    if (f.local.max_worker_memory != "none") {
      if (absl::Status s = ParseByteSize("max-worker-memory", f.local.max_worker_memory).status(); !s.ok()) {
        return UsageError("run", std::string(s.message()));
      }
    }
    options.worker_args.push_back("--max-worker-memory=" + f.local.max_worker_memory);
  }
  return RunLocally(options);
}

}  // namespace tally
