// Two folders paired into a manifest (common/sources/folder_pairs.h).
#include "common/sources/folder_pairs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/security/data_roots.h"
#include "common/sources/csv.h"
#include "base/text.h"

namespace tally {
namespace {

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
  int64_t other = 0;               // Regular files of other types,
  std::vector<std::string> other_names;  // the first of them.
  // Image or mask files whose path no manifest or report can hold, with why (UncarriableNameReason).
  std::vector<std::pair<std::string, std::string>> odd;
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
      if (out->other++ < 10) out->other_names.push_back(Printable(rel));
      continue;
    }
    if (std::string why = UncarriableNameReason(rel); !why.empty()) {
      out->odd.emplace_back(rel, std::move(why));
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
  std::sort(out.odd.begin(), out.odd.end());
  return out;
}


absl::StatusOr<std::vector<std::string>> FilesEndingIn(const std::string& dir, const std::string& ending,
                                                       const char* what, std::vector<std::string>* odd) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " folder '", dir, "'"));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || !absl::EndsWith(name, ending)) continue;
    struct stat st;
    if (stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (std::string why = UncarriableNameReason(name); !why.empty()) {
      odd->push_back(absl::StrCat(what, " '", Printable(name), "' (", why, ")"));
      continue;
    }
    names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// The suffix most of `mask_stems` carry that, taken off, gives an image's stem ("_mask" for
// a/001_mask beside the image a/001): candidates are what follows the last '_', '-' or '.' of a
// base name; "" when none pairs at least half of them.
std::string GuessMaskSuffix(const std::map<std::string, std::string>& image_by_stem,
                            const std::vector<std::string>& mask_stems) {
  std::map<std::string, int64_t> pairs_by_suffix;
  for (const std::string& stem : mask_stems) {
    const size_t base = stem.rfind('/') == std::string::npos ? 0 : stem.rfind('/') + 1;
    const size_t cut = stem.find_last_of("_-.");
    if (cut == std::string::npos || cut <= base) continue;
    if (image_by_stem.count(stem.substr(0, cut))) ++pairs_by_suffix[stem.substr(cut)];
  }
  std::string best;
  int64_t most = 0;
  for (const auto& [suffix, n] : pairs_by_suffix) {
    if (n > most) best = suffix, most = n;
  }
  return 2 * most >= static_cast<int64_t>(mask_stems.size()) && most > 0 ? best : "";
}

// "masks look like NAME_mask.png: add --mask-suffix _mask" (or "use", where another was given).
std::string SuffixHint(const std::string& guess, const std::string& given) {
  return absl::StrCat("the masks look like NAME", guess, ".png: ", given.empty() ? "add" : "use", " --mask-suffix ",
                      guess);
}

// A --mask-suffix no mask carries is a mistake, not a folder of unpaired images: refused, with the
// suffix the masks do carry where one pairs most of them.
absl::Status CheckSomeMaskCarries(const std::string& suffix, const std::string& masks_dir,
                                  const std::vector<std::string>& mask_files, const std::vector<std::string>& mask_stems,
                                  const std::map<std::string, std::string>& image_by_stem) {
  if (suffix.empty() || mask_files.empty() ||
      std::any_of(mask_stems.begin(), mask_stems.end(),
                  [&](const std::string& stem) { return absl::EndsWith(stem, suffix); })) {
    return absl::OkStatus();
  }
  const std::string guess = GuessMaskSuffix(image_by_stem, mask_stems);
  return absl::InvalidArgumentError(absl::StrCat(
      "no mask in '", masks_dir, "' ends in '", suffix, "' before its extension (--mask-suffix)",
      guess.empty() ? absl::StrCat("; the masks are named like '", mask_files.front(), "'")
                    : absl::StrCat("; ", SuffixHint(guess, suffix))));
}

// "N file(s) in the folders are not images or masks ...", naming the first 10.
std::string NotImagesWarning(const FolderFiles& images, const FolderFiles& masks, const std::string& images_dir,
                             const std::string& masks_dir) {
  std::vector<std::string> named;
  for (const std::string& f : images.other_names) named.push_back(images_dir + "/" + f);
  for (const std::string& f : masks.other_names) named.push_back(masks_dir + "/" + f);
  const int64_t unnamed = images.other + masks.other - static_cast<int64_t>(named.size());
  return absl::StrCat(images.other + masks.other, " file(s) in the folders are not images or ",
                      "masks (by extension: png, jpg, jpeg, tif, tiff, webp, dcm, nii, nii.gz) ",
                      "and were not looked at: ", ListNames(named, 10),
                      unnamed > 0 ? absl::StrCat(" and ", unnamed, " more") : "");
}

}  // namespace

