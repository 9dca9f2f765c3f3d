#include "worker/scoring/scoring.h"
#include "metrics/connected_components.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "base/clock.h"
#include "common/formats/decode.h"
#include "common/sources/tar_shards.h"
#include "metrics/label_counts.h"
#include "base/log.h"
#include "metrics/surface_distance.h"
#include "worker/scoring/lesion_scoring.h"
#include "worker/scoring/probabilities.h"
#include "metrics/calibration.h"
#include "metrics/calibration_fine.h"
#include "base/file_util.h"
#if TALLY_CUDA_KERNELS
#include "metrics/gpu/surface3d_kernel.h"
#endif
#include "common/formats/volume.h"
#include "base/status_macros.h"
#include "common/sources/row_files.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using LoadedMap = ScoringPipeline::LoadedMap;

absl::Status Load(const std::string& path, int64_t max_voxels, const char* what, LoadedMap* out) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("no ", what, " path"));
  out->volume = IsNiftiPath(path);
  if (out->volume) {
    RETURN_IF_ERROR(LoadNiftiLabels(path, max_voxels, &out->labels, &out->geometry));
    absl::StatusOr<FileFacts> facts = DigestFile(path);  // nifti_clib read it: once more, for its digest.
    if (!facts.ok()) return facts.status();
    out->digest = facts->xxh128;
    out->modified_ns = facts->mtime_ns;
    return absl::OkStatus();
  }
  FileFacts facts;
  absl::Status s = LoadMask(path, &out->labels, max_voxels, 0, &facts);
  if (!s.ok()) return s;
  out->digest = facts.xxh128;
  out->modified_ns = facts.mtime_ns;
  out->geometry = VolumeGeometry{};
  out->geometry.height = out->labels.height;
  out->geometry.width = out->labels.width;
  return absl::OkStatus();
}

std::string Position(const LabelMap& m, int64_t i) {
  const int64_t plane = static_cast<int64_t>(m.height) * m.width;
  const int64_t z = i / plane, r = i % plane;
  if (m.depth > 1) return absl::StrCat("(x=", r % m.width, ", y=", r / m.width, ", z=", z, ")");
  return absl::StrCat("(y=", r / m.width, ", x=", r % m.width, ")");
}

// Groups and slices: the reference's components per label (RowProperties; a prediction manifest
// has no image to take an intensity from).
void MeasureReference(const LabelMap& ref, v1::ImageResult* result) {
  v1::RowProperties* p = result->mutable_properties();
  for (int64_t c : CountComponentsPerLabel(ref.labels.data(), ref.depth, ref.height, ref.width, ref.max_label)) {
    p->add_components(c);
  }
}

}  // namespace

absl::Status ScoringPipeline::LoadPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred) const {
  if (coco_ != nullptr && row.has_coco_ann_ids()) {
    // A referring row: the reference is its annotations' union, at the prediction's size.
    RETURN_IF_ERROR(Load(row.prediction_path(), config_.max_image_pixels, "prediction", pred));
    if (pred->volume) return absl::InvalidArgumentError("coco_ann_ids rows are 2D: the prediction is a volume");
    if (!label_lut_.empty()) {
      for (uint16_t& v : pred->labels.labels) v = label_lut_[v];
    }
    *ref = LoadedMap{};
    ref->geometry = pred->geometry;
    RETURN_IF_ERROR(CocoReferenceLabels(*coco_, row, pred->labels.height, pred->labels.width, &ref->labels));
    PrepareMask(&ref->labels, label_lut_, config_.ignore_index);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Load(row.mask_path(), config_.max_image_pixels, "mask", ref));
  RETURN_IF_ERROR(Load(row.prediction_path(), config_.max_image_pixels, "prediction", pred));
  if (ref->volume != pred->volume) {
    return absl::InvalidArgumentError(absl::StrCat("prediction '", DisplayPath(row.prediction_path()), "' is ",
                                                   pred->volume ? "a NIfTI volume" : "a PNG image", " but reference '",
                                                   DisplayPath(row.mask_path()), "' is ",
                                                   ref->volume ? "a NIfTI volume" : "a PNG image"));
  }
  if (ref->volume) {
    RETURN_IF_ERROR(CheckSameGeometry(ref->geometry, row.mask_path(), pred->geometry, row.prediction_path()));
  } else if (ref->labels.height != pred->labels.height || ref->labels.width != pred->labels.width) {
    return absl::InvalidArgumentError(absl::StrCat("prediction '", DisplayPath(row.prediction_path()), "' is ", pred->labels.height,
                                                   "x", pred->labels.width, " (HxW) but reference '", DisplayPath(row.mask_path()),
                                                   "' is ", ref->labels.height, "x", ref->labels.width));
  }
  // Mask conventions: the label map on both, then the ignore index on the reference.
  if (!label_lut_.empty()) {
    for (uint16_t& v : pred->labels.labels) v = label_lut_[v];
  }
  PrepareMask(&ref->labels, label_lut_, config_.ignore_index);
  return absl::OkStatus();
}

