#include "server/coordinator_service.h"

#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "common/job/rpc.h"
#include "grpcpp/alarm.h"
#include "server/grpc_util.h"
#include "server/report/compare.h"
#include "server/report/report_writer.h"
#include "server/access/visibility.h"
#include "server/follow/follow_jobs.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "common/security/data_roots.h"

namespace tally {
namespace {

// Streams job snapshots: one at once, then one per interval, until the job has ended and its report
// is ready (or the client goes away); a report written wakes it at once (Coordinator's report
// listeners), so the last snapshot does not wait out the interval. Waits on a grpc::Alarm, never
// blocking a reactor thread.
class WatchJobReactor final : public grpc::ServerWriteReactor<v1::Job> {
 public:
  WatchJobReactor(Coordinator* core, std::string job_id, absl::Duration interval)
      : core_(core), job_id_(std::move(job_id)), interval_(interval) {
    listener_ = core_->AddReportListener([this] { Wake(); });
    WriteSnapshot();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
        return;
      }
      if (last_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      if (!wake_requested_) {
        alarm_pending_ = true;
        alarm_.Set(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(interval_),
                   [this](bool fired) { OnAlarm(fired); });
        return;
      }
      wake_requested_ = false;  // A report was written while this write was in flight.
    }
    WriteSnapshot();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    alarm_.Cancel();
  }

  void OnDone() override {
    core_->RemoveReportListener(listener_);  // No Wake() runs after this returns.
    bool remove = false;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      remove = !alarm_pending_;
    }
    if (remove) delete this;
  }

 private:
  // A report was written (this job's or another's): a snapshot now rather than at the interval.
  void Wake() {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || done_) return;
      if (!alarm_pending_) {
        wake_requested_ = true;  // OnWriteDone writes the next snapshot at once.
        return;
      }
    }
    alarm_.Cancel();  // OnAlarm(false): a wake, unless the call was cancelled.
  }

  void OnAlarm(bool fired) {
    bool remove = false, write = false;
    {
      absl::MutexLock lock(&mu_);
      alarm_pending_ = false;
      remove = done_;
      if (!remove && !finishing_) {
        write = fired || !cancelled_;
        if (!write) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      }
    }
    if (remove) {
      delete this;
      return;
    }
    if (write) WriteSnapshot();
  }

  void WriteSnapshot() {
    absl::StatusOr<v1::Job> job = core_->GetJob(job_id_);
    absl::MutexLock lock(&mu_);
    if (finishing_ || done_) return;
    if (!job.ok()) {
      FinishLocked(ToGrpcStatus(job.status()));
      return;
    }
    snapshot_ = *job;
    last_ = IsTerminal(snapshot_.state()) && snapshot_.report_ready();
    StartWrite(&snapshot_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    Finish(status);
  }

  Coordinator* const core_;
  const std::string job_id_;
  const absl::Duration interval_;
  int64_t listener_ = 0;
  grpc::Alarm alarm_;
  absl::Mutex mu_;
  v1::Job snapshot_ ABSL_GUARDED_BY(mu_);
  bool last_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool alarm_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;       // OnCancel: the client went away.
  bool wake_requested_ ABSL_GUARDED_BY(mu_) = false;  // Woken while a write was in flight.
};

// Streams the report files of a job in 1 MiB chunks. With `remove_after`, the folder is a
// temporary one (a merged report) and is deleted when the call ends.
class FetchReportReactor final : public grpc::ServerWriteReactor<v1::ReportChunk> {
 public:
  explicit FetchReportReactor(absl::StatusOr<std::string> dir) : remove_after_(false) {
    for (const char* f : kReportFiles) files_.emplace_back(f);
    Start(std::move(dir), kOptionalReportFiles);
  }
  // Builds the folder (holding `files`, and those of `optional` it has) on `executor` first: blocking
  // work stays off the callback threads. The folder is removed when the call ends.
  FetchReportReactor(Executor* executor, std::vector<std::string> files,
                     std::function<absl::StatusOr<std::string>()> build, std::vector<const char*> optional = {})
      : remove_after_(true), files_(std::move(files)) {
    executor->Schedule([this, build = std::move(build), optional = std::move(optional)] { Start(build(), optional); });
  }

 private:
  template <typename Optional>
  void Start(absl::StatusOr<std::string> dir, const Optional& optional) {
    if (!dir.ok()) {
      Finish(ToGrpcStatus(dir.status()));
      return;
    }
    dir_ = *dir;
    for (const char* f : optional) {
      if (std::ifstream(dir_ + "/" + f).good()) files_.emplace_back(f);
    }
    Next();
  }