absl::StatusOr<PairedFolders> PairImagesAndMasks(const std::string& images_dir, const std::string& masks_dir,
                                                 const std::string& suffix, size_t max_files) {
  ASSIGN_OR_RETURN(FolderFiles images, ListFolder("--images", images_dir, max_files));
  ASSIGN_OR_RETURN(FolderFiles masks, ListFolder("--masks", masks_dir, max_files));
  // Stem -> file, first by name where two share one (the others are listed as unpaired).
  std::map<std::string, std::string> image_by_stem, mask_by_stem;
  std::vector<std::string> unpaired_images, unpaired_masks;
  for (const std::string& f : images.files) {
    if (!image_by_stem.emplace(Stem(f), f).second) unpaired_images.push_back(f + " (another image has its name)");
  }
  std::vector<std::string> all_mask_stems;
  for (const std::string& f : masks.files) all_mask_stems.push_back(Stem(f));
  RETURN_IF_ERROR(CheckSomeMaskCarries(suffix, masks_dir, masks.files, all_mask_stems, image_by_stem));
  std::vector<std::string> unpaired_stems;  // Of masks, as they are: what a suffix might explain.
  for (const std::string& f : masks.files) {
    std::string stem = Stem(f);
    if (!absl::EndsWith(stem, suffix)) {
      unpaired_masks.push_back(absl::StrCat(f, " (no '", suffix, "' before its extension)"));
      unpaired_stems.push_back(stem);
      continue;
    }
    stem.resize(stem.size() - suffix.size());
    if (!mask_by_stem.emplace(stem, f).second) unpaired_masks.push_back(f + " (another mask has its name)");
  }
  PairedFolders out;
  out.manifest = "id,image,mask\n";
  for (const auto& [stem, image] : image_by_stem) {
    auto m = mask_by_stem.find(stem);
    if (m == mask_by_stem.end()) {
      unpaired_images.push_back(image);
      continue;
    }
    absl::StrAppend(&out.manifest, CsvField(stem), ",", CsvField(images_dir + "/" + image), ",",
                    CsvField(masks_dir + "/" + m->second), "\n");
    out.pairs++;
  }
  for (const auto& [stem, mask] : mask_by_stem) {
    if (image_by_stem.find(stem) == image_by_stem.end()) {
      unpaired_masks.push_back(mask);
      unpaired_stems.push_back(Stem(mask));
    }
  }
  out.images = static_cast<int64_t>(images.files.size() + images.odd.size());
  if (out.pairs < out.images) out.suggested_suffix = GuessMaskSuffix(image_by_stem, unpaired_stems);
  if (out.suggested_suffix == suffix) out.suggested_suffix.clear();
  for (const auto& [image, why] : images.odd) {
    ManifestRow row;
    row.id = Printable(Stem(image));
    row.image = Printable(images_dir + "/" + image);
    row.error = absl::StrCat("image file '", row.image, "' in --images cannot be evaluated: its name cannot be ",
                             "written into a manifest or a report, as ", why, "; rename it");
    out.failed.push_back(std::move(row));
  }
  for (const auto& [mask, why] : masks.odd) {
    unpaired_masks.push_back(absl::StrCat(Printable(mask), " (its name cannot be written into a manifest: ", why, ")"));
  }
  const std::string hint = out.suggested_suffix.empty() ? "" : "; " + SuffixHint(out.suggested_suffix, suffix);
  if (out.pairs == 0 && out.failed.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no image in '", images_dir, "' has a mask in '", masks_dir, "' (pairs by the path without its ",
        "extension", suffix.empty() ? "" : absl::StrCat(", masks ending in '", suffix, "'"), "; ", images.files.size(),
        " images, ", masks.files.size(), " masks)", hint));
  }
  std::sort(unpaired_images.begin(), unpaired_images.end());
  std::sort(unpaired_masks.begin(), unpaired_masks.end());
  if (!unpaired_images.empty()) {
    out.warnings.push_back(absl::StrCat(unpaired_images.size(), " image(s) in '", images_dir, "' have no mask in '",
                                        masks_dir, "' and are not evaluated: ", ListNames(unpaired_images, 10), hint));
  }
  if (!unpaired_masks.empty()) {
    out.warnings.push_back(absl::StrCat(unpaired_masks.size(), " mask(s) in '", masks_dir, "' have no image in '",
                                        images_dir, "' and are not evaluated: ", ListNames(unpaired_masks, 10)));
  }
  if (images.other + masks.other > 0) out.warnings.push_back(NotImagesWarning(images, masks, images_dir, masks_dir));
  return out;
}

