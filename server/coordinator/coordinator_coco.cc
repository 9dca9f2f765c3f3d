// Coordinator: COCO instance and panoptic jobs at submission (docs/instances.md). The rows come from
// the files (common/sources/coco_rows.h), which also complete the stored spec: categories, hashes,
// warnings, and a results file's detections carried by their image's row.
#include <algorithm>

#include "base/status_macros.h"
#include "common/sources/coco_rows.h"
#include "server/coordinator/coordinator.h"

namespace tally {
namespace {

constexpr size_t kCocoSubmitBatch = 10000;

}  // namespace

absl::StatusOr<JobRecord> Coordinator::StorePanopticImages(const v1::JobSpec& in, const std::string& job_id) {
  v1::JobSpec spec = in;
  spec.set_max_json_file_bytes(options_.max_json_file_bytes);
  ASSIGN_OR_RETURN(std::unique_ptr<RowsInMemory> rows,
                   PanopticImageRows(options_.max_manifest_rows, SubmissionLimits(), &spec));
  const int64_t count = rows->size();
  RETURN_IF_ERROR(StoreRows(job_id, rows.get()));
  return QueuedRecord(spec, job_id, count);  // No model: validated.
}

absl::StatusOr<JobRecord> Coordinator::StoreCocoImages(const v1::JobSpec& in, const std::string& job_id) {
  v1::JobSpec spec = in;
  spec.set_max_json_file_bytes(options_.max_json_file_bytes);
  ASSIGN_OR_RETURN(std::unique_ptr<RowsInMemory> rows, CocoImageRows(options_.max_manifest_rows, SubmissionLimits(), &spec,
                                                                          WantsColumns(in)));
  const int64_t count = rows->size();
  RETURN_IF_ERROR(StoreRows(job_id, rows.get()));
  return QueuedRecord(spec, job_id, count);
}

absl::Status Coordinator::StoreRows(const std::string& job_id, RowSource* rows) {
  absl::Status s = store_->BeginSubmission(job_id);
  std::vector<ManifestRow> batch;
  while (s.ok()) {
    s = rows->NextBatch(kCocoSubmitBatch, &batch);
    if (!s.ok() || batch.empty()) break;
    s = store_->InsertManifestRows(job_id, batch);
  }
  return s.ok() ? s : DiscardSubmission(job_id, s);
}

}  // namespace tally