 public:
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    Next();
  }
  void OnDone() override {
    if (in_.is_open()) in_.close();
    if (remove_after_ && !dir_.empty()) RemoveTree(dir_).IgnoreError();
    delete this;
  }

 private:
  void Next() {
    constexpr size_t kChunk = 1 << 20;
    while (file_ < files_.size()) {
      if (!in_.is_open()) {
        in_.open(dir_ + "/" + files_[file_], std::ios::binary);
        if (!in_) {
          Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "report file missing: " + files_[file_]));
          return;
        }
      }
      chunk_.Clear();
      chunk_.set_file_name(files_[file_]);
      std::string data(kChunk, '\0');
      in_.read(data.data(), kChunk);
      data.resize(static_cast<size_t>(in_.gcount()));
      const bool last = in_.eof() || data.size() < kChunk;
      if (last) {
        in_.close();
        ++file_;
      }
      chunk_.set_data(std::move(data));
      chunk_.set_last_chunk_of_file(last);
      StartWrite(&chunk_);
      return;
    }
    Finish(grpc::Status::OK);
  }

  const bool remove_after_;
  std::string dir_;
  std::vector<std::string> files_;
  size_t file_ = 0;
  std::ifstream in_;
  v1::ReportChunk chunk_;
};

}  // namespace

absl::StatusOr<Caller> CoordinatorServiceImpl::Authenticate(grpc::CallbackServerContext* ctx) const {
  return auth_->Check(AuthorizationOf(ctx), Api::kCoordinator);
}

absl::StatusOr<v1::Job> CoordinatorServiceImpl::VisibleJob(const Caller& caller, const std::string& job_id) const {
  return tally::VisibleJob(core_, caller, job_id);
}

absl::Status CoordinatorServiceImpl::AllVisible(const Caller& caller, const std::vector<std::string>& job_ids) const {
  for (const std::string& id : job_ids) {
    if (absl::StatusOr<v1::Job> job = VisibleJob(caller, id); !job.ok()) return job.status();
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                            const v1::SubmitJobRequest* request,
                                                            v1::SubmitJobResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  Coordinator* core = core_;
  return UnaryBlocking(executor_, ctx, response,
                       [core, request, owner = caller->name]() -> absl::StatusOr<v1::SubmitJobResponse> {
                         absl::StatusOr<v1::Job> job = core->SubmitJob(request->spec(), owner);
                         if (!job.ok()) return job.status();
                         v1::SubmitJobResponse out;
                         *out.mutable_job() = std::move(*job);
                         return out;
                       });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                         const v1::GetJobRequest* request, v1::Job* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&] { return VisibleJob(*caller, request->job_id()); });
}

grpc::ServerWriteReactor<v1::Job>* CoordinatorServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                    const v1::WatchJobRequest* request) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return new RefusedWriter<v1::Job>(caller.status());
  if (absl::StatusOr<v1::Job> job = VisibleJob(*caller, request->job_id()); !job.ok()) {
    return new RefusedWriter<v1::Job>(job.status());
  }
  const int ms = request->interval_ms() > 0 ? request->interval_ms() : 250;
  return new WatchJobReactor(core_, request->job_id(), absl::Milliseconds(ms));
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                            const v1::CancelJobRequest* request, v1::Job* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::Job> {
    absl::StatusOr<v1::Job> job = VisibleJob(*caller, request->job_id());
    if (!job.ok()) return job.status();
    return core_->CancelJob(request->job_id());
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                           const v1::ListJobsRequest* request,
                                                           v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  const std::optional<std::string> owner = caller->sees_all ? std::nullopt : std::optional<std::string>(caller->name);
  return Unary(ctx, response, [&] { return core_->ListJobs(*request, owner); });
}

grpc::ServerWriteReactor<v1::ReportChunk>* CoordinatorServiceImpl::FetchReport(grpc::CallbackServerContext* ctx,
                                                                               const v1::FetchReportRequest* request) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return new RefusedWriter<v1::ReportChunk>(caller.status());
  absl::StatusOr<v1::Job> job = VisibleJob(*caller, request->job_id());
  if (!job.ok()) return new RefusedWriter<v1::ReportChunk>(job.status());
  if (request->partial() && !IsTerminal(job->state())) {  // Built now over the committed rows, then removed.
    Coordinator* core = core_;
    std::vector<std::string> files(std::begin(kReportFiles), std::end(kReportFiles));
    return new FetchReportReactor(executor_, std::move(files), [core, id = request->job_id()] { return core->PartialReport(id); });
  }
  return new FetchReportReactor(core_->ReportDir(request->job_id()));
}

