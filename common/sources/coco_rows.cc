// Rows from COCO files (common/sources/coco_rows.h).
#include "common/sources/coco_rows.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/coco/coco_instances.h"
#include "common/coco/coco_json.h"
#include "metrics/label_counts.h"
#include "metrics/parallel_for.h"

namespace tally {
namespace {

// "3 annotations name an image the file does not list (the first: annotation 17, image 999); they
// are not scored".
std::string UnlistedWarning(const char* what, int64_t count, int64_t first_id, int64_t first_image) {
  return absl::StrCat(count, " ", what, count == 1 ? " names" : "s name", " an image that '", "images", "' does not list (",
                      "the first: ", what, " ", first_id, ", image ", first_image, "); ", count == 1 ? "it is" : "they are",
                      " not scored");
}

void WarnUnlisted(const std::vector<CocoAnnotation>& anns, const std::set<int64_t>& images, const char* what,
                  v1::JobSpec* spec) {
  int64_t count = 0, first_id = 0, first_image = 0;
  for (const CocoAnnotation& a : anns) {
    if (images.count(a.image_id)) continue;
    if (count++ == 0) {
      first_id = a.id;
      first_image = a.image_id;
    }
  }
  if (count > 0) spec->add_manifest_warnings(UnlistedWarning(what, count, first_id, first_image));
}

// The results file's detections, parsed on every core and encoded per image as rows carry them
// (v1::CocoDetections, in the file's order); those for images the reference does not list are
// counted for the warning and dropped.
absl::Status ReadDetections(const std::string& path, const ClientFileLimits& limits, const std::set<int64_t>& image_ids,
                            std::string* sha256, v1::JobSpec* spec,
                            std::unordered_map<int64_t, std::string>* detections) {
  struct Part {
    std::unordered_map<int64_t, std::string> by_image;
    int64_t unlisted = 0, first_id = 0, first_image = 0;
  };
  const int threads = std::clamp(UsableCores(), 1, 32);
  std::vector<Part> parts(threads);
  ASSIGN_OR_RETURN(const int used, LoadCocoResultsInParts(path, limits, sha256, threads, [&](int k, CocoAnnotation&& a) {
    Part& p = parts[k];
    if (image_ids.count(a.image_id) == 0) {
      if (p.unlisted++ == 0) {
        p.first_id = a.id;
        p.first_image = a.image_id;
      }
      return;
    }
    AppendCocoDetection(a, &p.by_image[a.image_id]);
  }));
  int64_t unlisted = 0, first_id = 0, first_image = 0;
  for (int k = 0; k < used; ++k) {
    Part& p = parts[k];
    if (p.unlisted > 0 && unlisted == 0) {
      first_id = p.first_id;
      first_image = p.first_image;
    }
    unlisted += p.unlisted;
    for (auto& [image, bytes] : p.by_image) {
      std::string& all = (*detections)[image];
      if (all.empty()) {
        all = std::move(bytes);
      } else {
        all += bytes;
      }
    }
    p.by_image.clear();
  }
  if (unlisted > 0) spec->add_manifest_warnings(UnlistedWarning("result", unlisted, first_id, first_image));
  return absl::OkStatus();
}

// The annotation file's images and categories checked, and what the stored spec holds of them: the
// categories, the class count and conventions of the semantic metrics, the warnings, the hashes.
// `detections`: the results file's, read here once for every worker, encoded by image.
absl::Status CompleteCocoSpec(const CocoDataset& gt, int64_t max_rows, const ClientFileLimits& limits,
                              v1::JobSpec* out, std::unordered_map<int64_t, std::string>* detections) {
  v1::JobSpec& spec = *out;
  std::set<int64_t> image_ids;
  for (const CocoImageInfo& im : gt.images) {
    if (!image_ids.insert(im.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("COCO file '", spec.coco(), "': image id ", im.id,
                                                     " is listed twice in 'images'"));
    }
  }
  if (static_cast<int64_t>(gt.images.size()) > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("COCO file '", spec.coco(), "' lists ", gt.images.size(),
                                                   " images; at most ", max_rows,
                                                   " rows (tallyd --max-manifest-rows)"));
  }
  std::map<int64_t, const CocoCategoryInfo*> categories;
  for (const CocoCategoryInfo& c : gt.categories) {
    if (!categories.emplace(c.id, &c).second) {
      return absl::InvalidArgumentError(absl::StrCat("COCO file '", spec.coco(), "': category id ", c.id,
                                                     " is listed twice in 'categories'"));
    }
  }
  // The semantic metrics (README "Instances") label pixels by category id, 0 being no instance.
  if (!categories.empty() && (categories.begin()->first < 1 || categories.rbegin()->first >= kMaxClasses)) {
    const int64_t bad = categories.begin()->first < 1 ? categories.begin()->first : categories.rbegin()->first;
    return absl::InvalidArgumentError(absl::StrCat("COCO file '", spec.coco(), "': category id ", bad,
                                                   " is outside 1..", kMaxClasses - 1));
  }
  spec.set_num_classes(categories.empty() ? 2 : std::max<int64_t>(2, categories.rbegin()->first + 1));
  spec.set_ignore_index(kNoIgnoreIndex);
  spec.clear_label_map();
  for (const auto& [id, c] : categories) {
    v1::CocoCategory* k = spec.add_coco_categories();
    k->set_id(id);
    k->set_name(c->name);
    k->set_isthing(c->isthing);
  }
  WarnUnlisted(gt.annotations, image_ids, "annotation", &spec);
  if (!spec.coco_results().empty()) {
    // Read once, here: a file that is no results file fails the submission, and each row carries
    // its image's detections to the worker that scores it (no worker parses the whole file).
    std::string sha256;
    RETURN_IF_ERROR(ReadDetections(spec.coco_results(), limits, image_ids, &sha256, &spec, detections));
    spec.set_coco_results_sha256(sha256);
    spec.set_coco_results_in_rows(true);
  }
  return absl::OkStatus();
}

// A panoptic job's categories (in the file's order: panopticapi averages over them in that order)
// and the conventions of its semantic metrics: labels are category ids, void (0) ignored.
absl::Status CompletePanopticSpec(const CocoDataset& gt, v1::JobSpec* spec) {
  int64_t top = 1;
  std::set<int64_t> seen;
  for (const CocoCategoryInfo& c : gt.categories) {
    if (c.id < 1 || c.id >= kMaxClasses || !seen.insert(c.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("COCO panoptic file '", spec->coco_panoptic(), "': category id ",
                                                     c.id, c.id < 1 || c.id >= kMaxClasses
                                                               ? absl::StrCat(" is outside 1..", kMaxClasses - 1)
                                                               : std::string(" is listed twice")));
    }
    top = std::max(top, c.id);
    v1::CocoCategory* k = spec->add_coco_categories();
    k->set_id(c.id);
    k->set_name(c.name);
    k->set_isthing(c.isthing);
  }
  spec->set_num_classes(static_cast<int32_t>(top + 1));
  spec->set_ignore_index(0);
  spec->clear_label_map();
  return absl::OkStatus();
}

}  // namespace

