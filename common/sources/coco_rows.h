// Rows from COCO files (docs/instances.md): an instance job's rows are the annotation file's images,
// a panoptic job's the reference file's annotations, in the file's order. Reading them also
// completes the job's spec: the categories and the files' hashes go into it, so the report and
// every worker read the same set, and what cannot be scored (annotations or results naming an image
// the file does not list) becomes a warning of the job. A results file's detections are read here
// once and travel with their image's row (no worker parses the whole file).
#ifndef TALLY_COMMON_SOURCES_COCO_ROWS_H_
#define TALLY_COMMON_SOURCES_COCO_ROWS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security/data_roots.h"
#include "common/sources/row_source.h"
#include "proto/tally.pb.h"

namespace tally {

// Rows already in memory, given in order.
class RowsInMemory : public RowSource {
 public:
  RowsInMemory(std::string path, std::vector<ManifestRow> rows) : path_(std::move(path)), rows_(std::move(rows)) {}
  absl::Status NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) override;
  const std::string& path() const override { return path_; }
  int64_t rows_read() const override { return static_cast<int64_t>(next_); }
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }

 private:
  std::string path_;
  std::vector<ManifestRow> rows_;
  size_t next_ = 0;
};

// An instance job (spec.coco(), and spec.coco_results() when detections are on disk): the rows, and
// the spec completed (coco_sha256, categories, class count, conventions, warnings, the results' hash).
// More than `max_rows` images, an image or category listed twice, or a category id outside
// 1..kMaxClasses-1 fail. `keep_columns`: the images' fields become the rows' columns
// (CocoImageColumns, named in spec.manifest_columns).
absl::StatusOr<std::unique_ptr<RowsInMemory>> CocoImageRows(int64_t max_rows, const ClientFileLimits& limits,
                                                            v1::JobSpec* spec, bool keep_columns = false);
// A panoptic job (spec.coco_panoptic() against spec.panoptic_predictions()): a row per reference
// annotation; one without a prediction, or an image annotated twice, is a row that fails saying so.
absl::StatusOr<std::unique_ptr<RowsInMemory>> PanopticImageRows(int64_t max_rows, const ClientFileLimits& limits,
                                                                v1::JobSpec* spec);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_COCO_ROWS_H_
