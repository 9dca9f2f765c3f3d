// What a worker feeds its leased rows to: the model pipeline (worker/pipeline/pipeline.h) for jobs with a
// model, or the scoring pipeline (worker/scoring/scoring.h) for prediction jobs. Both deliver one result per
// row through their callbacks and keep the same guarantees: every submitted row of a lease not
// dropped gets exactly one result (metrics or a reason).
#ifndef TALLY_WORKER_INTERFACES_ROW_EVALUATOR_H_
#define TALLY_WORKER_INTERFACES_ROW_EVALUATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "proto/tally.pb.h"

namespace tally {

struct LeaseKey {
  std::string job_id;
  int64_t shard_id = 0;
  int64_t lease_id = 0;
};

class RowEvaluator {
 public:
  virtual ~RowEvaluator() = default;
  // Queues the rows of one leased shard. Never blocks on evaluation.
  virtual void Submit(const LeaseKey& lease, std::vector<v1::ManifestRow> rows) = 0;
  // Stops work for a lease (revoked, job cancelled): its remaining rows produce no results.
  virtual void Drop(int64_t lease_id) = 0;
  // Rows accepted and not yet evaluated (delivered or held back) or dropped.
  virtual int64_t Backlog() const = 0;
  // Results are being held back (a layout trial beside the evaluation, worker/pipeline/pipeline.h): the
  // leases they belong to stay open meanwhile, and need not count against the worker's lease cap.
  virtual bool HoldingResults() const { return false; }
  // Rows evaluated whose results are held back now.
  virtual int64_t HeldRows() const { return 0; }
  // The worker is idle: give back buffers that an outlier row grew (its last batch may have
  // staged in a buffer no later batch reused).
  virtual void ReleaseIdleBuffers() {}
  // Blocks until the backlog is empty or the evaluator failed, at most `limit`; whether it is idle.
  virtual bool WaitIdle(absl::Duration limit) = 0;
  // Rows evaluated together (the leasing loop keeps a few of these queued).
  virtual int batch_size() const = 0;
  virtual v1::WorkerStats Stats() const = 0;
};

}  // namespace tally

#endif  // TALLY_WORKER_INTERFACES_ROW_EVALUATOR_H_
