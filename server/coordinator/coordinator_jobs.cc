// Coordinator: the life of a job: submission (the manifest into the database), snapshots and
// listings, cancellation and deletion, retention, the end of a job and its reports (finalisers,
// merges, comparisons).
#include "server/coordinator/coordinator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <iterator>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "common/job/job_config.h"
#include "common/formats/decode.h"
#include "base/file_util.h"
#include "base/log.h"
#include "common/sources/manifest.h"
#include "common/formats/volume.h"
#include "metrics/overlap.h"
#include "common/job/rpc.h"
#include "common/security/sha256.h"
#include "common/formats/thumbnail.h"
#include "server/store/sharding.h"
#include "base/status_macros.h"
#include "common/job/job_spec_validation.h"
#include "server/report/compare.h"
#include "server/coordinator/live_estimates.h"
#include "server/report/report_data.h"
#include "server/report/report_writer.h"

namespace tally {
namespace {

// "j20261125-151454-f7626a": the time of submission (UTC) and random digits.
std::string NewJobId(double now, const std::string& random_hex) {
  const std::time_t secs = static_cast<std::time_t>(now);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return absl::StrCat("j", stamp, "-", random_hex);
}

// Rows read from the manifest and inserted per transaction while a job is submitted.
constexpr size_t kSubmitBatchRows = 10240;  // Whole blocks of the store's 256 rows.

// A job summary for listings: the spec keeps only what identifies the job.
v1::Job Summary(v1::Job job) {
  job.clear_summary();  // The live estimates stay: the dashboard's job list shows them.
  v1::JobSpec small;
  small.set_model(job.spec().model());
  small.set_manifest(job.spec().manifest());
  small.set_name(job.spec().name());
  *small.mutable_labels() = job.spec().labels();
  *job.mutable_spec() = std::move(small);
  return job;
}

// A manifest's coco_ann_ids column and --coco go together (docs/instances.md "Instances": referring rows).
absl::Status CheckCocoColumn(const ManifestReader& reader, const v1::JobSpec& spec) {
  if (reader.has_coco_ann_ids() == !spec.coco().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      spec.coco().empty()
          ? absl::StrCat("manifest '", reader.path(), "' has a coco_ann_ids column: give the annotation file (--coco)")
          : absl::StrCat("--coco with manifest '", reader.path(),
                         "': the manifest needs a coco_ann_ids column (the annotations whose union is each row's "
                         "reference), or leave --manifest out to evaluate the file's images as instances"));
}

}  // namespace

v1::Job Coordinator::Snapshot(const JobEntry& entry, double now) const {
  v1::Job job = entry.record.job;
  const int64_t done = job.images_evaluated() + job.images_failed();
  double rate = 0;
  if (job.started_unix() > 0) {
    const double end = IsTerminal(job.state()) && job.finished_unix() > 0 ? job.finished_unix() : now;
    const double elapsed = end - job.started_unix();
    if (elapsed > 0) rate = done / elapsed;
  }
  job.set_images_per_second(rate);
  const int64_t planned = IsTerminal(job.state()) ? done : entry.planned;
  job.set_images_planned(planned);
  job.set_sampled(SampledNote(job, planned));
  FillLive(entry, &job);
  const int64_t remaining = std::max<int64_t>(0, planned - done);
  job.set_eta_seconds(IsTerminal(job.state()) ? 0 : (rate > 0 ? remaining / rate : -1));
  std::set<std::string> active;
  for (const Shard& s : entry.shards) {
    if (s.phase == ShardPhase::kLeased && !s.worker_id.empty()) active.insert(s.worker_id);
  }
  job.set_workers_active(static_cast<int32_t>(active.size()));
  if (!IsTerminal(job.state())) {
    int64_t held = 0;
    for (const std::string& id : active) {
      auto w = workers_.find(id);
      if (w != workers_.end() && w->second.gauges.job_id() == job.job_id()) held += w->second.gauges.images_held();
    }
    job.set_images_held(held);
  }
  if (!IsTerminal(job.state()) && !storage_error_.empty()) {
    job.set_stalled(absl::StrCat("stalled: ", storage_error_));
  }
  FillScheduleLocked(entry, &job);
  return job;
}

// Streams the manifest into the database in bounded batches; the job is not visible until its
// shards are stored too. On any error, the rows stored so far are deleted again.
absl::StatusOr<int64_t> Coordinator::NameDuplicates(const std::string& job_id, DuplicateIds* duplicates,
                                                    std::string* message) {
  std::vector<DuplicateIds::Group> groups;
  int64_t ids = 0;
  const int64_t repeated = duplicates->Finish(3, &groups, &ids);
  if (repeated == 0) return 0;
  std::vector<std::pair<std::string, std::vector<int64_t>>> named;
  for (const DuplicateIds::Group& g : groups) {
    // The ids were compared by hash: the rows read back name them (and rule out a collision).
    ASSIGN_OR_RETURN(std::vector<ManifestRow> first, store_->ReadRows(job_id, g.rows[0].first, g.rows[0].first + 1));
    ASSIGN_OR_RETURN(std::vector<ManifestRow> second, store_->ReadRows(job_id, g.rows[1].first, g.rows[1].first + 1));
    if (first.empty() || second.empty() || first[0].id != second[0].id) continue;
    std::vector<int64_t> lines;
    for (const auto& [index, line] : g.rows) lines.push_back(line);
    named.emplace_back(first[0].id, std::move(lines));
  }
  *message = DuplicateIdsMessage(repeated, ids, named);
  return repeated;
}

ClientFileLimits Coordinator::SubmissionLimits() const {
  ClientFileLimits limits;
  limits.max_bytes = options_.max_json_file_bytes;
  limits.deadline = absl::Now() + absl::Seconds(options_.submit_read_seconds);
  return limits;
}

absl::Status Coordinator::StreamManifestRows(RowSource* reader, const std::string& job_id, bool blocks,
                                            DuplicateIds* duplicates, std::optional<bool>* volumes,
                                            absl::Time deadline, const char* what) {
  // Parsing and the rest overlap: this thread parses the next batch while another notes the last
  // one's ids and inserts it (one transaction a batch: JobStore::InsertManifestRows). One batch in
  // flight at a time, so `duplicates` and `volumes` are never touched by two threads at once.
  std::vector<ManifestRow> batch;
  std::optional<std::future<absl::Status>> inserting;
  std::vector<ManifestRow> in_flight;
  absl::Status parsed;
  while (true) {
    if (absl::Now() > deadline) {
      parsed = absl::DeadlineExceededError(absl::StrCat(
          what, " '", reader->path(), "': not read within ", options_.submit_read_seconds, " s (",
          reader->rows_read(), " rows read by then; tallyd --submit-read-timeout)"));
      break;
    }
    parsed = reader->NextBatch(kSubmitBatchRows, &batch);
    if (!parsed.ok() || batch.empty()) break;
    if (inserting.has_value()) RETURN_IF_ERROR(inserting->get());
    in_flight.swap(batch);
    inserting = std::async(std::launch::async, [&] {
      for (const ManifestRow& row : in_flight) {
        duplicates->Add(row.id, row.index, row.line);
        if (!volumes->has_value() && !row.image.empty()) *volumes = IsNiftiPath(VolumeChannelFiles(row.image)[0]);
      }
      return store_->InsertManifestRows(job_id, in_flight, blocks);
    });
  }
  if (inserting.has_value()) RETURN_IF_ERROR(inserting->get());
  return parsed;
}

namespace {
// Rows that fail as they are (a folder file whose name no manifest holds: PairedFolders::failed),
// stored after the manifest's from `first_index` on.
absl::Status AppendFailedRows(JobStore* store, const std::string& job_id, int64_t first_index, bool blocks,
                              std::vector<ManifestRow>* rows, DuplicateIds* duplicates) {
  if (rows->empty()) return absl::OkStatus();
  for (size_t i = 0; i < rows->size(); ++i) {
    ManifestRow& row = (*rows)[i];
    row.index = first_index + static_cast<int64_t>(i);
    duplicates->Add(row.id, row.index, row.line);
  }
  return store->InsertManifestRows(job_id, *rows, blocks);
}

// A Python model: the files its options name, so workers can check their copies.
void HashModelOptions(v1::JobSpec* spec) {
  if (!ParseModelRef(spec->model()).python) return;
  for (const auto& [key, value] : spec->model_options()) {
    struct stat st;
    if (value.empty() || value[0] != '/' || stat(value.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (std::string hash = Sha256FileHex(value); !hash.empty()) (*spec->mutable_model_option_sha256())[key] = hash;
  }
}
}  // namespace

bool WantsColumns(const v1::JobSpec& spec) {
  if (spec.find_slices()) return true;
  // Calibration of predictions: the rows' probability maps are a column (docs/metrics.md "Calibration").
  if (spec.model().empty() && WantsCalibration({spec.metrics().begin(), spec.metrics().end()})) return true;
  return std::any_of(spec.group_by().begin(), spec.group_by().end(),
                     [](const std::string& g) { return !absl::StartsWith(g, "derived:") && !absl::StartsWith(g, "dicom:"); });
}

absl::Status CheckGroupColumns(const v1::JobSpec& spec) {
  const auto& kept = spec.manifest_columns();
  if (spec.model().empty() && WantsCalibration({spec.metrics().begin(), spec.metrics().end()}) &&
      std::find(kept.begin(), kept.end(), kProbabilitiesColumn) == kept.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics calibration: '", spec.manifest(), "' has no '", kProbabilitiesColumn, "' column (each row's ",
        "probability map: a 16-bit grayscale PNG of class 1's probability times 65535)"));
  }
  absl::StatusOr<std::vector<GroupBy>> groups = ParseGroupBy({spec.group_by().begin(), spec.group_by().end()});
  if (!groups.ok()) return groups.status();
  for (const GroupBy& g : *groups) {
    if (g.column.empty()) continue;
    if (std::find(kept.begin(), kept.end(), g.column) != kept.end()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--group-by '", g.text, "': '", spec.manifest(), "' has no column '", g.column, "'",
        kept.empty() ? std::string(" (it has no columns besides the rows' files and ids)")
                     : absl::StrCat(" (its other columns: ", absl::StrJoin(kept, ", "), ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> Coordinator::StoreManifest(const v1::JobSpec& spec, const std::string& job_id,
                                                     const std::string* folder_text,
                                                     std::vector<ManifestRow>* failed_rows) {
  if (spec.manifest().empty() && !spec.coco().empty()) return StoreCocoImages(spec, job_id);
  if (spec.manifest().empty() && !spec.coco_panoptic().empty()) return StorePanopticImages(spec, job_id);
  if (spec.manifest().empty() && spec.shards_size() > 0) return StoreShards(spec, job_id);
  if (spec.manifest().empty() && !spec.images_dir().empty()) return StoreFolders(spec, job_id);
  ManifestLimits limits;
  limits.max_rows = options_.max_manifest_rows;
  ASSIGN_OR_RETURN(std::unique_ptr<ManifestReader> reader,
                   folder_text != nullptr ? ManifestReader::FromText(*folder_text, "/", spec.manifest(), limits)
                                          : ManifestReader::Open(spec.manifest(), limits));
  RETURN_IF_ERROR(CheckCocoColumn(*reader, spec));
  if (spec.model().empty() && !reader->has_prediction()) {
    return absl::InvalidArgumentError(absl::StrCat("no model given, and manifest '", reader->path(),
                                                   "' has no 'prediction' column to score instead"));
  }
  // Only Python models read the other columns (prompts, ...), workers a TIFF's 'page' and reports
  // their groups and slices: other jobs do not store them.
  const bool keep_columns = ParseModelRef(spec.model()).python || WantsColumns(spec) ||
                            std::any_of(reader->extra_columns().begin(), reader->extra_columns().end(),
                                        [](const std::string& c) { return absl::AsciiStrToLower(c) == "page"; });
  if (keep_columns) reader->KeepExtraColumns();
  RETURN_IF_ERROR(store_->BeginSubmission(job_id));
  DuplicateIds duplicates;
  int64_t duplicate_rows = 0;
  std::string duplicate_message;
  std::optional<bool> volumes;  // Whether the first row's image is a NIfTI volume (volume jobs).
  // The manifest's SHA-256 (the report names the file it scored) while the rows stream in.
  std::string manifest_sha256;
  std::thread hash([&] {
    manifest_sha256 = folder_text != nullptr ? Sha256Hex(*folder_text) : Sha256FileHex(reader->path());
  });
  auto stream = [&]() -> absl::Status {
    // Rows in blocks unless the job reads them scattered (--order random).
    RETURN_IF_ERROR(StreamManifestRows(reader.get(), job_id, !spec.random_order(), &duplicates, &volumes,
                                       SubmissionLimits().deadline));
    if (failed_rows != nullptr) {
      RETURN_IF_ERROR(AppendFailedRows(store_.get(), job_id, reader->rows_read(), !spec.random_order(), failed_rows,
                                       &duplicates));
    }
    ASSIGN_OR_RETURN(duplicate_rows, NameDuplicates(job_id, &duplicates, &duplicate_message));
    if (duplicate_rows > 0 && !spec.save_predictions().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest '", reader->path(), "': --save-predictions writes each ",
                                                     "prediction as <id>.png, and ", duplicate_message,
                                                     "; give every row an id of its own"));
    }
    return absl::OkStatus();
  };
  absl::Status streamed = stream();
  hash.join();
  if (!streamed.ok()) return DiscardSubmission(job_id, streamed);
  v1::JobSpec queued = spec;
  if (volumes.value_or(false) && !spec.model().empty()) {
    // A volume job: one volume at a time, so batches never group rows (any shard size is exact).
    queued.set_volume_inputs(true);
    queued.set_batch_alignment(1);
  } else if (spec.sliding_window_size() > 0 || spec.keep_dtype()) {
    return DiscardSubmission(job_id, absl::InvalidArgumentError(absl::StrCat(
        "--sliding-window and --keep-dtype are for volume jobs, but the images of manifest '", reader->path(),
        "' are not NIfTI volumes (.nii, .nii.gz; channels joined by ';')")));
  }
  JobRecord rec = QueuedRecord(queued, job_id,
                               reader->rows_read() + (failed_rows != nullptr ? static_cast<int64_t>(failed_rows->size()) : 0));
  rec.job.mutable_spec()->set_manifest(reader->path());
  rec.job.mutable_spec()->set_manifest_sha256(manifest_sha256);
  if (!spec.coco().empty()) {  // A referring set: workers read the COCO file with the same limit.
    rec.job.mutable_spec()->set_coco_sha256(Sha256FileHex(spec.coco()));
    rec.job.mutable_spec()->set_max_json_file_bytes(options_.max_json_file_bytes);
  }
  HashModelOptions(rec.job.mutable_spec());
  if (keep_columns) {
    for (const std::string& c : reader->extra_columns()) rec.job.mutable_spec()->add_manifest_columns(c);
  }
  if (duplicate_rows > 0) {
    rec.job.mutable_spec()->set_duplicate_id_rows(duplicate_rows);
    rec.job.mutable_spec()->add_manifest_warnings(
        absl::StrCat(duplicate_message, "; per_image.csv then holds one id for several images, and tally compare and ",
                     "tally merge, which join rows by id, refuse the job"));
  }
  return rec;
}

absl::Status Coordinator::DiscardSubmission(const std::string& job_id, absl::Status why) {
  absl::Status cleanup = store_->DeleteJob(job_id);
  if (!cleanup.ok()) Log("removing the rows of the refused submission ", job_id, " failed: ", cleanup.ToString());
  return why;
}

JobRecord Coordinator::QueuedRecord(const v1::JobSpec& spec, const std::string& job_id, int64_t rows) const {
  JobRecord rec;
  rec.job.set_job_id(job_id);
  *rec.job.mutable_spec() = spec;
  if (!spec.model().empty()) rec.job.mutable_spec()->set_model_sha256(Sha256FileHex(ParseModelRef(spec.model()).path));
  rec.job.set_state(v1::JOB_STATE_QUEUED);
  rec.job.set_created_unix(Now());
  rec.job.set_images_total(rows);
  int64_t requested = spec.shard_size();
  if (requested == 0 && (spec.model().empty() || spec.volume_inputs())) {
    // Scoring a row (a 3D volume especially) costs far more than a model's image: smaller shards
    // spread a small set over every worker.
    requested = std::clamp<int64_t>((rows + 255) / 256, 1, 1024);
    // A COCO results row scores in about a millisecond of CPU, and a shard's lease, report and commit
    // cost about another on one core: shards of 6 spent a sixth of a one-core run on them. At least
    // 32 rows keep that near 3 %, and 16 workers still share a 5000-image set ten shards each.
    if (!spec.coco_results().empty()) requested = std::max<int64_t>(requested, 32);
  }
  rec.shard_size = EffectiveShardSize(rows, requested, rec.job.spec().batch_alignment());
  return rec;
}

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& submitted, const std::string& owner) {
  v1::JobSpec in = submitted;
  // tallyd's prediction store, for jobs with a model that name none; "off" opts out.
  if (in.prediction_store() == "off") {
    in.clear_prediction_store();
  } else if (in.prediction_store().empty() && !options_.prediction_store.empty() && !in.model().empty()) {
    in.set_prediction_store(options_.prediction_store);
    if (in.store_max_bytes() == 0) in.set_store_max_bytes(options_.store_max_bytes);
  }
  ASSIGN_OR_RETURN(v1::JobSpec spec, ValidateJobSpec(in));
  const std::string job_id = NewJobId(Now(), RandomHex(6));
  ASSIGN_OR_RETURN(JobRecord rec, StoreManifest(spec, job_id));
  if (absl::Status s = CheckGroupColumns(rec.job.spec()); !s.ok()) return DiscardSubmission(job_id, s);
  rec.job.set_owner(owner);
  for (const std::string& w : spec.client_warnings()) rec.job.mutable_spec()->add_manifest_warnings(w);
  if (absl::Status s = store_->CreateJob(rec); !s.ok()) {
    store_->DeleteJob(job_id).IgnoreError();
    NoteStorage(s);
    return s;
  }
  auto entry = std::make_unique<JobEntry>();
  entry->record = rec;
  PlanJob(entry.get());
  for (const ShardRange& r : JobShards(rec.job.spec(), entry->planned, rec.shard_size)) {
    Shard s;
    s.begin = r.begin;
    s.end = r.end;
    entry->pending.push_back(static_cast<int64_t>(entry->shards.size()));
    entry->shards.push_back(s);
  }
  entry->base_shards = static_cast<int64_t>(entry->shards.size());
  entry->committed_rows.assign(rec.job.images_total(), false);
  Log("job ", job_id, " submitted: ", rec.job.images_total(), " images", entry->order.random() ? " in random order" : "",
      entry->planned < rec.job.images_total() ? absl::StrCat(" (", entry->planned, " sampled)") : "", " in ",
      entry->shards.size(), " shards of ", rec.shard_size, rec.job.spec().model().empty() ? ", scoring predictions" : ", model ",
      rec.job.spec().model());
  absl::MutexLock lock(&mu_);
  job_order_.push_back(job_id);
  JobEntry* raw = entry.get();
  jobs_[job_id] = std::move(entry);
  NoteWorkLocked();
  MaybeCompleteLocked(raw);  // An empty manifest is done at once.
  return Snapshot(*raw, Now());
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return Snapshot(*it->second, Now());
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const std::optional<std::string>& owner) {
  const int limit = request.limit() <= 0 ? 20 : std::min(request.limit(), 1000);
  const std::string& page_token = request.page_token();
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse out;
  const double now = Now();
  auto it = job_order_.rbegin();
  if (!page_token.empty()) {
    it = std::find(job_order_.rbegin(), job_order_.rend(), page_token);
    if (it == job_order_.rend() || (owner && jobs_.at(*it)->record.job.owner() != *owner)) {
      return absl::InvalidArgumentError(absl::StrCat("page token '", page_token, "' names no job"));
    }
    ++it;
  }
  for (; it != job_order_.rend(); ++it) {
    if (out.jobs_size() >= limit) {
      out.set_next_page_token(out.jobs(out.jobs_size() - 1).job_id());
      break;
    }
    const JobEntry& entry = *jobs_.at(*it);
    if (owner && entry.record.job.owner() != *owner) continue;
    if (request.state() != v1::JOB_STATE_UNSPECIFIED && entry.record.job.state() != request.state()) continue;
    bool labelled = true;
    for (const auto& [key, value] : request.labels()) {
      auto l = entry.record.job.spec().labels().find(key);
      labelled &= l != entry.record.job.spec().labels().end() && l->second == value;
    }
    if (!labelled) continue;
    *out.add_jobs() = Summary(Snapshot(entry, now));
  }
  return out;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id) {
  Deferred deferred;
  v1::Job snapshot;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    if (!IsTerminal(it->second->record.job.state())) {
      EndJobLocked(it->second.get(), v1::JOB_STATE_CANCELLED, "cancelled by request", &deferred);
    }
    snapshot = Snapshot(*it->second, Now());
  }
  Apply(deferred);
  return snapshot;
}

absl::Status Coordinator::DeleteJob(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    const v1::Job& job = it->second->record.job;
    if (!IsTerminal(job.state()) || it->second->finalize_queued) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has not ended",
                                                        IsTerminal(job.state()) ? " (its report is being built)" : "",
                                                        "; cancel it first, then delete it once it has ended"));
    }
    job_order_.erase(std::find(job_order_.begin(), job_order_.end(), job_id));
    jobs_.erase(it);
  }
  RETURN_IF_ERROR(store_->DeleteJob(job_id));
  RETURN_IF_ERROR(RemoveTree(ReportPath(job_id)));
  unlink(FolderManifestPath(job_id).c_str());  // A folder job's manifest, if it is one.
  Log("job ", job_id, " deleted");
  return absl::OkStatus();
}

