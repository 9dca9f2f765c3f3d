// Coordinator: rows from where labs keep data besides manifests (docs/data.md "Where your data can be"):
// tar shards, indexed from their headers into rows whose paths are member locators
// (common/sources/tar_shards.h), and two folders paired into a manifest kept in the state folder.

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/sources/folder_pairs.h"
#include "common/sources/manifest.h"
#include "common/sources/tar_shards.h"
#include "common/formats/volume.h"
#include "common/job/job_config.h"
#include "common/security/data_roots.h"
#include "common/security/sha256.h"
#include "server/coordinator/coordinator.h"
#include "base/text.h"

namespace tally {
namespace {

// At most this many shards in one job.
constexpr size_t kMaxShards = 100'000;

std::vector<std::string> OrDefault(const google::protobuf::RepeatedPtrField<std::string>& given,
                                   std::vector<std::string> fallback) {
  if (given.empty()) return fallback;
  return std::vector<std::string>(given.begin(), given.end());
}

}  // namespace

std::string Coordinator::FolderManifestPath(const std::string& job_id) const {
  return absl::StrCat(options_.state_dir, "/manifests/", job_id, ".csv");
}

absl::StatusOr<JobRecord> Coordinator::StoreFolders(const v1::JobSpec& spec, const std::string& job_id) {
  const size_t max_files = static_cast<size_t>(std::max<int64_t>(1, options_.max_manifest_rows));
  ASSIGN_OR_RETURN(PairedFolders paired,
                   PairImagesAndMasks(spec.images_dir(), spec.masks_dir(), spec.mask_suffix(), max_files));
  std::string& text = paired.manifest;
  // Kept with the job (the manifest a folder job was built from), then stored as one.
  const std::string path = FolderManifestPath(job_id);
  RETURN_IF_ERROR(MakeDirs(options_.state_dir + "/manifests"));
  RETURN_IF_ERROR(WriteFileAtomically(path, text));
  v1::JobSpec as_manifest = spec;
  as_manifest.set_manifest(path);
  absl::StatusOr<JobRecord> rec = StoreManifest(as_manifest, job_id, &text, &paired.failed);
  if (!rec.ok()) {
    unlink(path.c_str());
    return rec.status();
  }
  for (const std::string& w : paired.warnings) rec->job.mutable_spec()->add_manifest_warnings(w);
  return rec;
}

absl::StatusOr<JobRecord> Coordinator::StoreShards(const v1::JobSpec& spec, const std::string& job_id) {
  std::vector<std::string> patterns(spec.shards().begin(), spec.shards().end());
  // Each shard is opened through the data roots as it is indexed (ShardIndex).
  ASSIGN_OR_RETURN(std::vector<std::string> shards, ExpandShardPatterns(patterns, kMaxShards));
  SampleConventions conventions;
  conventions.image = OrDefault(spec.image_extensions(), conventions.image);
  conventions.mask = OrDefault(spec.mask_extensions(), conventions.mask);
  conventions.prediction = OrDefault(spec.prediction_extensions(), conventions.prediction);
  conventions.model = !spec.model().empty();
  // Only Python models read a row's other columns (docs/models.md "Python models").
  conventions.keep_columns = ParseModelRef(spec.model()).python || WantsColumns(spec);
  conventions.deadline = SubmissionLimits().deadline;
  ASSIGN_OR_RETURN(std::unique_ptr<ShardIndex> index,
                   ShardIndex::Open(shards, conventions, options_.max_manifest_rows));
  RETURN_IF_ERROR(store_->BeginSubmission(job_id));
  DuplicateIds duplicates;
  std::optional<bool> volumes;
  auto stream = [&]() -> absl::Status {
    RETURN_IF_ERROR(StreamManifestRows(index.get(), job_id, !spec.random_order(), &duplicates, &volumes,
                                       SubmissionLimits().deadline, "tar shards"));
    if (spec.random_order() &&
        std::find(index->tar_compressed().begin(), index->tar_compressed().end(), true) != index->tar_compressed().end()) {
      return absl::InvalidArgumentError(
          "--order random reads the samples scattered over the shards, and a compressed tar can only be read front to "
          "back: decompress the shards (.tar), or keep the shards' order");
    }
    return absl::OkStatus();
  };
  if (absl::Status s = stream(); !s.ok()) return DiscardSubmission(job_id, s);
  if (volumes.value_or(false)) {
    return DiscardSubmission(job_id, absl::InvalidArgumentError(
        "the shards' images are NIfTI volumes: shards hold 2D images (PNG, JPEG, TIFF, WebP, DICOM); give volumes in a "
        "manifest"));
  }
  JobRecord rec = QueuedRecord(spec, job_id, index->rows_read());
  v1::JobSpec* kept = rec.job.mutable_spec();
  kept->set_manifest(index->path());
  kept->set_manifest_sha256(index->IndexSha256());
  for (int64_t start : index->tar_starts()) kept->add_tar_starts(start);
  for (bool compressed : index->tar_compressed()) kept->add_tar_compressed(compressed);
  if (conventions.keep_columns) {
    for (const std::string& c : index->columns()) kept->add_manifest_columns(c);
  }
  for (const std::string& w : index->Warnings()) kept->add_manifest_warnings(w);
  for (const std::string& why : index->Incomplete()) kept->add_incomplete_sources(why);
  std::string duplicate_message;
  ASSIGN_OR_RETURN(int64_t duplicate_rows, NameDuplicates(job_id, &duplicates, &duplicate_message));
  if (duplicate_rows > 0) kept->set_duplicate_id_rows(duplicate_rows);
  Log("job ", job_id, ": ", index->rows_read(), " samples indexed from ", shards.size(), " shard(s)");
  return rec;
}

}  // namespace tally
