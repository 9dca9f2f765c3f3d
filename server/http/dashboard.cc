#include "server/http/dashboard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include <civetweb.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/json_writer.h"
#include "base/log.h"
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
    // A browser's user has no command line: the page's token box is the way in.
    case absl::StatusCode::kUnauthenticated:
      return Error(401, "this tallyd needs a token: paste it into the dashboard's token box (or send "
                        "Authorization: Bearer TOKEN)");
    case absl::StatusCode::kPermissionDenied: return Error(403, std::string(s.message()));
    case absl::StatusCode::kNotFound: return Error(404, std::string(s.message()));
    case absl::StatusCode::kInvalidArgument: return Error(400, std::string(s.message()));
    case absl::StatusCode::kFailedPrecondition: return Error(409, std::string(s.message()));
    default:
      // An internal error may name tallyd's own files: the log has it, the client gets no path.
      Log("dashboard: ", s.ToString());
      return Error(500, "internal error (tallyd's log has the cause)");
  }
}

std::string ContentType(const std::string& file) {
  if (absl::EndsWith(file, ".json")) return "application/json";
  if (absl::EndsWith(file, ".csv")) return "text/csv; charset=utf-8";
  if (absl::EndsWith(file, ".html")) return "text/html; charset=utf-8";
  return "text/markdown; charset=utf-8";
}

}  // namespace

HttpResponse DashboardHandler::ReportFile(const std::string& dir, const std::string& what,
                                          const std::string& file) const {
  const std::string missing = absl::StrCat(what, " has no ", file, " (not every job writes every file, a follow "
                                           "writes its curve once a checkpoint is seen)");
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return Error(404, missing);
  // O_NOFOLLOW: a symlink put in the folder is not followed; O_NONBLOCK: a FIFO is not waited on.
  const int fd = openat(dfd, file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  close(dfd);
  if (fd < 0) return Error(404, missing);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Error(404, absl::StrCat(what, ": ", file, " is not a regular file"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  data.resize(got);
  return HttpResponse{200, ContentType(file), std::move(data)};
}

HttpResponse DashboardHandler::Follows(const Caller& caller, const DashboardRoute& route) const {
  if (route.kind == DashboardRoute::Kind::kFollows) {
    return Json(follows_ == nullptr ? v1::ListFollowsResponse() : VisibleFollows(*follows_, caller));
  }
  // Another owner's follow is not found, as over gRPC.
  absl::StatusOr<v1::Follow> f = follows_ != nullptr ? VisibleFollow(*follows_, caller, route.follow_id)
                                                     : absl::NotFoundError(absl::StrCat("no follow '", route.follow_id, "'"));
  if (!f.ok()) return FromStatus(f.status());
  if (route.kind == DashboardRoute::Kind::kFollow) return Json(*f);
  return ReportFile(follows_->ReportFolder(route.follow_id), absl::StrCat("follow ", route.follow_id), route.file);
}

HttpResponse DashboardHandler::Session(absl::string_view authorization) const {
  if (!auth_->enabled()) return HttpResponse{200, "application/json", "{\"tokens_required\":false,\"authenticated\":true}"};
  absl::StatusOr<Caller> caller = auth_->Check(authorization, Api::kCoordinator);
  JsonWriter w;
  w.BeginObject().Field("tokens_required", true).Field("authenticated", caller.ok());
  if (caller.ok()) {
    w.Field("name", caller->name);
  } else if (!authorization.empty()) {
    w.Field("error", "that token was refused: paste the whole token `tally token` wrote (not its sha256 line)");
  }
  w.EndObject();
  return HttpResponse{200, "application/json", w.str()};
}

HttpResponse DashboardHandler::Get(absl::string_view path, absl::string_view query, absl::string_view authorization,
                                   absl::string_view host) const {
  if (!HostAllowed(host, host_names_)) {
    return Error(403, absl::StrCat("Host '", host.substr(0, 100), "' is not a name this dashboard answers to (an IP ",
                                   "address, localhost, its own name, or tallyd --http-allowed-hosts)"));
  }
  const DashboardRoute route = ParseDashboardRequest(path, query);
  using Kind = DashboardRoute::Kind;
  if (route.kind == Kind::kPage) return HttpResponse{200, "text/html; charset=utf-8", kDashboardPage};
  if (route.kind == Kind::kFavicon) return HttpResponse{204, "image/x-icon", ""};
  if (route.kind == Kind::kSession) return Session(authorization);
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
      return ReportFile(*dir, absl::StrCat("job ", route.job_id), route.file);
    }
    case Kind::kFollows:
    case Kind::kFollow:
    case Kind::kFollowFile:
      return Follows(*caller, route);
    case Kind::kWorkers:
      return Json(VisibleWorkers(core_, *caller));
    case Kind::kCompare: {
      absl::StatusOr<std::string> a = ResolveVisibleJobId(core_, *caller, route.a);
      if (!a.ok()) return FromStatus(a.status());
      absl::StatusOr<std::string> b = ResolveVisibleJobId(core_, *caller, route.b);
      if (!b.ok()) return FromStatus(b.status());
      absl::StatusOr<std::string> dir = core_->CompareJobs(*a, *b);
      if (!dir.ok()) return FromStatus(dir.status());
      absl::StatusOr<std::string> data = ReadFileToString(*dir + "/compare.json");
      RemoveTree(*dir).IgnoreError();
      return data.ok() ? HttpResponse{200, "application/json", std::move(*data)} : Error(500, "comparison not written");
    }
    default:
      return Error(404, "no such page");
  }
}

namespace {

// A response's headers, then its body in pieces: a client that stops reading is dropped by
// civetweb's write timeout, and one that reads too slowly by the deadline (a second per 256 KiB
// past the first 30 s).
void Send(mg_connection* conn, const HttpResponse& r) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nX-Frame-Options: SAMEORIGIN\r\nReferrer-Policy: no-referrer\r\n"
            "Content-Security-Policy: default-src 'self' 'unsafe-inline' blob: data:\r\nConnection: close\r\n\r\n",
            r.status, mg_get_response_code_text(conn, r.status), r.content_type.c_str(), r.body.size());
  constexpr size_t kPiece = 256 << 10;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30 + r.body.size() / kPiece);
  for (size_t at = 0; at < r.body.size(); at += kPiece) {
    if (mg_write(conn, r.body.data() + at, std::min(kPiece, r.body.size() - at)) <= 0) return;
    if (std::chrono::steady_clock::now() > deadline) return;
  }
}

