#include "server/report/live_report.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/job/job_config.h"
#include "server/report/report_writer.h"
#include "metrics/parallel_for.h"

namespace tally {

bool LiveReport::Eligible(const v1::Job& job) {
  absl::StatusOr<JobConfig> config = JobConfigFromSpec(job.spec());
  // COCO instance jobs are kept too (their evaluation orders images by id, whatever order rows came
  // in); panoptic ones are not (PQ sums each category's IoUs in the rows' order).
  if (!config.ok() || config->panoptic_job() || config->nnunet_summary) return false;
  if (AnyLesionMetric(config->metrics)) return false;
  const v1::JobSpec& spec = job.spec();
  if (spec.sample_rows() > 0 || spec.sample_percent() > 0 || spec.until_ci() > 0) return false;
  // Prediction jobs without a class count: each row may raise it (ReconcileClassesLocked).
  if (spec.model().empty() && spec.regions_size() == 0 && spec.num_classes() == 0) return false;
  return job.num_classes() > 0;
}

LiveReport::LiveReport(std::string spool_path) : spool_path_(std::move(spool_path)) {}

absl::StatusOr<std::unique_ptr<LiveReport>> LiveReport::Create(const JobRecord& record, const std::string& spool_path) {
  std::unique_ptr<LiveReport> live(new LiveReport(spool_path));
  const size_t slash = spool_path.rfind('/');
  if (slash != std::string::npos) RETURN_IF_ERROR(MakeDirs(spool_path.substr(0, slash)));
  const int parts = std::clamp(UsableCores(), 1, 8);
  for (int i = 0; i < parts; ++i) {
    auto part = std::make_unique<Part>();
    // Kept only for jobs that end with every row (Eligible): their interval is over all rows.
    ASSIGN_OR_RETURN(std::unique_ptr<ReportAccumulator> acc, ReportAccumulator::Create(record, IntervalKind::kRows));
    absl::MutexLock lock(&part->mu);
    part->acc = std::move(acc);
    live->parts_.push_back(std::move(part));
  }
  {
    absl::MutexLock lock(&live->parts_[0]->mu);
    live->csv_config_ = std::make_unique<JobConfig>(live->parts_[0]->acc->config());
  }
  live->csv_ = std::make_unique<PerImageCsv>(*live->csv_config_);  // It keeps a reference to the config.
  absl::MutexLock lock(&live->spool_mu_);
  live->spool_ = std::fopen(spool_path.c_str(), "w+b");
  if (live->spool_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot create '", spool_path, "'"));
  std::setvbuf(live->spool_, nullptr, _IOFBF, 1 << 20);
  live->csv_out_ = std::fopen((spool_path + ".csv").c_str(), "wb");
  if (live->csv_out_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot create '", spool_path, ".csv'"));
  const std::string header = live->csv_->Header();
  std::fwrite(header.data(), 1, header.size(), live->csv_out_);
  live->offset_.assign(std::max<int64_t>(0, record.job.images_total()), -1);
  live->length_.assign(live->offset_.size(), 0);
  return live;
}

LiveReport::~LiveReport() {
  absl::MutexLock lock(&spool_mu_);
  if (spool_ != nullptr) std::fclose(spool_);
  if (csv_out_ != nullptr) std::fclose(csv_out_);
  unlink(spool_path_.c_str());
  unlink((spool_path_ + ".csv").c_str());
}

void LiveReport::AddTo(Part* part, const v1::ImageResult& result, const RowNames& names) {
  if (part->acc == nullptr) return;  // Written already: rows after the end are not the report's.
  std::string* lines = &part->lines;
  std::vector<std::pair<int64_t, uint32_t>>* cut = &part->cut;
  part->acc->AddRow(result, names, 0, [&](const v1::ImageResult& r, const RowNames& n) {
    const size_t before = lines->size();
    *lines += csv_->Rows(r, n);
    cut->emplace_back(r.index(), static_cast<uint32_t>(lines->size() - before));
  });
  if (!result.error().empty()) cut->emplace_back(result.index(), 0);  // In, with no lines.
}

void LiveReport::Spool(Part* part) {
  absl::MutexLock lock(&spool_mu_);
  if (error_.ok() && !part->lines.empty() && std::fwrite(part->lines.data(), 1, part->lines.size(), spool_) != part->lines.size()) {
    error_ = absl::UnavailableError(absl::StrCat("writing '", spool_path_, "' failed"));
  }
  for (const auto& [index, length] : part->cut) {
    if (index >= 0 && index < static_cast<int64_t>(offset_.size())) {
      // A row in twice would break the report's one-row-once rule: checked again by Write.
      if (offset_[index] >= 0 && error_.ok()) {
        error_ = absl::InternalError(absl::StrCat("row ", index, " reached the kept report twice"));
      }
      offset_[index] = spool_size_;
      length_[index] = length;
    }
    spool_size_ += length;
  }
  part->lines.clear();
  part->cut.clear();
  // The rows now complete from the front of the manifest go to per_image.csv at once, so that the
  // end of the job has only the last ones to copy.
  if (error_.ok() && next_ < static_cast<int64_t>(offset_.size()) && offset_[next_] >= 0) {
    error_ = CopyRowsLocked(/*skip_gaps=*/false);
  }
}

absl::Status LiveReport::CopyRowsLocked(bool skip_gaps) {
  if (std::fflush(spool_) != 0) return absl::UnavailableError(absl::StrCat("writing '", spool_path_, "' failed"));
  const int fd = fileno(spool_);
  std::string* buffer = &copy_buffer_;  // The lambda's view of what the lock guards.
  std::FILE* out = csv_out_;
  auto copy = [&](int64_t begin, int64_t end) -> absl::Status {
    while (begin < end) {
      const int64_t chunk = std::min<int64_t>(end - begin, int64_t{4} << 20);
      buffer->resize(static_cast<size_t>(chunk));
      const ssize_t got = pread(fd, buffer->data(), buffer->size(), begin);
      if (got <= 0) return absl::UnavailableError(absl::StrCat("reading '", spool_path_, "' failed"));
      if (std::fwrite(buffer->data(), 1, static_cast<size_t>(got), out) != static_cast<size_t>(got)) {
        return absl::UnavailableError(absl::StrCat("writing '", spool_path_, ".csv' failed"));
      }
      begin += got;
    }
    return absl::OkStatus();
  };
  const int64_t n = static_cast<int64_t>(offset_.size());
  while (next_ < n) {
    if (offset_[next_] < 0) {  // Not in (yet, or ever: a job that ended early).
      if (!skip_gaps) break;
      ++next_;
      continue;
    }
    const int64_t begin = offset_[next_];
    int64_t end = begin + length_[next_];
    for (++next_; next_ < n && offset_[next_] == end; ++next_) end += length_[next_];
    RETURN_IF_ERROR(copy(begin, end));
  }
  return absl::OkStatus();
}

void LiveReport::Add(const std::vector<v1::ImageResult>& results, const std::vector<bool>& new_rows,
                     const std::vector<RowNames>& names, int64_t hint) {
  Part* part = parts_[static_cast<size_t>(hint < 0 ? -hint : hint) % parts_.size()].get();
  absl::MutexLock lock(&part->mu);
  int64_t added = 0;
  for (size_t i = 0; i < results.size() && i < new_rows.size() && i < names.size(); ++i) {
    if (!new_rows[i]) continue;
    AddTo(part, results[i], names[i]);
    ++added;
  }
  Spool(part);
  absl::MutexLock spool_lock(&spool_mu_);
  rows_ += added;
}

void LiveReport::AddOne(const v1::ImageResult& result, const RowNames& names) {
  Part* part = parts_[0].get();
  absl::MutexLock lock(&part->mu);
  AddTo(part, result, names);
  if (part->lines.size() > (1 << 20)) Spool(part);
  absl::MutexLock spool_lock(&spool_mu_);
  ++rows_;
}

int64_t LiveReport::rows() const {
  absl::MutexLock lock(&spool_mu_);
  return rows_;
}

absl::Status LiveReport::Write(JobStore* store, const JobRecord& record, const std::string& dir,
                               ReportOutcome* outcome) {
  RETURN_IF_ERROR(MakeDirs(dir));
  for (auto& part : parts_) {
    absl::MutexLock lock(&part->mu);
    Spool(part.get());
  }
  // per_image.csv: the rest of the spool's lines in index order (the front went as it completed).
  {
    absl::MutexLock lock(&spool_mu_);
    RETURN_IF_ERROR(error_);
    // Every row added has its place in the spool (else the caller builds the report from the database).
    const int64_t placed = std::count_if(offset_.begin(), offset_.end(), [](int64_t o) { return o >= 0; });
    if (placed != rows_) {
      return absl::InternalError(absl::StrCat("the kept report placed ", placed, " rows of ", rows_));
    }
    RETURN_IF_ERROR(CopyRowsLocked(/*skip_gaps=*/true));
    const std::string written = spool_path_ + ".csv";
    const bool flushed = std::fflush(csv_out_) == 0;
    std::fclose(csv_out_);
    csv_out_ = nullptr;
    if (!flushed) return absl::UnavailableError(absl::StrCat("writing '", written, "' failed"));
    if (std::rename(written.c_str(), (dir + "/per_image.csv").c_str()) != 0) {
      // Another file system: copied instead.
      ASSIGN_OR_RETURN(std::string text, ReadFileToString(written));
      RETURN_IF_ERROR(WriteFileAtomically(dir + "/per_image.csv", text));
      unlink(written.c_str());
    }
  }
  std::vector<std::unique_ptr<ReportAccumulator>> accumulators;
  for (auto& part : parts_) {
    absl::MutexLock lock(&part->mu);
    accumulators.push_back(std::move(part->acc));
  }
  for (size_t k = 1; k < accumulators.size(); ++k) accumulators[0]->Merge(accumulators[k].get());
  absl::StatusOr<ReportData> d = accumulators[0]->Finish(store, {&record}, record);
  RETURN_IF_ERROR(d.status());
  return WriteReportFiles(*d, dir, outcome);
}

}  // namespace tally
