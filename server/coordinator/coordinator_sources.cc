// Coordinator: rows from where labs keep data besides manifests (README "Where your data can be"):
// tar shards, indexed from their headers into rows whose paths are member locators
// (common/io/tar_shards.h), and two folders paired into a manifest kept in the state folder.

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/io/manifest.h"
#include "common/io/tar_shards.h"
#include "common/io/volume_io.h"
#include "common/job/job_config.h"
#include "common/security/data_roots.h"
#include "common/security/sha256.h"
#include "server/coordinator/coordinator.h"

namespace tally {
namespace {

// At most this many shards in one job.
constexpr size_t kMaxShards = 100'000;

std::vector<std::string> OrDefault(const google::protobuf::RepeatedPtrField<std::string>& given,
                                   std::vector<std::string> fallback) {
  if (given.empty()) return fallback;
  return std::vector<std::string>(given.begin(), given.end());
}

// Files a folder pairing looks at: images, masks and volumes by extension (others are counted).
bool PairableFile(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const char* e : {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".dcm", ".nii", ".nii.gz"}) {
    if (absl::EndsWith(lower, e)) return true;
  }
  return false;
}

// The path below the folder without its extension (both of .nii.gz).
std::string Stem(const std::string& relative) {
  std::string s = relative;
  if (absl::EndsWithIgnoreCase(s, ".nii.gz")) return s.substr(0, s.size() - 7);
  const size_t slash = s.rfind('/');
  const size_t dot = s.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) s.resize(dot);
  return s;
}

struct FolderFiles {
  std::vector<std::string> files;  // Relative to the folder, sorted.
  int64_t other = 0;               // Regular files of other types.
};

// Walks `root` (not following symbolic links to folders; hidden entries skipped).
absl::Status Walk(const std::string& root, const std::string& relative, int depth, size_t max_files, FolderFiles* out) {
  if (depth > 64) return absl::InvalidArgumentError(absl::StrCat("folder '", root, "' nests deeper than 64 levels"));
  const std::string dir = relative.empty() ? root : root + "/" + relative;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot read folder '", dir, "'"));
  std::vector<std::string> subdirs;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    const std::string rel = relative.empty() ? name : relative + "/" + name;
    struct stat lst, st;
    if (lstat((root + "/" + rel).c_str(), &lst) != 0) continue;
    if (S_ISDIR(lst.st_mode)) {
      subdirs.push_back(rel);
      continue;
    }
    if (stat((root + "/" + rel).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!PairableFile(name)) {
      out->other++;
      continue;
    }
    out->files.push_back(rel);
    if (out->files.size() > max_files) {
      closedir(d);
      return absl::InvalidArgumentError(absl::StrCat("folder '", root, "' holds more than ", max_files,
                                                     " files (tallyd --max-manifest-rows)"));
    }
  }
  closedir(d);
  std::sort(subdirs.begin(), subdirs.end());
  for (const std::string& sub : subdirs) RETURN_IF_ERROR(Walk(root, sub, depth + 1, max_files, out));
  return absl::OkStatus();
}

absl::StatusOr<FolderFiles> ListFolder(const std::string& what, const std::string& dir, size_t max_files) {
  absl::StatusOr<std::string> resolved = ProcessDataRoots().Resolve(dir);
  if (!resolved.ok()) return OutsideDataRootsError(what, dir);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(what, " '", dir, "' is not a folder"));
  }
  FolderFiles out;
  RETURN_IF_ERROR(Walk(dir, "", 0, max_files, &out));
  std::sort(out.files.begin(), out.files.end());
  return out;
}

}  // namespace

std::string Coordinator::FolderManifestPath(const std::string& job_id) const {
  return absl::StrCat(options_.state_dir, "/manifests/", job_id, ".csv");
}

