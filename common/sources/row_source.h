// Where a job's rows come from (docs/data.md "Where your data can be"): every source (a manifest, two
// folders paired, tar shards, a COCO or panoptic file's images) gives its rows as ManifestRow
// batches through one interface, so the coordinator stores, checks and orders them alike.
// Sources: manifest.h (CSV), folder_pairs.h (folders), tar_shards.h (WebDataset shards), coco_rows.h
// (COCO images); row_files.h reads a row's files wherever its source put them.
#ifndef TALLY_COMMON_SOURCES_ROW_SOURCE_H_
#define TALLY_COMMON_SOURCES_ROW_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tally {

struct ManifestRow {
  int64_t index = 0;       // 0-based data row (the header is not a row).
  int64_t line = 0;        // 1-based line of the file where the row starts, for messages.
  std::string id;          // The `id` column, or else the stem of the image (or the mask) file.
  std::string image;       // As written in the manifest.
  std::string mask;        // As written in the manifest.
  std::string image_path;  // Resolved against the manifest's folder.
  std::string mask_path;
  std::string prediction;       // As written; empty without a `prediction` column.
  std::string prediction_path;
  std::string error;       // Non-empty when the row itself is malformed; the row fails with it.
  std::vector<std::string> columns;  // Values of the reader's extra_columns(), in order.
  // COCO jobs (docs/instances.md): the row's image in the annotation file (rows made from its
  // `images`), or the annotations whose union is the reference (a `coco_ann_ids` column: ids
  // joined by ';', empty = no target).
  int64_t coco_image_id = 0;
  bool has_coco_image = false;
  std::vector<int64_t> coco_ann_ids;
  bool has_coco_ann_ids = false;
  // COCO results jobs: the image's detections, a serialized v1::CocoDetections (common/coco/coco_instances.h).
  std::string coco_detections;
};

// A job's rows, in batches, in the order the source gives them (the row's index).
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Appends up to `max_rows` rows to `rows` (cleared first); an empty batch means the end.
  virtual absl::Status NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) = 0;
  virtual const std::string& path() const = 0;  // For messages.
  virtual int64_t rows_read() const = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_ROW_SOURCE_H_
