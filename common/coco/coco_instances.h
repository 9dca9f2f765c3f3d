// A COCO job's instances as the workers read them (docs/instances.md "Instances"): the annotation file and,
// for jobs scoring detections on disk, the results file, loaded once per job and indexed by image.
// Per row it gives the image's references and detections as masks, evaluates them per category
// (metrics/coco_eval.h: the records the coordinator accumulates), paints them as label maps for the
// semantic metrics, and unites the annotations a referring row names.
//
// Errors are the row's, naming what is wrong: an annotation (by id) or a result (by its 1-based
// position in the results file, as pycocotools numbers them) whose segmentation cannot be decoded
// or whose category the file does not list; an image id the file does not list.
//
// Thread-safe after Load (read only).
#ifndef TALLY_COMMON_COCO_COCO_INSTANCES_H_
#define TALLY_COMMON_COCO_COCO_INSTANCES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/coco/coco_json.h"
#include "common/coco/coco_masks.h"
#include "common/formats/image_formats.h"
#include "metrics/coco_rle.h"
#include "metrics/panoptic.h"
#include "proto/tally.pb.h"

namespace tally {


struct CocoImageInstances {
  int64_t image_id = 0;
  int64_t height = 0, width = 0;
  std::vector<CocoInstance> references;  // In the file's order.
  std::vector<CocoInstance> detections;  // In the file's order (or the model's).
};

class CocoSource {
 public:
  // `results` may be empty (a model gives the detections). Both are read with `limits`.
  static absl::StatusOr<std::shared_ptr<const CocoSource>> Load(const std::string& annotations,
                                                                const std::string& results,
                                                                const ClientFileLimits& limits = {});

  // The image's references and, from the results file, detections, decoded. `max_bytes` (>= 0):
  // what rasterising one annotation's polygons may take; one that would need more fails the row,
  // named, before it is walked. `row_detections` (a serialized v1::CocoDetections, a row's
  // coco_detections): the image's detections when the coordinator sent them with the row.
  absl::Status Instances(int64_t image_id, CocoImageInstances* out, int64_t max_bytes = -1,
                         const std::string& row_detections = "") const;
  // The union of annotations `ids` (all of one image) as a mask of that image's size; no ids: an
  // empty mask of `height` x `width`.
  absl::StatusOr<Rle> AnnotationUnion(const std::vector<int64_t>& ids, int64_t height, int64_t width,
                                      int64_t max_bytes = -1) const;
  bool HasCategory(int64_t id) const;
  const CocoImageInfo* Image(int64_t id) const;

 private:
  CocoDataset gt_;
  std::vector<CocoAnnotation> results_;
  std::unordered_map<int64_t, size_t> image_index_;
  std::unordered_map<int64_t, size_t> annotation_index_;
  std::unordered_map<int64_t, std::vector<size_t>> gt_by_image_, results_by_image_;
  std::unordered_map<int64_t, bool> categories_;
};

// One image's results as a row carries them (v1::CocoDetections, serialized), and back.
std::string EncodeCocoDetections(const std::vector<const CocoAnnotation*>& detections);
// Appends one detection to `out` as EncodeCocoDetections would: detections appended one by one
// (in the file's order) are their list's encoding.
void AppendCocoDetection(const CocoAnnotation& a, std::string* out);
absl::StatusOr<std::vector<CocoAnnotation>> DecodeCocoDetections(const std::string& bytes);

// A panoptic job's reference and predicted annotations (COCO panoptic JSON), loaded once per job.
// Thread-safe after Load.
class PanopticSource {
 public:
  static absl::StatusOr<std::shared_ptr<const PanopticSource>> Load(const std::string& reference,
                                                                    const std::string& predictions,
                                                                    const ClientFileLimits& limits = {});
  // The row's PNGs (mask_path: reference, prediction_path: prediction; read and decoded by the
  // caller) evaluated (metrics/panoptic.h) into `result`, and painted as label maps of category ids
  // (void 0) for the semantic metrics. Errors name the file, image or segment.
  absl::Status Evaluate(const v1::ManifestRow& row, const RgbImage& reference_png, const RgbImage& prediction_png,
                        LabelMap* reference, LabelMap* prediction, v1::ImageResult* result) const;

 private:
  CocoDataset reference_, predictions_;
  std::unordered_map<int64_t, const CocoPanopticAnnotation*> by_image_[2];  // Reference, predictions.
  std::vector<PanopticCategory> categories_;
};

// The row's records, one per category with a reference or a detection, by category id. With
// `outcomes` (height x width, row-major), also a picture of the matching at IoU 0.5 for the report
// thumbnails (common/formats/thumbnail.h PixelOutcome): matched detections and references kOutcomeTp,
// references left unmatched kOutcomeFn, false detections kOutcomeFp (painted in that order).
void EvaluateCocoInstances(const CocoImageInstances& image,
                           google::protobuf::RepeatedPtrField<v1::CocoImageRecord>* records,
                           std::vector<uint8_t>* outcomes = nullptr);
// The instance F1 at IoU 0.5 of a row's records: 2 TP / (2 TP + FP + FN) over its categories; NaN
// when it has neither references nor detections that count.
double RowInstanceF1(const v1::ImageResult& result);
double InstanceF1(int64_t tp, int64_t fp, int64_t fn);  // The same from the summed counts.

// Report thumbnails of instance jobs ride on class 0, which is no category (categories are >= 1):
// the rows of lowest instance F1, each showing its matching.
inline constexpr int kInstanceThumbnailClass = 0;
// The image (`rgb`: height x width x 3, or null) beside the matching at IoU 0.5 (matched green,
// missed blue, false red), as JPEG bytes (common/formats/thumbnail.h RenderThumbnail).
absl::StatusOr<std::string> RenderInstanceThumbnail(const CocoImageInstances& image, const uint8_t* rgb);


// A COCO row's reference label map for an image of `height` x `width`: a row of the file's images
// gets its references painted (PaintCocoLabels), a referring row (coco_ann_ids) the union of its
// annotations as label 1. Errors: the sizes disagree, or an annotation is missing or malformed.
// The caller applies the mask conventions (PrepareMask).
absl::Status CocoReferenceLabels(const CocoSource& source, const v1::ManifestRow& row, int height, int width,
                                 LabelMap* out, int64_t max_bytes = -1);

}  // namespace tally

#endif  // TALLY_COMMON_COCO_COCO_INSTANCES_H_