int Handle(mg_connection* conn, void* data) {
  auto* server = static_cast<DashboardServer*>(data);
  const mg_request_info* ri = mg_get_request_info(conn);
  const std::string client = ri->remote_addr;
  HttpResponse r;
  if (!server->Admit(client)) {
    r = Error(429, "too many requests in progress from this address");
  } else {
    if (std::string(ri->request_method) != "GET") {
      r = Error(405, "only GET");
    } else if (ri->local_uri_raw == nullptr) {
      r = Error(400, "not a path of this server");
    } else {
      const char* auth = mg_get_header(conn, "Authorization");
      const char* host = mg_get_header(conn, "Host");
      // civetweb leaves the path as received (decode_url no): it is decoded once, by the router.
      r = server->handler()->Get(ri->local_uri_raw, ri->query_string != nullptr ? ri->query_string : "",
                                 auth != nullptr ? auth : "", host != nullptr ? host : "");
    }
    server->Release(client);
  }
  Send(conn, r);
  return r.status;
}

// civetweb's own errors (a malformed request line, an unsupported HTTP version, headers too long)
// as the dashboard's JSON errors.
int CivetwebError(mg_connection* conn, int status, const char* message) {
  Send(conn, Error(status, message != nullptr ? message : "bad request"));
  return 0;
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
  const std::string timeout = absl::StrCat(options.header_timeout_ms);
  server->max_requests_per_client_ = options.max_requests_per_client;
  // request_timeout_ms bounds reading a request's headers (in all, from the connection's start) and
  // each stalled write; decode_url no: the router decodes the path once.
  std::vector<const char*> opts = {"listening_ports", ports.c_str(), "num_threads", threads.c_str(),
                                   "request_timeout_ms", timeout.c_str(), "max_request_size", "16384",
                                   "enable_directory_listing", "no", "decode_url", "no",
                                   "enable_keep_alive", "no", "listen_backlog", "1024"};
  if (tls) {
    opts.push_back("ssl_certificate");
    opts.push_back(options.tls_cert.c_str());
  }
  opts.push_back(nullptr);
  if (tls && !DashboardCanServeTls()) {
    return absl::UnavailableError("--http-listen with TLS: this civetweb cannot serve HTTPS");
  }
  mg_callbacks callbacks{};
  callbacks.http_error = CivetwebError;
  server->ctx_ = mg_start(&callbacks, nullptr, opts.data());
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": cannot listen (address in use, "
                                               "invalid, or TLS unavailable)"));
  }
  mg_set_request_handler(server->ctx_, "/", Handle, server.get());
  mg_server_port port{};
  if (mg_get_server_ports(server->ctx_, 1, &port) > 0) server->port_ = port.port;
  return server;
}

DashboardServer::~DashboardServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

bool DashboardServer::Admit(const std::string& client) {
  absl::MutexLock lock(&mu_);
  int& n = in_progress_[client];
  if (n >= max_requests_per_client_) return false;
  ++n;
  return true;
}

void DashboardServer::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = in_progress_.find(client);
  if (it != in_progress_.end() && --it->second <= 0) in_progress_.erase(it);
}

}  // namespace tally