grpc::ServerWriteReactor<v1::ReportChunk>* CoordinatorServiceImpl::MergeReports(grpc::CallbackServerContext* ctx,
                                                                                const v1::MergeReportsRequest* request) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return new RefusedWriter<v1::ReportChunk>(caller.status());
  std::vector<std::string> ids(request->job_ids().begin(), request->job_ids().end());
  if (absl::Status s = AllVisible(*caller, ids); !s.ok()) return new RefusedWriter<v1::ReportChunk>(s);
  Coordinator* core = core_;
  std::vector<std::string> files(std::begin(kReportFiles), std::end(kReportFiles));
  return new FetchReportReactor(executor_, std::move(files), [core, ids] { return core->MergeReports(ids); },
                                std::vector<const char*>(std::begin(kOptionalReportFiles), std::end(kOptionalReportFiles)));
}

grpc::ServerWriteReactor<v1::ReportChunk>* CoordinatorServiceImpl::CompareJobs(grpc::CallbackServerContext* ctx,
                                                                               const v1::CompareJobsRequest* request) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return new RefusedWriter<v1::ReportChunk>(caller.status());
  if (absl::Status s = AllVisible(*caller, {request->a(), request->b()}); !s.ok()) {
    return new RefusedWriter<v1::ReportChunk>(s);
  }
  Coordinator* core = core_;
  std::vector<std::string> files(std::begin(kCompareFiles), std::end(kCompareFiles));
  return new FetchReportReactor(executor_, std::move(files),
                                [core, a = request->a(), b = request->b()] { return core->CompareJobs(a, b); });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::DeleteJob(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteJobRequest* request,
                                                            v1::DeleteJobResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  if (absl::StatusOr<v1::Job> job = VisibleJob(*caller, request->job_id()); !job.ok()) {
    return Refuse(ctx, job.status());
  }
  Coordinator* core = core_;
  return UnaryBlocking(executor_, ctx, response, [core, request]() -> absl::StatusOr<v1::DeleteJobResponse> {
    absl::Status s = core->DeleteJob(request->job_id());
    if (!s.ok()) return s;
    return v1::DeleteJobResponse();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                              const v1::ListWorkersRequest* request,
                                                              v1::ListWorkersResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::ListWorkersResponse> { return VisibleWorkers(core_, *caller); });
}

absl::StatusOr<v1::Follow> CoordinatorServiceImpl::VisibleFollow(const Caller& caller,
                                                                  const std::string& follow_id) const {
  if (follows_ == nullptr) return absl::UnimplementedError("this tallyd keeps no follows");
  return tally::VisibleFollow(*follows_, caller, follow_id);
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::CreateFollow(grpc::CallbackServerContext* ctx,
                                                               const v1::CreateFollowRequest* request,
                                                               v1::Follow* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::Follow> {
    if (follows_ == nullptr) return absl::UnimplementedError("this tallyd keeps no follows");
    const v1::FollowSpec& spec = request->spec();
    RETURN_IF_ERROR(CheckFollowMetric(spec.metric().empty() ? "dice" : spec.metric()));
    if (!spec.on_new_best().empty() && !caller->sees_all) {
      return absl::PermissionDeniedError(
          "--on-new-best runs a command on tallyd's host: only an admin token may give one (SECURITY.md)");
    }
    // The folder is read by tallyd: within its --data-root folders, as every path a client names.
    if (!ProcessDataRoots().empty() && !ProcessDataRoots().Resolve(spec.folder()).ok()) {
      return OutsideDataRootsError("tally follow", spec.folder());
    }
    // The jobs' settings are checked now, with the folder standing for each checkpoint's model.
    v1::JobSpec job = spec.job();
    job.set_model(spec.folder() + "/checkpoint");
    RETURN_IF_ERROR(JobConfigFromSpec(job).status());
    return follows_->Create(spec, caller->name, NowUnix());
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetFollow(grpc::CallbackServerContext* ctx,
                                                            const v1::GetFollowRequest* request, v1::Follow* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&] { return VisibleFollow(*caller, request->follow_id()); });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListFollows(grpc::CallbackServerContext* ctx,
                                                              const v1::ListFollowsRequest* request,
                                                              v1::ListFollowsResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::ListFollowsResponse> {
    return follows_ == nullptr ? v1::ListFollowsResponse() : VisibleFollows(*follows_, *caller);
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::CancelFollow(grpc::CallbackServerContext* ctx,
                                                               const v1::CancelFollowRequest* request,
                                                               v1::Follow* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::Follow> {
    RETURN_IF_ERROR(VisibleFollow(*caller, request->follow_id()).status());
    return follows_->Cancel(request->follow_id());
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::DeleteFollow(grpc::CallbackServerContext* ctx,
                                                               const v1::DeleteFollowRequest* request,
                                                               v1::DeleteFollowResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(ctx);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, response, [&]() -> absl::StatusOr<v1::DeleteFollowResponse> {
    RETURN_IF_ERROR(VisibleFollow(*caller, request->follow_id()).status());
    RETURN_IF_ERROR(follows_->Delete(request->follow_id()));
    return v1::DeleteFollowResponse();
  });
}

}  // namespace tally