void Coordinator::ApplyRetention() {
  if (options_.retain_days <= 0) return;
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    const double now = Now();
    if (now - last_retention_ < 60) return;
    last_retention_ = now;
    const double cutoff = now - options_.retain_days * 86400.0;
    for (const std::string& id : job_order_) {
      const JobEntry& job = *jobs_.at(id);
      const v1::Job& j = job.record.job;
      if (IsTerminal(j.state()) && !job.finalize_queued && j.finished_unix() > 0 && j.finished_unix() < cutoff) {
        expired.push_back(id);
      }
    }
  }
  for (const std::string& id : expired) {
    absl::Status s = DeleteJob(id);
    if (!s.ok()) Log("retention: deleting job ", id, " failed: ", s.ToString());
  }
}

absl::Status Coordinator::CheckIdsJoin(const std::vector<JobRecord>& parts) {
  for (const JobRecord& p : parts) {
    // Their numbers are accumulated over image ids, which the parts would repeat or mix.
    if (!p.job.spec().coco_panoptic().empty() || (!p.job.spec().coco().empty() && p.job.spec().manifest().empty())) {
      return absl::InvalidArgumentError(absl::StrCat("cannot merge ", p.job.job_id(), ": COCO instance and panoptic ",
                                                     "jobs are not merged (run one job over the whole annotation file)"));
    }
    if (p.job.spec().duplicate_id_rows() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot merge ", p.job.job_id(), ": its manifest repeats ids, and a ",
                                                     "merged report joins rows by id: ",
                                                     absl::StrJoin(p.job.spec().manifest_warnings(), "; ")));
    }
  }
  // Across the parts: the same row in two jobs (two runs of one manifest are compared, not merged).
  DuplicateIds duplicates;
  std::vector<int64_t> starts;  // Merged index of each part's first row.
  int64_t offset = 0;
  for (const JobRecord& p : parts) {
    starts.push_back(offset);
    for (int64_t begin = 0; begin < p.job.images_total(); begin += 65536) {
      ASSIGN_OR_RETURN(std::vector<ManifestRow> rows, store_->ReadRows(p.job.job_id(), begin,
                                                                       std::min(begin + 65536, p.job.images_total())));
      for (const ManifestRow& r : rows) duplicates.Add(r.id, offset + r.index, r.line);
    }
    offset += p.job.images_total();
  }
  std::vector<DuplicateIds::Group> groups;
  const int64_t repeated = duplicates.Finish(3, &groups);
  if (repeated == 0) return absl::OkStatus();
  auto part_of = [&](int64_t index) {
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), index) - starts.begin() - 1);
  };
  std::vector<std::string> named;
  for (const DuplicateIds::Group& g : groups) {
    std::vector<std::string> where;
    for (const auto& [index, line] : g.rows) {
      if (where.size() < 3) where.push_back(absl::StrCat(parts[part_of(index)].job.job_id(), " line ", line));
    }
    const size_t first = part_of(g.rows[0].first);
    const int64_t row = g.rows[0].first - starts[first];
    ASSIGN_OR_RETURN(std::vector<ManifestRow> read, store_->ReadRows(parts[first].job.job_id(), row, row + 1));
    named.push_back(absl::StrCat("'", read.empty() ? "?" : read[0].id, "' (", absl::StrJoin(where, ", "), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot merge: ", repeated, " rows repeat an id of another job's ",
                                                 "row, and a merged report joins rows by id: ", absl::StrJoin(named, ", "),
                                                 "; to compare two runs of one manifest, use tally compare"));
}