absl::StatusOr<FolderPairs> ListPairs(const std::string& predictions, const std::string& references,
                                      const std::string& file_ending) {
  if (file_ending.empty()) return absl::InvalidArgumentError("--file-ending must not be empty");
  FolderPairs p;
  absl::StatusOr<std::vector<std::string>> preds = FilesEndingIn(predictions, file_ending, "prediction", &p.odd);
  if (!preds.ok()) return preds.status();
  absl::StatusOr<std::vector<std::string>> refs = FilesEndingIn(references, file_ending, "reference", &p.odd);
  if (!refs.ok()) return refs.status();
  std::sort(p.odd.begin(), p.odd.end());
  std::set_intersection(refs->begin(), refs->end(), preds->begin(), preds->end(), std::back_inserter(p.names));
  std::set_difference(refs->begin(), refs->end(), preds->begin(), preds->end(), std::back_inserter(p.only_references));
  std::set_difference(preds->begin(), preds->end(), refs->begin(), refs->end(),
                      std::back_inserter(p.only_predictions));
  return p;
}

absl::StatusOr<std::string> PairFolders(const std::string& predictions, const std::string& references,
                                        const std::string& file_ending, const std::string& state_dir,
                                        std::vector<std::string>* warnings) {
  const std::string pred_dir = AbsolutePath(predictions), ref_dir = AbsolutePath(references);
  absl::StatusOr<FolderPairs> p = ListPairs(pred_dir, ref_dir, file_ending);
  if (!p.ok()) return p.status();
  if (!p->only_references.empty()) {  // A missing prediction is the model's failure: nnU-Net refuses too.
    return absl::FailedPreconditionError(absl::StrCat(
        p->only_references.size(), " reference(s) in '", ref_dir, "' have no prediction in '", pred_dir,
        "': ", ListNames(p->only_references, 20)));
  }
  if (!p->only_predictions.empty()) {
    warnings->push_back(absl::StrCat(p->only_predictions.size(), " prediction(s) in '", pred_dir,
                                     "' have no reference in '", ref_dir,
                                     "' and are not evaluated: ", ListNames(p->only_predictions, 20)));
  }
  if (!p->odd.empty()) {
    warnings->push_back(absl::StrCat(p->odd.size(), " file(s) are not evaluated because their names cannot be ",
                                     "written into a manifest or a report; rename them: ", ListNames(p->odd, 20)));
  }
  for (const std::string& w : *warnings) std::cerr << "tally: " << w << "\n";
  if (p->names.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no files ending in '", file_ending, "' in '", ref_dir,
                                                      "' (--file-ending)"));
  }
  std::string csv = "id,mask,prediction\n";
  for (const std::string& name : p->names) {
    const std::string id = name.substr(0, name.size() - file_ending.size());
    absl::StrAppend(&csv, CsvField(id), ",", CsvField(ref_dir + "/" + name), ",", CsvField(pred_dir + "/" + name),
                    "\n");
  }
  if (absl::Status s = MakeDirs(state_dir); !s.ok()) return s;
  const std::string path = state_dir + "/pairs.csv";
  if (absl::Status s = WriteFileAtomically(path, csv); !s.ok()) return s;
  std::cerr << "tally: " << p->names.size() << " prediction/reference pairs\n";
  return path;
}

}  // namespace tally