absl::Status ScoringPipeline::PredictPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred) const {
  RETURN_IF_ERROR(Load(row.mask_path(), config_.max_image_pixels, "mask", ref));
  if (!ref->volume) {
    return absl::InvalidArgumentError(absl::StrCat("mask '", DisplayPath(row.mask_path()), "' is not a NIfTI volume; a volume ",
                                                   "job's references are volumes"));
  }
  ASSIGN_OR_RETURN(VolumePrediction p, volumes_->Predict(row, ref->geometry, row.mask_path()));
  *pred = LoadedMap{};
  pred->volume = true;
  pred->geometry = ref->geometry;
  pred->labels.depth = ref->labels.depth;
  pred->labels.height = ref->labels.height;
  pred->labels.width = ref->labels.width;
  pred->labels.labels = std::move(p.labels);
  pred->classes = p.classes > 0 ? p.classes : config_.num_classes;
  pred->nonfinite = p.nonfinite;
  pred->from_store = p.from_store;
  if (!save_predictions_.empty()) {
    const std::string path =
        absl::StrCat(save_predictions_, "/", PredictionFileName(row.id(), row.index(), ".nii.gz"));
    RETURN_IF_ERROR(WriteNiftiLabels(path, ref->geometry, pred->labels.labels.data(), 512 /* DT_UINT16 */));
  }
  PrepareMask(&ref->labels, label_lut_, config_.ignore_index);  // Model outputs are labels already.
  return absl::OkStatus();
}

absl::StatusOr<int> ScoringPipeline::ClassCount(const v1::ManifestRow& row, const LoadedMap& ref,
                                                const LoadedMap& pred) const {
  const uint16_t* p = pred.labels.labels.data();
  const uint16_t* r = ref.labels.labels.data();
  const int64_t n = static_cast<int64_t>(ref.labels.labels.size());
  // Prediction labels: kIgnoredPixel (65535) is no label there, so the plain maximum is checked.
  // The maximum first, its position only for an error message. Blocks of a fixed length, compared
  // as signed 16-bit values (x ^ 0x8000 keeps the order), so the compiler vectorises the loop with
  // the baseline x86-64 instructions.
  int16_t biased = INT16_MIN;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    int16_t block = INT16_MIN;
    for (int k = 0; k < 32; ++k) block = std::max(block, static_cast<int16_t>(p[i + k] ^ 0x8000));
    biased = std::max(biased, block);
  }
  for (; i < n; ++i) biased = std::max(biased, static_cast<int16_t>(p[i] ^ 0x8000));
  const uint16_t top = static_cast<uint16_t>(biased ^ 0x8000);
  const int pred_max = n > 0 ? top : -1;
  auto pred_max_at = [&] { return static_cast<int64_t>(std::find(p, p + n, top) - p); };
  if (pred_max > kMaxMaskValue) {
    return absl::InvalidArgumentError(absl::StrCat("prediction '", DisplayPath(row.prediction_path()), "' holds label ", pred_max,
                                                   " at ", Position(pred.labels, pred_max_at()), "; labels are 0..",
                                                   kMaxMaskValue));
  }
  if (!config_.regions.empty()) return static_cast<int>(config_.regions.size());
  // Volume jobs: every row has the model's classes (the coordinator holds model jobs to one count).
  const int fixed = volumes_ != nullptr ? pred.classes : config_.num_classes;
  if (volumes_ != nullptr && fixed <= 0) {
    return absl::InvalidArgumentError(
        "the model returned labels without saying how many classes it has: give --num-classes (or the Python "
        "model's num_classes), so that every volume is scored over the same classes");
  }
  if (fixed <= 0) return std::max({1, pred_max + 1, ref.labels.max_label + 1});
  const int classes = fixed;
  if (pred_max >= classes) {
    return absl::InvalidArgumentError(absl::StrCat("prediction value ", pred_max, " at ",
                                                   Position(pred.labels, pred_max_at()), " >= number of classes ", classes,
                                                   " (--num-classes; values are labels after --label-map)"));
  }
  // PrepareMask's max_label spares a scan of the reference on every good row.
  const int64_t bad = ref.labels.max_label >= classes ? FirstLabelAtOrAbove(r, n, classes) : -1;
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask value ", r[bad], " at ", Position(ref.labels, bad), " >= number of classes ", classes,
        " (--num-classes; values are labels after --label-map; the ignore value is set by --ignore-index)"));
  }
  return classes;
}