absl::StatusOr<std::string> Coordinator::MergeReports(const std::vector<std::string>& job_ids) {
  if (job_ids.size() < 2) return absl::InvalidArgumentError("merge needs two jobs or more");
  if (job_ids.size() > 1000) return absl::InvalidArgumentError("merge takes at most 1000 jobs");
  std::vector<JobRecord> parts;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : job_ids) {
      ASSIGN_OR_RETURN(JobRecord record, FinishedRecordLocked(id));
      parts.push_back(std::move(record));
    }
  }
  // One job's settings must describe them all: the report shows them once.
  ASSIGN_OR_RETURN(const JobConfig first, JobConfigFromSpec(parts[0].job.spec()));
  JobRecord merged;
  merged.job = parts[0].job;
  merged.job.set_job_id(absl::StrCat("merge-", parts.size(), "-", job_ids.front(), "-", job_ids.back()));
  std::vector<std::string> manifests;
  int64_t total = 0, evaluated = 0, failed = 0;
  for (const JobRecord& p : parts) {
    ASSIGN_OR_RETURN(const JobConfig c, JobConfigFromSpec(p.job.spec()));
    const auto differs = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat("cannot merge ", p.job.job_id(), " with ", parts[0].job.job_id(),
                                                     ": their ", what, " differ"));
    };
    if (c.metrics != first.metrics) return differs("metrics");
    if (p.job.num_classes() != parts[0].job.num_classes() || c.regions != first.regions) return differs("classes");
    if (c.include_background != first.include_background || c.empty_score != first.empty_score ||
        c.iou_thresholds != first.iou_thresholds || c.thresholds != first.thresholds) {
      return differs("aggregation settings (--include-background, --empty-score, --iou-thresholds, --thresholds)");
    }
    // Groups read each part's columns by the first part's names.
    if (!std::equal(p.job.spec().group_by().begin(), p.job.spec().group_by().end(), parts[0].job.spec().group_by().begin(),
                    parts[0].job.spec().group_by().end()) ||
        c.find_slices != first.find_slices || (first.row_properties() && c.manifest_columns != first.manifest_columns)) {
      return differs("groups (--group-by, --find-slices) or, for them, manifest columns");
    }
    manifests.push_back(p.job.spec().manifest());
    total += p.job.images_total();
    evaluated += p.job.images_evaluated();
    failed += p.job.images_failed();
    merged.job.set_created_unix(std::min(merged.job.created_unix(), p.job.created_unix()));
    merged.job.set_finished_unix(std::max(merged.job.finished_unix(), p.job.finished_unix()));
    merged.last_result_unix = std::max(merged.last_result_unix, p.last_result_unix);
    if (p.job.state() != v1::JOB_STATE_SUCCEEDED) merged.job.set_state(p.job.state());
  }
  RETURN_IF_ERROR(CheckIdsJoin(parts));
  merged.job.mutable_spec()->set_manifest(absl::StrJoin(manifests, " + "));
  // Provenance: one model hash if every part ran the same file; no single manifest hash.
  for (const JobRecord& p : parts) {
    if (p.job.spec().model_sha256() != parts[0].job.spec().model_sha256()) merged.job.mutable_spec()->clear_model_sha256();
  }
  merged.job.mutable_spec()->clear_manifest_sha256();
  merged.job.mutable_spec()->set_name(absl::StrCat("merge of ", absl::StrJoin(job_ids, ", ")));
  // One shard size where every part had it; else none (-1: the report writes null).
  merged.shard_size = parts[0].shard_size;
  for (const JobRecord& p : parts) {
    if (p.shard_size != parts[0].shard_size) merged.shard_size = -1;
  }
  merged.job.set_images_total(total);
  merged.job.set_images_evaluated(evaluated);
  merged.job.set_images_failed(failed);
  std::vector<const JobRecord*> pointers;
  for (const JobRecord& p : parts) pointers.push_back(&p);
  const std::string dir = absl::StrCat(options_.state_dir, "/merged/", merged.job.job_id(), "-", RandomHex(6));
  RETURN_IF_ERROR(WriteMergedReports(store_.get(), pointers, merged, dir));
  return dir;
}

