#include "client/client.h"

#include <chrono>
#include <future>
#include <fstream>

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "base/backoff.h"
#include "base/file_util.h"
#include "common/job/job_config.h"
#include "common/job/rpc.h"

namespace tally {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& server) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) msg = absl::StrCat("cannot reach tallyd at ", server, ": ", msg);
  // This client cancels no call it waits for: CANCELLED is tallyd ending the call as it stops (a
  // restart), which callers ride through like any unreachable moment.
  if (s.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::UnavailableError(absl::StrCat("tallyd at ", server, " ended the call as it stopped (restarting?): ", msg));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

}  // namespace

int JobExitCode(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return TooManyFailedRows(job.images_failed(), job.images_total(), job.spec().max_failed_fraction())
                 ? kExitTooManyFailedRows
                 : kExitSucceeded;
    case v1::JOB_STATE_CANCELLED: return kExitCancelled;
    default: return kExitFailed;
  }
}

absl::StatusOr<std::unique_ptr<TallyClient>> TallyClient::Create(const std::string& server,
                                                                 const ClientSecurityOptions& security) {
  std::unique_ptr<TallyClient> client(new TallyClient(server));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateClientChannel(server, security, args);
  if (!channel.ok()) return channel.status();
  client->channel_ = *std::move(channel);
  client->stub_ = v1::Coordinator::NewStub(client->channel_);
  return client;
}

absl::StatusOr<std::string> TallyClient::Health(double timeout_seconds) {
  // grpc.health.v1 without its generated code (Debian ships none): the request for the whole
  // server is the empty message; the response is field 1, the status enum, as one varint.
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_seconds);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status s = done.get_future().get();
  if (!s.ok()) return FromGrpc(s, server_);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  int status = 0;  // UNKNOWN when the field is absent.
  if (bytes.size() == 2 && bytes[0] == 0x08) status = static_cast<unsigned char>(bytes[1]);
  else if (!bytes.empty()) return absl::InternalError("unexpected health response");
  static const char* const kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return std::string(status < 4 ? kNames[status] : "UNKNOWN");
}

bool TallyClient::WaitUntilReady(double seconds) {
  return channel_->WaitForConnected(std::chrono::system_clock::now() +
                                    std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

absl::StatusOr<v1::Job> TallyClient::Submit(const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 600);  // Large manifests take a while to parse and store.
  grpc::Status s = stub_->SubmitJob(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s, server_);
  return response.job();
}

absl::StatusOr<v1::Job> TallyClient::Get(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->GetJob(&ctx, request, &job);
  if (!s.ok()) return FromGrpc(s, server_);
  return job;
}

absl::StatusOr<v1::Job> TallyClient::Cancel(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->CancelJob(&ctx, request, &job);
  if (!s.ok()) return FromGrpc(s, server_);
  return job;
}

absl::StatusOr<v1::Follow> TallyClient::CreateFollow(const v1::FollowSpec& spec) {
  v1::CreateFollowRequest request;
  *request.mutable_spec() = spec;
  v1::Follow out;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 60);
  grpc::Status s = stub_->CreateFollow(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s, server_);
  return out;
}

absl::StatusOr<v1::Follow> TallyClient::GetFollow(const std::string& follow_id) {
  v1::GetFollowRequest request;
  request.set_follow_id(follow_id);
  v1::Follow out;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->GetFollow(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s, server_);
  return out;
}

absl::StatusOr<v1::ListFollowsResponse> TallyClient::ListFollows() {
  v1::ListFollowsResponse out;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->ListFollows(&ctx, v1::ListFollowsRequest(), &out);
  if (!s.ok()) return FromGrpc(s, server_);
  return out;
}

absl::StatusOr<v1::Follow> TallyClient::CancelFollow(const std::string& follow_id) {
  v1::CancelFollowRequest request;
  request.set_follow_id(follow_id);
  v1::Follow out;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->CancelFollow(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s, server_);
  return out;
}

absl::Status TallyClient::DeleteFollow(const std::string& follow_id) {
  v1::DeleteFollowRequest request;
  request.set_follow_id(follow_id);
  v1::DeleteFollowResponse out;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 60);
  grpc::Status s = stub_->DeleteFollow(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s, server_);
  return absl::OkStatus();
}

absl::StatusOr<v1::ListJobsResponse> TallyClient::List(int limit, const std::string& page_token,
                                                       const v1::ListJobsRequest& filter) {
  v1::ListJobsRequest request = filter;
  request.set_limit(limit);
  request.set_page_token(page_token);
  v1::ListJobsResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->ListJobs(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s, server_);
  return response;
}