absl::StatusOr<SurfaceOptions3D> ScoringPipeline::SpacingOf(const v1::ManifestRow& row, const LoadedMap& ref) const {
  const JobConfig& config = config_;
  SurfaceOptions3D o{1, config.spacing_y, config.spacing_x, config.nsd_tolerance};
  if (!ref.volume) return o;
  const auto& h = ref.geometry.spacing;
  if (config.spacing_z > 0) {
    const bool contradicts = ref.geometry.spacing_in_header &&
                             (!WithinTolerance(config.spacing_z, h[0]) || !WithinTolerance(config.spacing_y, h[1]) ||
                              !WithinTolerance(config.spacing_x, h[2]));
    if (contradicts && !config.force_spacing) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "--spacing %g,%g,%g (z,y,x) contradicts the spacing %g,%g,%g in the header of '%s' (pass "
          "--force-spacing to use it anyway)",
          config.spacing_z, config.spacing_y, config.spacing_x, h[0], h[1], h[2], row.mask_path()));
    }
    o.spacing_z = config.spacing_z;
  } else if (config.spacing_given && ref.labels.depth > 1) {
    return absl::FailedPreconditionError(absl::StrCat("--spacing has two values (y,x) but '", DisplayPath(row.mask_path()),
                                                      "' is a 3D volume: give three (z,y,x), or none to use the header's"));
  } else {
    o.spacing_z = h[0];
    o.spacing_y = h[1];
    o.spacing_x = h[2];
  }
  return o;
}

absl::Status ScoringPipeline::LoadPanopticPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred,
                                               v1::ImageResult* result) const {
  RgbImage png[2];
  FileFacts facts[2];
  RETURN_IF_ERROR(LoadImage(row.mask_path(), &png[0], config_.max_image_pixels, {}, &facts[0]));
  RETURN_IF_ERROR(LoadImage(row.prediction_path(), &png[1], config_.max_image_pixels, {}, &facts[1]));
  ref->digest = facts[0].xxh128;
  pred->digest = facts[1].xxh128;
  ref->modified_ns = facts[0].mtime_ns;
  pred->modified_ns = facts[1].mtime_ns;
  RETURN_IF_ERROR(panoptic_->Evaluate(row, png[0], png[1], &ref->labels, &pred->labels, result));
  for (LoadedMap* map : {ref, pred}) {
    map->volume = false;
    map->geometry = VolumeGeometry{};
    map->geometry.height = map->labels.height;
    map->geometry.width = map->labels.width;
  }
  PrepareMask(&ref->labels, label_lut_, config_.ignore_index);  // Void (0) is the ignore value.
  return absl::OkStatus();
}