absl::StatusOr<std::string> Coordinator::PartialReport(const std::string& job_id) {
  JobRecord rec;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    rec = it->second->record;
    rec.job = Snapshot(*it->second, Now());
  }
  const std::string dir = absl::StrCat(options_.state_dir, "/merged/", job_id, "-partial-", RandomHex(6));
  RETURN_IF_ERROR(WriteMergedReports(store_.get(), {&rec}, rec, dir));
  return dir;
}

absl::Status Coordinator::ForEachResult(const std::string& job_id, const JobStore::ResultFn& fn) {
  RETURN_IF_ERROR(GetJob(job_id).status());
  return store_->ForEachResult(job_id, fn);
}

absl::StatusOr<std::string> Coordinator::CompareJobs(const std::string& a, const std::string& b) {
  JobRecord run_a, run_b;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(run_a, FinishedRecordLocked(a));
    ASSIGN_OR_RETURN(run_b, FinishedRecordLocked(b));
  }
  ASSIGN_OR_RETURN(const Comparison c, ::tally::CompareJobs(store_.get(), run_a, run_b));
  const std::string dir = absl::StrCat(options_.state_dir, "/merged/compare-", a, "-", b, "-", RandomHex(6));
  RETURN_IF_ERROR(WriteComparison(c, dir));
  return dir;
}