absl::StatusOr<JobRecord> Coordinator::StoreFolders(const v1::JobSpec& spec, const std::string& job_id) {
  const size_t max_files = static_cast<size_t>(std::max<int64_t>(1, options_.max_manifest_rows));
  ASSIGN_OR_RETURN(FolderFiles images, ListFolder("--images", spec.images_dir(), max_files));
  ASSIGN_OR_RETURN(FolderFiles masks, ListFolder("--masks", spec.masks_dir(), max_files));
  // Stem -> file, first by name where two share one (the others are listed as unpaired).
  const std::string& suffix = spec.mask_suffix();
  std::map<std::string, std::string> image_by_stem, mask_by_stem;
  std::vector<std::string> unpaired_images, unpaired_masks;
  for (const std::string& f : images.files) {
    if (!image_by_stem.emplace(Stem(f), f).second) unpaired_images.push_back(f + " (another image has its name)");
  }
  for (const std::string& f : masks.files) {
    std::string stem = Stem(f);
    if (!absl::EndsWith(stem, suffix)) {
      unpaired_masks.push_back(absl::StrCat(f, " (no '", suffix, "' before its extension)"));
      continue;
    }
    stem.resize(stem.size() - suffix.size());
    if (!mask_by_stem.emplace(stem, f).second) unpaired_masks.push_back(f + " (another mask has its name)");
  }
  std::string text = "id,image,mask\n";
  int64_t pairs = 0;
  for (const auto& [stem, image] : image_by_stem) {
    auto m = mask_by_stem.find(stem);
    if (m == mask_by_stem.end()) {
      unpaired_images.push_back(image);
      continue;
    }
    absl::StrAppend(&text, CsvField(stem), ",", CsvField(spec.images_dir() + "/" + image), ",",
                    CsvField(spec.masks_dir() + "/" + m->second), "\n");
    pairs++;
  }
  for (const auto& [stem, mask] : mask_by_stem) {
    if (image_by_stem.find(stem) == image_by_stem.end()) unpaired_masks.push_back(mask);
  }
  if (pairs == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no image in '", spec.images_dir(), "' has a mask in '", spec.masks_dir(), "' (pairs by the path without its ",
        "extension", suffix.empty() ? "" : absl::StrCat(", masks ending in '", suffix, "'"), "; ", images.files.size(),
        " images, ", masks.files.size(), " masks)"));
  }
  // Kept with the job (README: the manifest a folder job was built from), then stored as one.
  const std::string path = FolderManifestPath(job_id);
  RETURN_IF_ERROR(MakeDirs(options_.state_dir + "/manifests"));
  RETURN_IF_ERROR(WriteFileAtomically(path, text));
  v1::JobSpec as_manifest = spec;
  as_manifest.set_manifest(path);
  absl::StatusOr<JobRecord> rec = StoreManifest(as_manifest, job_id, &text);
  if (!rec.ok()) {
    unlink(path.c_str());
    return rec.status();
  }
  v1::JobSpec* kept = rec->job.mutable_spec();
  std::sort(unpaired_images.begin(), unpaired_images.end());
  std::sort(unpaired_masks.begin(), unpaired_masks.end());
  if (!unpaired_images.empty()) {
    kept->add_manifest_warnings(absl::StrCat(unpaired_images.size(), " image(s) in '", spec.images_dir(),
                                             "' have no mask in '", spec.masks_dir(),
                                             "' and are not evaluated: ", ListNames(unpaired_images, 10)));
  }
  if (!unpaired_masks.empty()) {
    kept->add_manifest_warnings(absl::StrCat(unpaired_masks.size(), " mask(s) in '", spec.masks_dir(),
                                             "' have no image in '", spec.images_dir(),
                                             "' and are not evaluated: ", ListNames(unpaired_masks, 10)));
  }
  if (images.other + masks.other > 0) {
    kept->add_manifest_warnings(absl::StrCat(images.other + masks.other, " file(s) in the folders are not images or ",
                                             "masks (by extension: png, jpg, jpeg, tif, tiff, webp, dcm, nii, nii.gz) ",
                                             "and were not looked at"));
  }
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
  // Only Python models read a row's other columns (README "Python models").
  conventions.keep_columns = ParseModelRef(spec.model()).python;
  ASSIGN_OR_RETURN(std::unique_ptr<ShardIndex> index,
                   ShardIndex::Open(shards, conventions, options_.max_manifest_rows));
  RETURN_IF_ERROR(store_->BeginSubmission(job_id));
  DuplicateIds duplicates;
  std::optional<bool> volumes;
  auto stream = [&]() -> absl::Status {
    RETURN_IF_ERROR(StreamManifestRows(index.get(), job_id, !spec.random_order(), &duplicates, &volumes,
                                       SubmissionLimits().deadline));
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
  std::string duplicate_message;
  ASSIGN_OR_RETURN(int64_t duplicate_rows, NameDuplicates(job_id, &duplicates, &duplicate_message));
  if (duplicate_rows > 0) kept->set_duplicate_id_rows(duplicate_rows);
  Log("job ", job_id, ": ", index->rows_read(), " samples indexed from ", shards.size(), " shard(s)");
  return rec;
}

}  // namespace tally
