// A job's report kept up to date as its results arrive, so that the end of a job only
// writes files. Every newly committed row goes, in whatever order the workers send it, into one of
// a few ReportAccumulators (order-free and mergeable: report_data.h; the concurrent ReportResults
// calls spread over them) and its per_image.csv lines into a spool file, an append-only file of
// the formatted lines with their offsets kept in memory by index; the rows complete from the front
// of the manifest are copied on into per_image.csv (a file beside the spool) as they complete. At the
// end the accumulators are merged and the rest of per_image.csv is copied from the spool in index
// order: no second pass over the database. The files equal the batch path's (WriteReports from the database) to the byte; tests
// hold them to that in any arrival order and after a restart (tallyd feeds a fresh LiveReport
// from the database when it resumes a job).
//
// Jobs whose report needs the rows in index order keep the batch path (Eligible() is false):
// instance and panoptic jobs (COCO's evaluation and PQ accumulate per image in order), jobs
// writing lesions.csv or nnU-Net's summary.json, prediction jobs without a fixed class count (the
// count grows with the rows), and sampled jobs (--sample, --until-ci: their interval is decided at
// the end). Memory: 12 bytes a manifest row for the spool's index, plus each surface metric's values
// (8 bytes a row and class), plus the accumulators (the Dice interval's values: 16 bytes a row and
// class, at most about kMaxIntervalRows rows, metrics/bounded_mean.h).
#ifndef TALLY_SERVER_REPORT_LIVE_REPORT_H_
#define TALLY_SERVER_REPORT_LIVE_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"
#include "server/report/report_data.h"
#include "server/report/report_formats.h"

namespace tally {

class LiveReport {
 public:
  // Whether `job`'s report can be kept as rows arrive (see above).
  static bool Eligible(const v1::Job& job);
  // `spool_path`: the spool file (created, truncated); removed with the LiveReport.
  static absl::StatusOr<std::unique_ptr<LiveReport>> Create(const JobRecord& record, const std::string& spool_path);
  ~LiveReport();
  LiveReport(const LiveReport&) = delete;
  LiveReport& operator=(const LiveReport&) = delete;

  // The newly committed rows of one commit: results[i] (as stored) with names[i] where new_rows[i].
  // Thread-safe; `hint` (the shard) picks the accumulator, so concurrent commits run in parallel.
  void Add(const std::vector<v1::ImageResult>& results, const std::vector<bool>& new_rows,
           const std::vector<RowNames>& names, int64_t hint);
  // One row (Resume's replay of the database).
  void AddOne(const v1::ImageResult& result, const RowNames& names);
  // Rows added so far (evaluated and failed).
  int64_t rows() const;
  // Writes report.json, per_image.csv, summary.md and report.html into `dir` as WriteReports does.
  // Once, when every row is in: rows added afterwards are ignored.
  absl::Status Write(JobStore* store, const JobRecord& record, const std::string& dir, ReportOutcome* outcome);

 private:
  explicit LiveReport(std::string spool_path);
  struct Part {
    absl::Mutex mu;
    std::unique_ptr<ReportAccumulator> acc ABSL_GUARDED_BY(mu);
    std::string lines ABSL_GUARDED_BY(mu);  // Scratch: one commit's formatted lines.
    std::vector<std::pair<int64_t, uint32_t>> cut ABSL_GUARDED_BY(mu);  // (index, length) of each.
  };
  void AddTo(Part* part, const v1::ImageResult& result, const RowNames& names) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part->mu);
  // Appends a part's formatted lines to the spool, then copies the rows complete from next_ on.
  void Spool(Part* part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part->mu);
  // Copies rows from next_ on to csv_out_ in index order: up to the first row not in, or (at the
  // end, `skip_gaps`) every row in.
  absl::Status CopyRowsLocked(bool skip_gaps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(spool_mu_);

  const std::string spool_path_;
  std::unique_ptr<JobConfig> csv_config_;
  std::unique_ptr<PerImageCsv> csv_;
  std::vector<std::unique_ptr<Part>> parts_;
  mutable absl::Mutex spool_mu_;
  std::FILE* spool_ ABSL_GUARDED_BY(spool_mu_) = nullptr;
  int64_t spool_size_ ABSL_GUARDED_BY(spool_mu_) = 0;
  std::FILE* csv_out_ ABSL_GUARDED_BY(spool_mu_) = nullptr;  // per_image.csv as it grows (SPOOL.csv).
  int64_t next_ ABSL_GUARDED_BY(spool_mu_) = 0;              // First row not yet in csv_out_.
  std::string copy_buffer_ ABSL_GUARDED_BY(spool_mu_);
  // By index: the row's lines in the spool (a failed row: none, length 0); -1: not in.
  std::vector<int64_t> offset_ ABSL_GUARDED_BY(spool_mu_);
  std::vector<uint32_t> length_ ABSL_GUARDED_BY(spool_mu_);
  int64_t rows_ ABSL_GUARDED_BY(spool_mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(spool_mu_);  // A failed spool write: Write() refuses (the batch path follows).
};

}  // namespace tally

#endif  // TALLY_SERVER_REPORT_LIVE_REPORT_H_