absl::StatusOr<JobRecord> Coordinator::FinishedRecordLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const v1::Job& job = it->second->record.job;
  if (!job.report_ready()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no report yet (", job.images_evaluated() + job.images_failed(), "/",
        job.images_total(), " images done); reports are built when the job ends"));
  }
  return it->second->record;
}

absl::StatusOr<std::string> Coordinator::ReportDir(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FinishedRecordLocked(job_id).status());
  return ReportPath(job_id);
}

void Coordinator::EndJobLocked(JobEntry* job, v1::JobState state, const std::string& error, Deferred* deferred) {
  v1::Job& j = job->record.job;
  j.set_state(state);
  j.set_error(error);
  j.set_finished_unix(Now());
  job->pending.clear();
  for (size_t i = 0; i < job->shards.size(); ++i) {
    Shard& s = job->shards[i];
    if (s.phase == ShardPhase::kLeased) {
      ForgetShardLeasesLocked(j.job_id(), static_cast<int64_t>(i), s);
      s.phase = ShardPhase::kPending;
      s.worker_id.clear();
      s.spec_worker_id.clear();
    }
  }
  deferred->job_updates.push_back(job->record);
  if (!job->finalize_queued) {
    job->finalize_queued = true;
    finalize_queue_.push_back(j.job_id());
  }
}

