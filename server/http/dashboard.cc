#include "server/http/dashboard.h"

#include <civetweb.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/job/rpc.h"
#include "server/http/dashboard_routes.h"
#include "server/access/visibility.h"

namespace tally {
namespace {

HttpResponse Json(const google::protobuf::Message& m) { return HttpResponse{200, "application/json", ToJson(m)}; }

HttpResponse Error(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) escaped.push_back(c);
  }
  r.body = absl::StrCat("{\"error\":\"", escaped, "\"}");
  return r;
}

HttpResponse FromStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnauthenticated: return Error(401, std::string(s.message()));
    case absl::StatusCode::kPermissionDenied: return Error(403, std::string(s.message()));
    case absl::StatusCode::kNotFound: return Error(404, std::string(s.message()));
    case absl::StatusCode::kInvalidArgument: return Error(400, std::string(s.message()));
    case absl::StatusCode::kFailedPrecondition: return Error(409, std::string(s.message()));
    default: return Error(500, std::string(s.message()));
  }
}

std::string ContentType(const std::string& file) {
  if (absl::EndsWith(file, ".json")) return "application/json";
  if (absl::EndsWith(file, ".csv")) return "text/csv; charset=utf-8";
  if (absl::EndsWith(file, ".html")) return "text/html; charset=utf-8";
  return "text/markdown; charset=utf-8";
}

}  // namespace

HttpResponse DashboardHandler::Get(absl::string_view path, absl::string_view query,
                                   absl::string_view authorization) const {
  const DashboardRoute route = ParseDashboardRequest(path, query);
  using Kind = DashboardRoute::Kind;
  if (route.kind == Kind::kPage) return HttpResponse{200, "text/html; charset=utf-8", kDashboardPage};
  if (route.kind == Kind::kNotFound) return Error(404, "no such page");
  if (route.kind == Kind::kBadRequest) return Error(400, route.error);
  absl::StatusOr<Caller> caller = auth_->Check(authorization, Api::kCoordinator);
  if (!caller.ok()) return FromStatus(caller.status());
  switch (route.kind) {
    case Kind::kJobs: {
      v1::ListJobsRequest request;
      request.set_limit(route.limit);
      request.set_page_token(route.page_token);
      if (!route.state.empty()) request.set_state(JobStateFromName(route.state));
      for (const auto& [k, v] : route.labels) (*request.mutable_labels())[k] = v;
      std::optional<std::string> owner;
      if (!caller->sees_all) owner = caller->name;
      else if (!route.owner.empty()) owner = route.owner;
      absl::StatusOr<v1::ListJobsResponse> jobs = core_->ListJobs(request, owner);
      return jobs.ok() ? Json(*jobs) : FromStatus(jobs.status());
    }
    case Kind::kJob: {
      absl::StatusOr<v1::Job> job = VisibleJob(core_, *caller, route.job_id);
      return job.ok() ? Json(*job) : FromStatus(job.status());
    }
    case Kind::kJobFile: {
      if (absl::StatusOr<v1::Job> job = VisibleJob(core_, *caller, route.job_id); !job.ok()) return FromStatus(job.status());
      absl::StatusOr<std::string> dir = core_->ReportDir(route.job_id);
      if (!dir.ok()) return FromStatus(dir.status());
      absl::StatusOr<std::string> data = ReadFileToString(absl::StrCat(*dir, "/", route.file));
      if (!data.ok()) return FromStatus(data.status());
      return HttpResponse{200, ContentType(route.file), std::move(*data)};
    }
    case Kind::kWorkers:
      return Json(VisibleWorkers(core_, *caller));
    case Kind::kCompare: {
      for (const std::string& id : {route.a, route.b}) {
        if (absl::StatusOr<v1::Job> job = VisibleJob(core_, *caller, id); !job.ok()) return FromStatus(job.status());
      }
      absl::StatusOr<std::string> dir = core_->CompareJobs(route.a, route.b);
      if (!dir.ok()) return FromStatus(dir.status());
      absl::StatusOr<std::string> data = ReadFileToString(*dir + "/compare.json");
      RemoveTree(*dir).IgnoreError();
      return data.ok() ? HttpResponse{200, "application/json", std::move(*data)} : FromStatus(data.status());
    }
    default:
      return Error(404, "no such page");
  }
}

namespace {

int Handle(mg_connection* conn, void* data) {
  const auto* handler = static_cast<const DashboardHandler*>(data);
  const mg_request_info* ri = mg_get_request_info(conn);
  HttpResponse r;
  if (std::string(ri->request_method) != "GET") {
    r = HttpResponse{405, "application/json", "{\"error\":\"only GET\"}"};
  } else {
    const char* auth = mg_get_header(conn, "Authorization");
    r = handler->Get(ri->local_uri_raw != nullptr ? ri->local_uri_raw : ri->local_uri,
                     ri->query_string != nullptr ? ri->query_string : "", auth != nullptr ? auth : "");
  }
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nX-Frame-Options: SAMEORIGIN\r\nReferrer-Policy: no-referrer\r\n"
            "Content-Security-Policy: default-src 'self' 'unsafe-inline' blob: data:\r\nConnection: close\r\n\r\n",
            r.status, mg_get_response_code_text(conn, r.status), r.content_type.c_str(), r.body.size());
  mg_write(conn, r.body.data(), r.body.size());
  return r.status;
}

}  // namespace

bool DashboardCanServeTls() {
  // civetweb sets up its TLS once per process, before any server (Debian's 1.15 reports none).
  static const bool can = (mg_init_library(MG_FEATURES_TLS) & MG_FEATURES_TLS) != 0;
  return can;
}

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(const DashboardOptions& options,
                                                                       const DashboardHandler* handler) {
  std::unique_ptr<DashboardServer> server(new DashboardServer());
  server->handler_ = handler;
  const bool tls = !options.tls_cert.empty();
  const std::string ports = options.listen + (tls ? "s" : "");
  const std::string threads = absl::StrCat(options.threads);
  std::vector<const char*> opts = {"listening_ports", ports.c_str(), "num_threads", threads.c_str(),
                                   "request_timeout_ms", "10000", "max_request_size", "16384",
                                   "enable_directory_listing", "no"};
  if (tls) {
    opts.push_back("ssl_certificate");
    opts.push_back(options.tls_cert.c_str());
  }
  opts.push_back(nullptr);
  if (tls && !DashboardCanServeTls()) {
    return absl::UnavailableError("--http-listen with TLS: this civetweb cannot serve HTTPS");
  }
  mg_callbacks callbacks{};
  server->ctx_ = mg_start(&callbacks, nullptr, opts.data());
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": cannot listen (address in use, "
                                               "invalid, or TLS unavailable)"));
  }
  mg_set_request_handler(server->ctx_, "/", Handle, const_cast<DashboardHandler*>(handler));
  mg_server_port port{};
  if (mg_get_server_ports(server->ctx_, 1, &port) > 0) server->port_ = port.port;
  return server;
}

DashboardServer::~DashboardServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

}  // namespace tally