absl::Status ScoringPipeline::LoadCocoPair(const v1::ManifestRow& row, LoadedMap* ref, LoadedMap* pred,
                                           v1::ImageResult* result, ShardThumbnails* thumbnails, int64_t spare) const {
  if (!row.has_coco_image()) return absl::InvalidArgumentError("the row names no COCO image");
  // The size the annotation file gives, checked before anything of that size is made.
  const CocoImageInfo* info = coco_->Image(row.coco_image_id());
  if (info != nullptr && (info->height <= 0 || info->width <= 0 ||
                          !ProductWithin({info->height, info->width}, config_.max_image_pixels))) {
    return absl::InvalidArgumentError(absl::StrCat("COCO image ", info->id, " is ", info->height, "x", info->width,
                                                   " (HxW); expected a size of 1 to ", config_.max_image_pixels,
                                                   " pixels (--max-image-pixels)"));
  }
  CocoImageInstances image;
  RETURN_IF_ERROR(coco_->Instances(row.coco_image_id(), &image, spare, row.coco_detections()));
  result->set_coco_image_id(image.image_id);
  EvaluateCocoInstances(image, result->mutable_instances());
  bool render = false;
  if (thumbnails != nullptr) {
    const double f1 = RowInstanceF1(*result);
    render = thumbnails->EnterScore(kInstanceThumbnailClass, f1, row.index());
    absl::MutexLock lock(&worst_mu_);
    render = worker_worst_.Offer(kInstanceThumbnailClass, f1, row.index()) && render;
  }
  if (render) {
    RgbImage rgb;
    const bool with_image = !row.image_path().empty() && LoadImage(row.image_path(), &rgb).ok() &&
                            rgb.height == image.height && rgb.width == image.width;
    absl::StatusOr<std::string> jpeg = RenderInstanceThumbnail(image, with_image ? rgb.pixels.data() : nullptr);
    if (jpeg.ok()) {
      thumbnails->Attach(result, kInstanceThumbnailClass, 0, *std::move(jpeg));
    } else {
      Log("no thumbnail for row ", row.index(), ": ", jpeg.status().message());
    }
  }
  // Counts do not depend on the pixels' order: the maps are painted column by column, as the masks
  // run, and turned row by row only where the geometry matters (surface distances).
  const bool row_major = AnySurfaceMetric(config_.metrics);
  for (auto [map, detections] : {std::pair<LoadedMap*, bool>{ref, false}, {pred, true}}) {
    map->volume = false;
    map->labels.height = static_cast<int>(row_major ? image.height : image.width);
    map->labels.width = static_cast<int>(row_major ? image.width : image.height);
    // Size checked above. A new vector: zeroed by one memset (assign(n, 0) stays a 16-bit loop at -O2).
    map->labels.labels = std::vector<uint16_t>(static_cast<size_t>(image.height * image.width));
    PaintCocoLabels(detections ? image.detections : image.references, detections, image.height, image.width,
                    map->labels.labels.data(), !row_major, /*zeroed=*/true);
    map->geometry = VolumeGeometry{};
    map->geometry.height = static_cast<int>(image.height);
    map->geometry.width = static_cast<int>(image.width);
  }
  auto in_range = [&](const std::vector<CocoInstance>& instances) {
    return std::all_of(instances.begin(), instances.end(), [&](const CocoInstance& i) {
      return i.category_id >= 0 && i.category_id < config_.num_classes;
    });
  };
  ref->labels_in_range = config_.num_classes > 0 && config_.num_classes <= kMaxMaskValue + 1 && config_.regions.empty() &&
                         in_range(image.references) && in_range(image.detections);
  if (ref->labels_in_range) {
    ref->labels.ignored = 0;  // PrepareMask's, with no ignore value; max_label follows the counts.
  } else {
    PrepareMask(&ref->labels, {}, kNoIgnoreIndex);
  }
  return absl::OkStatus();
}

void ScoringPipeline::Surfaces(const uint16_t* p, const uint16_t* r, int depth, int height, int width, int classes,
                               const SurfaceOptions3D& spacing, std::vector<SurfaceValues>* surface) const {
#if TALLY_CUDA_KERNELS
  const int device = surface_device_.load();
  if (device >= 0 && depth > 1 && config_.regions.empty()) {
    const std::string why = ClassSurfaceMetrics3DOnDevice(p, r, depth, height, width, classes, kIgnoredPixel, spacing,
                                                          surface, device, SpareThreads());
    if (why.empty()) return;
    if (surface_device_.exchange(-1) >= 0) Log("surface distances on cuda:", device, " failed (", why, "); the CPU takes them");
  }
#endif
  if (!config_.regions.empty()) {
    RegionSurfaceMetrics(p, r, depth, height, width, config_.regions, kIgnoredPixel, spacing, surface);
  } else if (depth > 1) {
    ClassSurfaceMetrics3D(p, r, depth, height, width, classes, kIgnoredPixel, spacing, surface, SpareThreads());
  } else {
    ClassSurfaceMetrics(p, r, height, width, classes, kIgnoredPixel,
                        SurfaceOptions{spacing.spacing_y, spacing.spacing_x, spacing.nsd_tolerance}, surface);
  }
}

absl::Status ScoringPipeline::Lesions(const uint16_t* p, const uint16_t* r, int depth, int height, int width,
                                      const SurfaceOptions3D& spacing, int64_t spare, v1::ImageResult* result) const {
  LesionOptions lesion = config_.lesion;
  lesion.max_component_bytes = spare;
  lesion.spacing_z = spacing.spacing_z;
  lesion.spacing_y = spacing.spacing_y;
  lesion.spacing_x = spacing.spacing_x;
  return ScoreLesions(p, r, depth, height, width, config_.regions, config_.include_background, lesion, result);
}

namespace {

// `result` failed with `message`: what was scored of it is dropped.
v1::ImageResult Failed(v1::ImageResult result, absl::string_view message) {
  result.clear_classes();  // What it was scored from (inputs) stays.
  result.clear_instances();
  result.clear_panoptic();
  result.clear_panoptic_matches();
  result.clear_panoptic_fp();
  result.clear_panoptic_fn();
  result.clear_lesions();
  result.set_error(std::string(message));
  return result;
}

// The row's counts per class (or region). `max_from_counts` (LoadedMap::labels_in_range): the
// reference's largest label is set from them, as PrepareMask's scan would have found it.
void CountRow(const uint16_t* p, const uint16_t* r, int64_t n, int classes, const std::vector<std::vector<int>>& regions,
              LabelMap* ref, bool max_from_counts, std::vector<ConfusionCounts>* counts) {
  if (!regions.empty()) {
    CountRegions(p, r, n, regions, counts);
    return;
  }
  CountClasses(p, r, n, classes, counts);
  if (!max_from_counts) return;
  ref->max_label = -1;
  for (int c = 0; c < classes; ++c) {
    if ((*counts)[c].tp + (*counts)[c].fn > 0) ref->max_label = c;
  }
}

}  // namespace