void Coordinator::MaybeCompleteLocked(JobEntry* job) {
  if (job->finalize_queued || IsTerminal(job->record.job.state())) return;
  if (job->shards_done < static_cast<int64_t>(job->shards.size())) return;
  // The count says every shard is done: each one's phase must agree, else the count went wrong
  // somewhere and the job would end without rows that are still to come. Said, mended, not ended.
  const int64_t done = std::count_if(job->shards.begin(), job->shards.end(),
                                     [](const Shard& s) { return s.phase == ShardPhase::kDone; });
  if (done != job->shards_done) {
    Log("job ", job->record.job.job_id(), ": internal error: ", job->shards_done, " shards counted done, ", done,
        " are; the job goes on until every shard is");
    job->shards_done = done;
    if (done < static_cast<int64_t>(job->shards.size())) return;
  }
  if (CanariesUnderWayLocked(job)) return;
  job->finalize_queued = true;
  v1::Job& j = job->record.job;
  if (j.spec().until_ci() > 0 && !job->stopped_early) {
    // Every row in without the rule met: said in status and the reports, not left to guess.
    const std::string before = j.until_ci_note();
    const size_t at = before.find(": widest"), stop = before.find(" (stops");
    j.set_until_ci_note(absl::StrCat("--until-ci ", j.spec().until_ci(), " not reached: every row was evaluated",
                                     at == std::string::npos ? std::string() : before.substr(at, stop - at)));
  }
  finalize_queue_.push_back(job->record.job.job_id());
}