absl::Status TallyClient::Delete(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  v1::DeleteJobResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 600);  // Millions of rows take a while to delete.
  return FromGrpc(stub_->DeleteJob(&ctx, request, &response), server_);
}

absl::StatusOr<v1::ListWorkersResponse> TallyClient::Workers() {
  v1::ListWorkersRequest request;
  v1::ListWorkersResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  grpc::Status s = stub_->ListWorkers(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s, server_);
  return response;
}

absl::StatusOr<v1::Job> TallyClient::Watch(const std::string& job_id, int interval_ms,
                                           const std::function<void(const v1::Job&)>& on_update,
                                           const std::function<bool()>& keep_going,
                                           const std::function<void(const std::string&)>& on_reconnect,
                                           double reconnect_seconds) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_interval_ms(interval_ms);
  v1::Job last;
  bool any = false;
  Backoff backoff(0.25, 2.0);
  auto give_up_at = std::chrono::steady_clock::now();
  bool reconnecting = false;
  while (true) {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::Job>> reader = stub_->WatchJob(&ctx, request);
    v1::Job job;
    bool stopped = false;
    while (reader->Read(&job)) {
      last = job;
      any = true;
      reconnecting = false;
      backoff.Reset();
      on_update(job);
      if (keep_going && !keep_going()) {
        ctx.TryCancel();
        stopped = true;
        break;
      }
    }
    grpc::Status s = reader->Finish();
    if (stopped || s.ok()) {
      if (!any) return absl::UnavailableError(absl::StrCat("no update from tallyd at ", server_));
      return last;
    }
    // The coordinator went away mid-watch (a restart, say): reconnect and carry on.
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::CANCELLED) {
      return FromGrpc(s, server_);
    }
    if (!reconnecting) {
      reconnecting = true;
      give_up_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(reconnect_seconds * 1000));
      if (on_reconnect) on_reconnect(s.error_message());
    }
    if (std::chrono::steady_clock::now() > give_up_at) return FromGrpc(s, server_);
    const double delay = backoff.Next();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(delay * 1000));
    while (std::chrono::steady_clock::now() < until) {
      if (keep_going && !keep_going()) {
        if (!any) return FromGrpc(s, server_);
        return last;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

absl::StatusOr<std::vector<std::string>> TallyClient::FetchReport(const std::string& job_id, const std::string& dir,
                                                                  bool partial) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  v1::FetchReportRequest request;
  request.set_job_id(job_id);
  request.set_partial(partial);
  grpc::ClientContext ctx;
  return WriteReportFiles(stub_->FetchReport(&ctx, request).get(), dir);
}

absl::StatusOr<std::vector<std::string>> TallyClient::MergeReports(const std::vector<std::string>& job_ids,
                                                                   const std::string& dir) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  v1::MergeReportsRequest request;
  for (const std::string& id : job_ids) request.add_job_ids(id);
  grpc::ClientContext ctx;
  return WriteReportFiles(stub_->MergeReports(&ctx, request).get(), dir);
}

absl::StatusOr<std::vector<std::string>> TallyClient::CompareJobs(const std::string& a, const std::string& b,
                                                                  const std::string& dir) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  v1::CompareJobsRequest request;
  request.set_a(a);
  request.set_b(b);
  grpc::ClientContext ctx;
  return WriteReportFiles(stub_->CompareJobs(&ctx, request).get(), dir);
}

absl::StatusOr<std::vector<std::string>> TallyClient::WriteReportFiles(grpc::ClientReader<v1::ReportChunk>* reader,
                                                                       const std::string& dir) {
  v1::ReportChunk chunk;
  std::vector<std::string> written;
  std::unique_ptr<AtomicFile> out;
  std::string current;
  while (reader->Read(&chunk)) {
    if (chunk.file_name().find('/') != std::string::npos || chunk.file_name().empty()) {
      return absl::DataLossError(absl::StrCat("tallyd sent a bad report file name '", chunk.file_name(), "'"));
    }
    if (chunk.file_name() != current) {
      current = chunk.file_name();
      absl::StatusOr<std::unique_ptr<AtomicFile>> opened = AtomicFile::Open(dir + "/" + current);
      if (!opened.ok()) return opened.status();
      out = std::move(*opened);
    }
    out->out().write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (chunk.last_chunk_of_file()) {
      if (absl::Status s = out->Commit(); !s.ok()) return s;
      written.push_back(dir + "/" + current);
      current.clear();
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpc(s, server_);
  return written;
}

}  // namespace tally