absl::Status RowsInMemory::NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) {
  rows->clear();
  for (; next_ < rows_.size() && rows->size() < max_rows; ++next_) rows->push_back(std::move(rows_[next_]));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RowsInMemory>> PanopticImageRows(int64_t max_rows, const ClientFileLimits& limits,
                                                                v1::JobSpec* out) {
  v1::JobSpec& spec = *out;
  std::string sha256[2];
  ASSIGN_OR_RETURN(CocoDataset gt, LoadCocoPanoptic(spec.coco_panoptic(), limits, &sha256[0]));
  ASSIGN_OR_RETURN(CocoDataset predictions, LoadCocoPanoptic(spec.panoptic_predictions(), limits, &sha256[1]));
  spec.set_coco_sha256(sha256[0]);
  spec.set_coco_results_sha256(sha256[1]);
  RETURN_IF_ERROR(CompletePanopticSpec(gt, &spec));
  if (static_cast<int64_t>(gt.panoptic.size()) > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("COCO panoptic file '", spec.coco_panoptic(), "' has ",
                                                   gt.panoptic.size(), " annotations; at most ",
                                                   max_rows, " rows (tallyd --max-manifest-rows)"));
  }
  std::map<int64_t, const CocoPanopticAnnotation*> predicted;
  for (const CocoPanopticAnnotation& a : predictions.panoptic) predicted.emplace(a.image_id, &a);
  std::vector<ManifestRow> rows;
  std::set<int64_t> images;
  for (size_t i = 0; i < gt.panoptic.size(); ++i) {
    const CocoPanopticAnnotation& a = gt.panoptic[i];
    ManifestRow row;
    row.index = static_cast<int64_t>(i);
    row.id = absl::StrCat(a.image_id);
    row.mask = a.file_name;
    row.mask_path = ResolvePath(spec.panoptic_dir(), a.file_name);
    row.has_coco_image = true;
    row.coco_image_id = a.image_id;
    auto p = predicted.find(a.image_id);
    if (!images.insert(a.image_id).second) {
      row.error = absl::StrCat("image ", a.image_id, " has a second annotation in '", spec.coco_panoptic(), "'");
    } else if (p == predicted.end()) {
      row.error = absl::StrCat("no prediction for image ", a.image_id, " in '", spec.panoptic_predictions(), "'");
    } else {
      row.prediction = p->second->file_name;
      row.prediction_path = ResolvePath(spec.panoptic_predictions_dir(), p->second->file_name);
    }
    rows.push_back(std::move(row));
  }
  int64_t unlisted = 0;
  for (const CocoPanopticAnnotation& a : predictions.panoptic) unlisted += images.count(a.image_id) == 0;
  if (unlisted > 0) {
    spec.add_manifest_warnings(absl::StrCat(unlisted, " predicted annotation(s) are for images the reference does not ",
                                            "annotate; they are not scored"));
  }
  return std::make_unique<RowsInMemory>(spec.coco_panoptic(), std::move(rows));
}

