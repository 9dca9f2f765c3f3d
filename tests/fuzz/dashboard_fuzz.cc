// The dashboard's request parser (server/http/dashboard_routes.h) on arbitrary paths and queries: no
// crash, and whatever it accepts is safe to use: a job id of letters, digits, '-', '_' and '.' only
// (never "." or ".."), a report file from the fixed list, a page size in 1..1000.
#include <set>
#include <string>

#include "fuzz_util.h"
#include "server/http/dashboard_routes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = FuzzInput(data, size);
  const size_t split = text.find('?');
  const std::string path = text.substr(0, split);
  const std::string query = split == std::string::npos ? "" : text.substr(split + 1);
  const tally::DashboardRoute r = tally::ParseDashboardRequest(path, query);
  using Kind = tally::DashboardRoute::Kind;
  for (const std::string* id : {&r.job_id, &r.a, &r.b, &r.page_token}) {
    for (char c : *id) {
      FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                 c == '.');
    }
    FUZZ_CHECK(*id != "." && *id != "..");
  }
  if (r.kind == Kind::kJob || r.kind == Kind::kJobFile) FUZZ_CHECK(!r.job_id.empty());
  if (r.kind == Kind::kJobFile) {
    static const std::set<std::string> kFiles = {"report.json", "per_image.csv", "summary.md", "report.html",
                                                 "summary.json", "lesions.csv"};
    FUZZ_CHECK(kFiles.count(r.file) == 1);
  }
  if (r.kind == Kind::kJobs) FUZZ_CHECK(r.limit >= 1 && r.limit <= 1000);
  if (r.kind == Kind::kBadRequest) FUZZ_CHECK(!r.error.empty());
  // Host headers (DNS rebinding): an allowed one is an address, localhost or the given name.
  if (tally::HostAllowed(text, {"tally-box"})) {
    FUZZ_CHECK(text.find('/') == std::string::npos && text.find('\0') == std::string::npos);
    FUZZ_CHECK(text.find(' ') == std::string::npos);
  }
  std::string decoded;
  if (tally::PercentDecode(query, true, &decoded)) FUZZ_CHECK(decoded.find('\0') == std::string::npos);
  return 0;
}
