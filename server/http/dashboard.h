// tallyd's web dashboard (README "Dashboard"): `--http-listen HOST:PORT` serves a read-only page and
// the JSON it is built from, through civetweb (Debian's libcivetweb, the library prometheus-cpp
// embeds; no hand-written HTTP parsing), with the same tokens as gRPC (`Authorization: Bearer`;
// a client token sees only its own jobs) and, when tallyd has a certificate, the same TLS.
#ifndef TALLY_SERVER_HTTP_DASHBOARD_H_
#define TALLY_SERVER_HTTP_DASHBOARD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/access/authorizer.h"
#include "server/coordinator/coordinator.h"

struct mg_context;

namespace tally {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// The page's HTML (dashboard_page.cc): markup, style and script in one, nothing fetched from elsewhere.
extern const char* const kDashboardPage;

// What a GET answers, HTTP server aside (tests call it directly).
class DashboardHandler {
 public:
  DashboardHandler(Coordinator* core, const Authorizer* auth) : core_(core), auth_(auth) {}
  HttpResponse Get(absl::string_view path, absl::string_view query, absl::string_view authorization) const;

 private:
  Coordinator* core_;
  const Authorizer* auth_;
};

struct DashboardOptions {
  std::string listen;     // host:port; port 0 picks a free one.
  std::string tls_cert;   // PEM certificate and key in one file for civetweb, or empty: plain HTTP.
  int threads = 4;
};

// Whether this process's civetweb can serve HTTPS.
bool DashboardCanServeTls();

class DashboardServer {
 public:
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(const DashboardOptions& options,
                                                               const DashboardHandler* handler);
  ~DashboardServer();
  int port() const { return port_; }

 private:
  DashboardServer() = default;
  mg_context* ctx_ = nullptr;
  const DashboardHandler* handler_ = nullptr;
  int port_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_HTTP_DASHBOARD_H_
