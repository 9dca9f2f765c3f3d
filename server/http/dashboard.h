// tallyd's web dashboard (docs/operations.md "Dashboard"): `--http-listen HOST:PORT` serves a read-only page and
// the JSON it is built from, through civetweb (Debian's libcivetweb, the library prometheus-cpp
// embeds; no hand-written HTTP parsing), with the same tokens as gRPC (`Authorization: Bearer`;
// a client token sees only its own jobs) and, when tallyd has a certificate, the same TLS.
#ifndef TALLY_SERVER_HTTP_DASHBOARD_H_
#define TALLY_SERVER_HTTP_DASHBOARD_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "server/access/authorizer.h"
#include "server/coordinator/coordinator.h"
#include "server/follow/follow_manager.h"
#include "server/http/dashboard_routes.h"

struct mg_context;

namespace tally {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// The page's HTML (dashboard_page.cc): markup, style and script in one, nothing fetched from elsewhere.
extern const char* const kDashboardPage;

// What a GET answers, HTTP server aside (tests call it directly). `host_names`: the names a Host
// header may give besides IP addresses and "localhost" (HostAllowed, dashboard_routes.h). `follows`:
// tallyd's follows, or null (then /api/follows is empty and a follow is not found).
class DashboardHandler {
 public:
  DashboardHandler(Coordinator* core, const Authorizer* auth, std::vector<std::string> host_names = {},
                   const FollowManager* follows = nullptr)
      : core_(core), auth_(auth), host_names_(std::move(host_names)), follows_(follows) {}
  // `path` and `query` as received (percent-encoded: decoded once, here), `host` the Host header.
  HttpResponse Get(absl::string_view path, absl::string_view query, absl::string_view authorization,
                   absl::string_view host) const;

 private:
  // A file of `dir` (a job's report folder, a follow's), opened only if it is a regular file directly
  // in it (no symlink followed, no FIFO opened). `what` names the job or follow; errors never name
  // the state folder.
  HttpResponse ReportFile(const std::string& dir, const std::string& what, const std::string& file) const;
  // /api/follows, /api/follows/ID and its files: those `caller` may see.
  HttpResponse Follows(const Caller& caller, const DashboardRoute& route) const;
  // /api/session: whether tokens are needed and whether `authorization`'s is good; never 401.
  HttpResponse Session(absl::string_view authorization) const;

  Coordinator* core_;
  const Authorizer* auth_;
  const std::vector<std::string> host_names_;
  const FollowManager* const follows_;
};

// Sized so that idle or slow clients cannot starve the dashboard (SECURITY.md "Dashboard"): a
// connection that has not sent its request headers within header_timeout_ms is closed (idle
// sockets and slowloris hold a thread that long at most), threads are many, one client address
// has at most max_requests_per_client requests in progress (more: 429), and a response must be
// taken within its time (a client that stops reading is dropped).
struct DashboardOptions {
  std::string listen;     // host:port; port 0 picks a free one.
  std::string tls_cert;   // PEM certificate and key in one file for civetweb, or empty: plain HTTP.
  int threads = 64;
  int header_timeout_ms = 2000;
  int max_requests_per_client = 8;
};

// Whether this process's civetweb can serve HTTPS.
bool DashboardCanServeTls();

class DashboardServer {
 public:
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(const DashboardOptions& options,
                                                               const DashboardHandler* handler);
  ~DashboardServer();
  int port() const { return port_; }

  // Per-client admission (civetweb's request threads): false when `client` has
  // max_requests_per_client requests in progress already.
  bool Admit(const std::string& client) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& client) ABSL_LOCKS_EXCLUDED(mu_);
  const DashboardHandler* handler() const { return handler_; }

 private:
  DashboardServer() = default;
  mg_context* ctx_ = nullptr;
  const DashboardHandler* handler_ = nullptr;
  int port_ = 0;
  int max_requests_per_client_ = 8;
  absl::Mutex mu_;
  std::map<std::string, int> in_progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_HTTP_DASHBOARD_H_