void ScoringPipeline::RecordSpacing(const LoadedMap& ref, const SurfaceOptions3D& spacing,
                                    v1::ImageResult* result) const {
  // The spacing the report names: the one the distances used, or where none was computed the header's.
  const bool used = AnySurfaceMetric(config_.metrics) || AnyLesionMetric(config_.metrics);
  result->add_spacing(used ? spacing.spacing_z : ref.geometry.spacing[0]);
  result->add_spacing(used ? spacing.spacing_y : ref.geometry.spacing[1]);
  result->add_spacing(used ? spacing.spacing_x : ref.geometry.spacing[2]);
}

absl::Status ScoringPipeline::Probabilities(const v1::ManifestRow& row, const LoadedMap& ref, const LoadedMap& pred,
                                            int* classes, v1::ImageResult* result) const {
  if (!config_.calibration || volumes_ != nullptr) return absl::OkStatus();
  // A probability map holds two classes' probabilities: a row of background alone has both.
  *classes = std::max(*classes, 2);
  const auto& names = config_.manifest_columns;
  const auto col = std::find(names.begin(), names.end(), kProbabilitiesColumn) - names.begin();
  const std::string value = col < row.columns_size() ? row.columns(static_cast<int>(col)) : std::string();
  const std::string base = config_.manifest.substr(0, config_.manifest.rfind('/') + 1);
  return CountRowProbabilities(value.empty() ? value : ResolvePath(base, value), config_.max_image_pixels, ref.labels,
                               ref.geometry, row.mask_path(), pred.labels, *classes, result);
}

v1::ImageResult ScoringPipeline::ScoreRow(const v1::ManifestRow& row, ShardThumbnails* thumbnails,
                                          std::string* fatal) const {
  const JobConfig& config = config_;
  v1::ImageResult result;
  result.set_index(row.index());
  auto fail = [&](absl::string_view message) { return Failed(std::move(result), message); };
  if (!row.error().empty()) return fail(row.error());
  // The row's memory, from what its files declare, held at the gate while it is scored.
  int64_t held = 0, spare = -1;
  if (std::string why = Admit(row, &held, &spare); !why.empty()) return fail(why);
  absl::Cleanup release = [&] {
    if (held > 0) memory_->Release(held);
  };
  LoadedMap ref, pred;
  const absl::Status loaded = panoptic_ != nullptr                       ? LoadPanopticPair(row, &ref, &pred, &result)
                              : coco_ != nullptr && row.has_coco_image() ? LoadCocoPair(row, &ref, &pred, &result, thumbnails,
                                                                                        spare)
                              : volumes_ != nullptr                      ? PredictPair(row, &ref, &pred)
                                                                         : LoadPair(row, &ref, &pred);
  if (!ref.digest.empty()) result.mutable_inputs()->set_mask(ref.digest);
  if (!pred.digest.empty()) result.mutable_inputs()->set_prediction(pred.digest);
  if (pred.from_store) result.set_from_store(true);
  result.mutable_inputs()->set_modified_ns(
      std::max({result.inputs().modified_ns(), ref.modified_ns, pred.modified_ns}));
  if (!loaded.ok()) return fail(loaded.message());
  absl::StatusOr<int> classes = ref.labels_in_range ? absl::StatusOr<int>(config.num_classes)
                                                    : ClassCount(row, ref, pred);
  if (!classes.ok()) return fail(classes.status().message());
  if (absl::Status s = Probabilities(row, ref, pred, &*classes, &result); !s.ok()) return fail(s.message());
  if (pred.nonfinite > 0) {
    if (config.nonfinite == NonfinitePolicy::kFail) {
      return fail(absl::StrCat("the model's output for this volume has ", pred.nonfinite,
                               " NaN/Inf values (--nonfinite warn evaluates such rows)"));
    }
    result.set_nonfinite(pred.nonfinite);
  }
  const uint16_t* p = pred.labels.labels.data();
  const uint16_t* r = ref.labels.labels.data();
  const int64_t n = static_cast<int64_t>(ref.labels.labels.size());
  const int depth = ref.labels.depth, height = ref.labels.height, width = ref.labels.width;
  std::vector<ConfusionCounts> counts;
  CountRow(p, r, n, *classes, config.regions, &ref.labels, ref.labels_in_range, &counts);
  std::vector<SurfaceValues> surface(*classes, SurfaceValues{kNaN, kNaN, kNaN, kNaN});
  SurfaceOptions3D spacing;
  if (AnySurfaceMetric(config.metrics) || AnyLesionMetric(config.metrics)) {
    // Spacing: a volume's header, unless --spacing z,y,x overrides it; 2D: --spacing y,x or 1.
    const absl::StatusOr<SurfaceOptions3D> given = SpacingOf(row, ref);
    if (!given.ok()) {
      *fatal = std::string(given.status().message());  // The job's flags are wrong, not this row.
      return fail(*fatal);
    }
    spacing = *given;
  }
  if (AnySurfaceMetric(config.metrics)) Surfaces(p, r, depth, height, width, *classes, spacing, &surface);
  if (ref.volume && depth > 1) RecordSpacing(ref, spacing, &result);
  // COCO rows' maps may run column by column (LoadCocoPair): the image's size is the geometry's.
  result.set_height(row.has_coco_image() ? ref.geometry.height : height);
  result.set_width(row.has_coco_image() ? ref.geometry.width : width);
  if (depth > 1) result.set_depth(depth);
  result.set_mask_max_label(ref.labels.max_label);
  result.set_mask_ignored_pixels(ref.labels.ignored);
  if (config.row_properties()) MeasureReference(ref.labels, &result);
  for (int c = 0; c < *classes; ++c) {
    v1::ClassResult* cr = result.add_classes();
    cr->set_tp(counts[c].tp);
    cr->set_fp(counts[c].fp);
    cr->set_fn(counts[c].fn);
    cr->set_tn(counts[c].tn);
    cr->set_hd(surface[c].hd);
    cr->set_hd95(surface[c].hd95);
    cr->set_assd(surface[c].assd);
    cr->set_nsd(surface[c].nsd);
  }
  if (AnyLesionMetric(config.metrics)) {
    const absl::Status scored = Lesions(p, r, depth, height, width, spacing, spare, &result);
    if (!scored.ok()) return fail(scored.message());
  }
  // COCO instance jobs show instances (matched, missed, false) instead of one class's pixels.
  if (thumbnails != nullptr && coco_ == nullptr) AddThumbnails(row, p, r, depth, height, width, thumbnails, &result);
  return result;
}