void Coordinator::RunFinalizers() {
  while (true) {
    std::string job_id;
    JobRecord rec;
    std::shared_ptr<LiveReport> live;
    {
      absl::MutexLock lock(&mu_);
      if (finalize_queue_.empty()) return;
      job_id = finalize_queue_.front();
      finalize_queue_.pop_front();
      rec = jobs_.at(job_id)->record;
      live = jobs_.at(job_id)->live_report;
    }
    const double started = NowUnix();
    const bool completing = !IsTerminal(rec.job.state());
    if (completing) {
      rec.job.set_state(v1::JOB_STATE_SUCCEEDED);
      rec.job.set_finished_unix(Now());
    }
    rec.job.set_sampled(SampledNote(rec.job, 0));
    ReportOutcome outcome;
    // The report kept as rows arrived holds every committed row: only files to write. Otherwise
    // (the batch path's jobs, or rows it missed) one pass over the database.
    // Its interval is over all rows (kRows): a job that ended with rows missing (cancelled) gets the
    // batch path's, which says what its rows are a sample of, if anything.
    const bool kept = live != nullptr && live->rows() == rec.job.images_evaluated() + rec.job.images_failed() &&
                      IntervalKindFor(rec) == IntervalKind::kRows;
    absl::Status s = kept ? live->Write(store_.get(), rec, ReportPath(job_id), &outcome) : absl::OkStatus();
    bool from_rows = kept;
    if (!kept || !s.ok()) {
      from_rows = false;
      if (!s.ok()) Log("job ", job_id, ": the report kept as rows arrived failed (", s.message(), "); built from the database");
      outcome = ReportOutcome();
      s = WriteReports(store_.get(), rec, ReportPath(job_id), &outcome);
    }
    live.reset();
    for (const std::string& w : outcome.warnings) Log("job ", job_id, ": warning: ", w);
    if (!s.ok()) {
      Log("building the report of job ", job_id, " failed: ", s.ToString());
      if (completing) {
        rec.job.set_state(v1::JOB_STATE_FAILED);
        rec.job.set_error(absl::StrCat("building the report failed (results are kept in the database): ",
                                       s.message()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      JobEntry& job = *jobs_.at(job_id);
      v1::Job& j = job.record.job;
      if (completing) {
        j.set_state(rec.job.state());
        j.set_error(rec.job.error());
        j.set_finished_unix(rec.job.finished_unix());
      }
      j.set_report_ready(s.ok());
      j.set_summary(outcome.summary);
      // The note `tally status` shows, as the report states it (the same intervals as its table).
      if (!outcome.until_ci_note.empty()) j.set_until_ci_note(outcome.until_ci_note);
      job.finalize_queued = false;
      job.live_report.reset();  // Written (or not needed): its memory and spool go.
      job.live_report_off = true;
      rec = job.record;
    }
    absl::Status saved = store_->UpdateJob(rec);
    NoteStorage(saved);
    if (!saved.ok()) Log("saving job ", job_id, " failed: ", saved.ToString());
    {
      absl::MutexLock lock(&listeners_mu_);
      for (const auto& [handle, wake] : report_listeners_) wake();
    }
    Log("job ", job_id, " ", v1::JobState_Name(rec.job.state()), ": ", rec.job.images_evaluated(), " evaluated, ",
        rec.job.images_failed(), " failed of ", rec.job.images_total(), "; report ", from_rows ? "kept as rows arrived" : "built from the database",
        ", written in ", absl::StrFormat("%.2f", NowUnix() - started), " s");
  }
}

}  // namespace tally