absl::StatusOr<std::unique_ptr<RowsInMemory>> CocoImageRows(int64_t max_rows, const ClientFileLimits& limits,
                                                            v1::JobSpec* out, bool keep_columns) {
  v1::JobSpec& spec = *out;
  std::string sha256;
  const double t0 = NowUnix();
  ASSIGN_OR_RETURN(CocoDataset gt, LoadCocoDataset(spec.coco(), limits, &sha256));
  spec.set_coco_sha256(sha256);
  std::unordered_map<int64_t, std::string> detections;  // By image, encoded, in the file's order.
  const double t1 = NowUnix();
  RETURN_IF_ERROR(CompleteCocoSpec(gt, max_rows, limits, &spec, &detections));
  const double t2 = NowUnix();
  std::vector<ManifestRow> rows;
  // Jobs that group or search slices keep the images' fields as columns (width, height first).
  const std::vector<std::string> columns = keep_columns ? CocoImageColumns(gt.images) : std::vector<std::string>();
  for (const std::string& c : columns) spec.add_manifest_columns(c);
  for (size_t i = 0; i < gt.images.size(); ++i) {
    const CocoImageInfo& im = gt.images[i];
    ManifestRow row;
    if (!columns.empty()) row.columns = CocoImageValues(im, columns);
    row.index = static_cast<int64_t>(i);
    row.id = absl::StrCat(im.id);
    row.image = im.file_name;
    if (!im.file_name.empty()) row.image_path = ResolvePath(spec.coco_images(), im.file_name);
    row.has_coco_image = true;
    row.coco_image_id = im.id;
    if (auto it = detections.find(im.id); it != detections.end()) row.coco_detections = std::move(it->second);
    // Only a model reads the image (a results job draws its thumbnails without one).
    if (im.file_name.empty() && !spec.model().empty()) row.error = absl::StrCat("COCO image ", im.id, " has no file_name");
    rows.push_back(std::move(row));
  }
  Log(spec.coco(), " read in ", absl::StrFormat("%.2f", t1 - t0), " s",
      spec.coco_results().empty() ? std::string()
                                  : absl::StrCat(", ", spec.coco_results(), " in ", absl::StrFormat("%.2f", t2 - t1), " s"),
      "; ", gt.images.size(), " rows");
  return std::make_unique<RowsInMemory>(spec.coco(), std::move(rows));
}
}  // namespace tally
