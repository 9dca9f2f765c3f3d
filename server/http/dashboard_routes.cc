#include "server/http/dashboard_routes.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tally {
namespace {

constexpr size_t kMaxQuery = 4096;
constexpr const char* kFiles[] = {"report.json", "per_image.csv", "summary.md", "report.html", "summary.json",
                                  "lesions.csv", "groups.csv"};
constexpr const char* kFollowFiles[] = {"curve.csv", "curve.json", "curve.html"};

bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  }
  return id != "." && id != "..";
}

DashboardRoute Bad(std::string why) {
  DashboardRoute r;
  r.kind = DashboardRoute::Kind::kBadRequest;
  r.error = std::move(why);
  return r;
}

// The query's parameters, decoded; false (with `error`) on a malformed one.
bool ParseQuery(absl::string_view query, std::vector<std::pair<std::string, std::string>>* out, std::string* error) {
  if (query.size() > kMaxQuery) {
    *error = absl::StrCat("query longer than ", kMaxQuery, " bytes");
    return false;
  }
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    std::string key, value;
    if (!PercentDecode(kv.first, true, &key) || !PercentDecode(kv.second, true, &value)) {
      *error = "malformed percent-encoding in the query";
      return false;
    }
    out->emplace_back(std::move(key), std::move(value));
  }
  return true;
}

DashboardRoute JobsRoute(const std::vector<std::pair<std::string, std::string>>& params) {
  DashboardRoute r;
  r.kind = DashboardRoute::Kind::kJobs;
  for (const auto& [key, value] : params) {
    if (key == "state") {
      static const char* kStates[] = {"", "queued", "running", "succeeded", "failed", "cancelled"};
      bool known = false;
      for (const char* s : kStates) known |= value == s;
      if (!known) return Bad(absl::StrCat("state: expected queued, running, succeeded, failed or cancelled"));
      r.state = value;
    } else if (key == "label") {
      std::pair<std::string, std::string> kv = absl::StrSplit(value, absl::MaxSplits('=', 1));
      if (kv.first.empty() || kv.first.size() > 256 || kv.second.size() > 256) return Bad("label: expected KEY=VALUE");
      r.labels[kv.first] = kv.second;
    } else if (key == "owner") {
      if (value.size() > 256) return Bad("owner: too long");
      r.owner = value;
    } else if (key == "limit") {
      if (!absl::SimpleAtoi(value, &r.limit) || r.limit < 1 || r.limit > 1000) return Bad("limit: expected 1 to 1000");
    } else if (key == "page_token") {
      if (!value.empty() && !ValidId(value)) return Bad("page_token: not a job id");
      r.page_token = value;
    }
  }
  return r;
}

// /api/follows/<rest>: ID or ID/files/NAME.
DashboardRoute FollowRoute(absl::string_view rest) {
  std::vector<std::string> parts = absl::StrSplit(rest, '/');
  DashboardRoute r;
  std::string id;
  if (parts.empty() || !PercentDecode(parts[0], false, &id) || !ValidId(id)) return Bad("not a follow id");
  r.follow_id = id;
  if (parts.size() == 1) {
    r.kind = DashboardRoute::Kind::kFollow;
    return r;
  }
  if (parts.size() == 3 && parts[1] == "files") {
    for (const char* f : kFollowFiles) {
      if (parts[2] == f) {
        r.kind = DashboardRoute::Kind::kFollowFile;
        r.file = f;
        return r;
      }
    }
  }
  return DashboardRoute{};  // kNotFound.
}

}  // namespace

bool PercentDecode(absl::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      int v = 0;
      if (i + 2 >= in.size()) return false;  // Fewer than two hex digits follow.
      for (int k = 1; k <= 2; ++k) {
        const char h = in[i + k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= h - '0';
        else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
        else return false;
      }
      c = static_cast<char>(v);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return false;
    out->push_back(c);
  }
  return true;
}

bool HostAllowed(absl::string_view host, const std::vector<std::string>& names) {
  if (host.empty() || host.size() > 255) return false;
  absl::string_view name = host;
  if (name.front() == '[') {  // An IPv6 literal, [addr] or [addr]:port.
    const size_t close = name.find(']');
    if (close == absl::string_view::npos) return false;
    const absl::string_view rest = name.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || rest.size() == 1)) return false;
    for (char c : rest.substr(std::min<size_t>(1, rest.size()))) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
    for (char c : name.substr(1, close - 1)) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
    }
    return close > 1;
  }
  if (const size_t colon = name.rfind(':'); colon != absl::string_view::npos) {
    for (char c : name.substr(colon + 1)) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
    name = name.substr(0, colon);
  }
  if (name.empty()) return false;
  // Dotted IPv4: four numbers of at most three digits.
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  bool ipv4 = parts.size() == 4;
  for (absl::string_view p : parts) {
    // Digits only: SimpleAtoi alone takes "0 " (it trims whitespace), and a Host of "0.0.0 .0" passed.
    int v = 0;
    ipv4 = ipv4 && !p.empty() && p.size() <= 3 &&
           std::all_of(p.begin(), p.end(), [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) &&
           absl::SimpleAtoi(p, &v) && v <= 255;
  }
  if (ipv4) return true;
  if (absl::EqualsIgnoreCase(name, "localhost")) return true;
  for (const std::string& n : names) {
    if (!n.empty() && absl::EqualsIgnoreCase(name, n)) return true;
  }
  return false;
}

DashboardRoute ParseDashboardRequest(absl::string_view path, absl::string_view query) {
  if (path == "/" || path == "/index.html" || path == "/api/session" || path == "/favicon.ico") {
    DashboardRoute r;
    r.kind = path == "/api/session"   ? DashboardRoute::Kind::kSession
             : path == "/favicon.ico" ? DashboardRoute::Kind::kFavicon
                                      : DashboardRoute::Kind::kPage;
    return r;
  }
  std::vector<std::pair<std::string, std::string>> params;
  std::string error;
  if (!ParseQuery(query, &params, &error)) return Bad(error);
  if (path == "/api/jobs") return JobsRoute(params);
  if (path == "/api/workers") {
    DashboardRoute r;
    r.kind = DashboardRoute::Kind::kWorkers;
    return r;
  }
  if (path == "/api/compare") {
    DashboardRoute r;
    r.kind = DashboardRoute::Kind::kCompare;
    for (const auto& [key, value] : params) {
      if (key == "a") r.a = value;
      if (key == "b") r.b = value;
    }
    if (!ValidId(r.a) || !ValidId(r.b)) return Bad("compare: expected a=JOB&b=JOB");
    return r;
  }
  if (path == "/api/follows") {
    DashboardRoute r;
    r.kind = DashboardRoute::Kind::kFollows;
    return r;
  }
  if (absl::StartsWith(path, "/api/follows/")) return FollowRoute(path.substr(13));
  if (absl::StartsWith(path, "/api/jobs/")) {
    std::vector<std::string> parts = absl::StrSplit(path.substr(10), '/');
    DashboardRoute r;
    std::string id;
    if (parts.empty() || !PercentDecode(parts[0], false, &id) || !ValidId(id)) return Bad("not a job id");
    r.job_id = id;
    if (parts.size() == 1) {
      r.kind = DashboardRoute::Kind::kJob;
      return r;
    }
    if (parts.size() == 3 && parts[1] == "files") {
      for (const char* f : kFiles) {
        if (parts[2] == f) {
          r.kind = DashboardRoute::Kind::kJobFile;
          r.file = f;
          return r;
        }
      }
    }
  }
  return DashboardRoute{};  // kNotFound.
}

}  // namespace tally