void ScoringPipeline::AddThumbnails(const v1::ManifestRow& row, const uint16_t* prediction, const uint16_t* reference,
                                    int depth, int height, int width, ShardThumbnails* thumbnails,
                                    v1::ImageResult* result) const {
  const std::vector<int> classes = thumbnails->Enter(*result);
  if (classes.empty()) return;
  // The row's image, where the manifest has one of the same size (2D only).
  RgbImage image;
  const int page_column = config_.page_column;
  const absl::StatusOr<DecodeOptions> decode = RowDecodeOptions(
      page_column >= 0 && page_column < row.columns_size() ? row.columns(page_column) : std::string(), config_.window);
  const bool with_image = depth <= 1 && !row.image_path().empty() && decode.ok() &&
                          LoadImage(row.image_path(), &image, config_.max_image_pixels, *decode).ok() &&
                          image.height == height && image.width == width;
  std::vector<uint8_t> member;
  for (int c : classes) {
    if (!config_.regions.empty()) {
      member.assign(65536, 0);
      for (int l : config_.regions[c]) member[l] = 1;
    }
    int slice = 0;
    absl::StatusOr<std::string> jpeg =
        RenderClassThumbnail(with_image ? image.pixels.data() : nullptr, prediction, reference, std::max(1, depth),
                             height, width, c, member.empty() ? nullptr : member.data(), &slice);
    if (!jpeg.ok()) {
      Log("no thumbnail for row ", row.index(), " class ", c, ": ", jpeg.status().message());
    } else if (!thumbnails->Attach(result, c, slice, *std::move(jpeg))) {
      return;
    }
  }
}

