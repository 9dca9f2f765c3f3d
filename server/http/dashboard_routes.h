// The dashboard's requests (docs/operations.md "Dashboard"), parsed without the HTTP server or the coordinator
// so that the parser can be tested and fuzzed on its own (tests/fuzz/dashboard_fuzz.cc). Only GET:
//   /                          the page (HTML, CSS and script served by tallyd; no data in it)
//   /api/jobs?state=S&label=K=V&owner=O&limit=N&page_token=T   a page of jobs (ListJobs)
//   /api/jobs/ID               one job (GetJob), live estimates included
//   /api/jobs/ID/files/NAME    a finished job's report file (report.json, per_image.csv, ...)
//   /api/workers               the workers (ListWorkers)
//   /api/compare?a=ID&b=ID     two finished jobs of one manifest compared (compare.json); ids or unique prefixes
//   /api/follows               the follows (ListFollows)
//   /api/follows/ID            one follow (GetFollow): its checkpoints with their metrics, the page's curve
//   /api/follows/ID/files/NAME its curve.csv, curve.json or curve.html
//   /api/session               whether tokens are needed and whether the request's token is good (never 401:
//                              the page asks here first, so that a first load logs no error)
//   /favicon.ico               204: there is none
#ifndef TALLY_SERVER_HTTP_DASHBOARD_ROUTES_H_
#define TALLY_SERVER_HTTP_DASHBOARD_ROUTES_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tally {

struct DashboardRoute {
  enum class Kind {
    kPage, kJobs, kJob, kJobFile, kWorkers, kCompare, kFollows, kFollow, kFollowFile, kSession, kFavicon, kNotFound,
    kBadRequest
  };
  Kind kind = Kind::kNotFound;
  std::string error;  // kBadRequest: why.
  std::string job_id, file;  // kJob, kJobFile; file also kFollowFile.
  std::string follow_id;      // kFollow, kFollowFile.
  // kJobs
  std::string state, owner, page_token;
  std::map<std::string, std::string> labels;
  int limit = 50;
  // kCompare
  std::string a, b;
};

// `path` is the request's path, `query` what follows '?', both as received (percent-encoded).
DashboardRoute ParseDashboardRequest(absl::string_view path, absl::string_view query);

// Percent-decoding ('+' is a space in queries); false on a malformed escape or a NUL.
bool PercentDecode(absl::string_view in, bool plus_is_space, std::string* out);

// Whether a request's Host header may be answered (DNS rebinding: a web page whose own name was
// made to resolve to this machine must not read the dashboard through the visitor's browser). Its
// host part (the port aside) must be an IP address (v4, or v6 in brackets: no name was resolved),
// "localhost", or one of `names` (the listen address's name, this machine's name,
// --http-allowed-hosts), compared without case. An empty or missing Host is refused.
bool HostAllowed(absl::string_view host, const std::vector<std::string>& names);

}  // namespace tally

#endif  // TALLY_SERVER_HTTP_DASHBOARD_ROUTES_H_