ScoringPipeline::ScoringPipeline(JobConfig config, int threads, ResultFn on_result, FatalFn on_fatal,
                                 TimeoutFn on_timeout, std::shared_ptr<const CocoSource> coco,
                                 std::shared_ptr<const PanopticSource> panoptic, std::shared_ptr<VolumeModel> volumes,
                                 std::string save_predictions)
    : config_(std::move(config)),
      coco_(std::move(coco)),
      panoptic_(std::move(panoptic)),
      volumes_(std::move(volumes)),
      save_predictions_(std::move(save_predictions)),
      worker_worst_(config_.thumbnails),
      label_lut_(MakeLabelLut(config_.label_map)),
      on_result_(std::move(on_result)),
      on_fatal_(std::move(on_fatal)),
      on_timeout_(std::move(on_timeout)) {
  threads_count_ = std::max(1, threads);
  absl::MutexLock lock(&mu_);
  activity_.resize(threads_count_);
  for (int i = 0; i < threads_count_; ++i) threads_.emplace_back([this, i] { Loop(i); });
  if (on_timeout_ && config_.batch_timeout_seconds > 0) threads_.emplace_back([this] { WatchdogLoop(); });
}

void ScoringPipeline::SetMemoryBudget(int64_t bytes) {
  memory_ = bytes > 0 ? std::make_unique<MemoryGate>(bytes) : nullptr;
}

std::string ScoringPipeline::Admit(const v1::ManifestRow& row, int64_t* held, int64_t* spare) const {
  if (memory_ == nullptr) return "";
  std::string what;
  const int64_t bytes = EstimateRow(row, &what);
  if (std::string why = RowOverBudget(bytes, memory_->budget(), what); !why.empty()) return why;
  *held = memory_->Acquire(bytes);
  *spare = memory_->budget() - bytes;
  return "";
}

int64_t ScoringPipeline::EstimateRow(const v1::ManifestRow& row, std::string* what) const {
  RowMemoryInputs in;
  in.lesions = AnyLesionMetric(config_.metrics);
  in.lesion_dilation = config_.lesion.iou_threshold > 0 ? 0 : config_.lesion.dilation;
  std::string size;
  if (coco_ != nullptr && row.has_coco_image()) {
    const CocoImageInfo* info = coco_->Image(row.coco_image_id());
    if (info == nullptr || !ProductWithin({info->height, info->width}, config_.max_image_pixels)) return 0;
    in.voxels = info->height * info->width;
    in.coco = true;
    in.thumbnail = config_.thumbnails > 0;
    size = absl::StrCat(info->height, "x", info->width, " pixels");
  } else {
    // Both files (a volume job's model gives the prediction: its reference alone).
    for (const std::string& path : {row.mask_path(), volumes_ != nullptr ? std::string() : row.prediction_path()}) {
      if (path.empty()) continue;
      absl::StatusOr<DeclaredSize> d = ReadDeclaredSize(path, config_.max_image_pixels);
      if (!d.ok()) return 0;
      in.voxels = std::max(in.voxels, d->voxels());
      in.stored_bytes_per_voxel = std::max(in.stored_bytes_per_voxel, d->stored_bytes_per_voxel);
      in.file_bytes = std::max(in.file_bytes, d->file_bytes);
      size = d->depth > 1 ? absl::StrCat(d->width, "x", d->height, "x", d->depth, " (x, y, z) voxels")
                          : absl::StrCat(d->height, "x", d->width, " pixels");
    }
    in.panoptic = panoptic_ != nullptr;
    in.calibration = config_.calibration && volumes_ == nullptr;
  }
  *what = absl::StrCat(size, in.lesions ? " with lesion metrics" : "", in.panoptic ? " (panoptic)" : "");
  return ScoringRowBytes(in);
}

ScoringPipeline::~ScoringPipeline() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ScoringPipeline::Submit(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) {
  auto shard = std::make_shared<Shard>();
  shard->lease = lease;
  shard->rows = std::move(rows);
  if (!shard->rows.empty()) shard->first_index = shard->rows.front().index();
  if (config_.thumbnails > 0) {
    shard->thumbnails = std::make_shared<ShardThumbnails>(config_.thumbnails, config_.empty_score,
                                                          config_.IsForegroundClass(0));
  }
  absl::MutexLock lock(&mu_);
  backlog_ += static_cast<int64_t>(shard->rows.size());
  shards_.push_back(std::move(shard));
}

void ScoringPipeline::Drop(int64_t lease_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = shards_.begin(); it != shards_.end();) {
    if ((*it)->lease.lease_id == lease_id) {
      backlog_ -= static_cast<int64_t>((*it)->rows.size() - (*it)->next);
      (*it)->dropped = true;
      it = shards_.erase(it);
    } else {
      ++it;
    }
  }
}

int64_t ScoringPipeline::Backlog() const {
  absl::MutexLock lock(&mu_);
  return backlog_;
}

bool ScoringPipeline::IdleLocked() const { return backlog_ <= 0 || failed_ || stopping_; }

bool ScoringPipeline::WaitIdle(absl::Duration limit) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &ScoringPipeline::IdleLocked), limit);
}

bool ScoringPipeline::WorkOrStopLocked() const { return stopping_ || !shards_.empty(); }

int ScoringPipeline::SpareThreads() const {
  absl::MutexLock lock(&mu_);
  if (!shards_.empty()) return 1;  // Rows still wait: every thread will have one of its own.
  int busy = 0;
  for (const Activity& a : activity_) busy += a.since != 0;
  return std::max(1, threads_count_ / std::max(1, busy));
}

void ScoringPipeline::Loop(size_t slot) {
  while (true) {
    std::shared_ptr<Shard> shard;
    v1::ManifestRow row;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ScoringPipeline::WorkOrStopLocked));
      if (stopping_) return;
      shard = shards_.front();
      row = std::move(shard->rows[shard->next++]);  // Each row is taken once.
      if (shard->next == shard->rows.size()) shards_.pop_front();
      activity_[slot] = Activity{NowUnix(), shard->lease, row.index()};
      if (clock_start_ == 0) clock_start_ = NowUnix();
    }
    std::string fatal;
    v1::ImageResult result = ScoreRow(row, shard->thumbnails.get(), &fatal);
    bool deliver = false;
    {
      absl::MutexLock lock(&mu_);
      activity_[slot].since = 0;
      if (!fatal.empty()) {
        if (failed_) continue;
        failed_ = true;
      } else if (!shard->dropped) {
        deliver = true;
        --backlog_;
        ++images_done_;
        last_result_ = NowUnix();
        if (first_result_unix_ == 0) first_result_unix_ = last_result_;
      }
    }
    if (!fatal.empty()) {
      Log("job ", shard->lease.job_id, ": ", fatal);
      on_fatal_(fatal, /*definitive=*/true);
      continue;
    }
    if (!deliver) continue;
    std::vector<v1::ImageResult> out;
    {
      absl::MutexLock lock(&mu_);
      out = HoldCalibrated(shard.get(), std::move(result));
    }
    for (v1::ImageResult& r : out) on_result_(shard->lease, std::move(r));
  }
}

std::vector<v1::ImageResult> ScoringPipeline::HoldCalibrated(Shard* shard, v1::ImageResult result) {
  std::vector<v1::ImageResult> out;
  ++shard->done;
  if (result.calibration_size() > 0) {
    AddSparseFine(result.calibration_fine(), &shard->fine);
    result.clear_calibration_fine();
    result.set_calibration_batch(shard->first_index);
    shard->held.push_back(std::move(result));
  } else {
    out.push_back(std::move(result));
  }
  if (shard->done < shard->rows.size() || shard->held.empty()) return out;
  // The shard's last row: its evaluated rows go out, the first with their fine histogram.
  v1::CalibrationFine* f = shard->held.front().mutable_calibration_fine();
  for (const v1::ImageResult& r : shard->held) f->add_covers(r.index());
  SetSparseFine(shard->fine.data(), shard->held.front().classes_size(), f);
  for (v1::ImageResult& r : shard->held) out.push_back(std::move(r));
  shard->held.clear();
  shard->fine.clear();
  return out;
}

void ScoringPipeline::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
    if (stopping_ || timed_out_) return;
    const double now = NowUnix();
    for (const Activity& a : activity_) {
      if (a.since == 0 || now - a.since <= config_.batch_timeout_seconds) continue;
      timed_out_ = true;
      const Activity stuck = a;
      mu_.Unlock();
      Log("scoring row ", stuck.index, " of job ", stuck.lease.job_id, " has run for ",
          absl::StrFormat("%.0f", now - stuck.since), " s, past the batch timeout");
      on_timeout_(stuck.lease, {stuck.index}, "scoring", config_.batch_timeout_seconds);
      mu_.Lock();
      return;
    }
  }
}

v1::WorkerStats ScoringPipeline::Stats() const {
  absl::MutexLock lock(&mu_);
  v1::WorkerStats s;
  s.set_device("cpu");
  s.set_gpu_name("cpu (scoring predictions)");
  if (volumes_ != nullptr) {  // Volume jobs: the model's device.
    const RunnerStats r = volumes_->runner_stats();
    s.set_device(r.device);
    s.set_gpu_name(r.gpu_name.empty() ? r.device : r.gpu_name);
    s.set_peak_memory_bytes(r.peak_memory_bytes);
    s.set_model_load_seconds(r.load_seconds);
  }
  s.set_batch_size(1);
  s.set_images(images_done_);
  const double elapsed = last_result_ - clock_start_;
  s.set_images_per_second(elapsed > 0 ? images_done_ / elapsed : 0.0);
  s.set_first_batch_unix(first_result_unix_);
  s.set_decode_threads(threads_count_);
  return s;
}

}  // namespace tally
