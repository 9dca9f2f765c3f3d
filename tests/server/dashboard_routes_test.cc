// The dashboard's request checks that need no server (server/http/dashboard_routes.h): the Host
// header against DNS rebinding, and paths decoded once with the NUL check live.
#include "server/http/dashboard_routes.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(DashboardRoutesTest, HostMustBeAnAddressLocalhostOrAKnownName) {
  const std::vector<std::string> names = {"tally-box", "dash.example.org"};
  for (const char* ok : {"127.0.0.1:8080", "127.0.0.1", "10.1.2.3:80", "localhost:8080", "LOCALHOST", "[::1]:8080",
                         "[::1]", "[fe80::1]:1", "tally-box:8080", "Dash.Example.Org"}) {
    EXPECT_TRUE(HostAllowed(ok, names)) << ok;
  }
  for (const char* bad : {"", "evil.example.com", "evil.example.com:8080", "127.0.0.1.evil.com", "1.2.3", "256.1.1.1",
                          "[::1", "[::1]x", "[::1]:8 80", "[::1]:", "localhost.evil.com", "tally-box.evil.com", "127.0.0.1:80x", ":8080",
                          "0.00.0 .02", "1.2.3.4 ", "1.2. 3.4", "1.2.3.+4"}) {
    EXPECT_FALSE(HostAllowed(bad, names)) << bad;
  }
}

TEST(DashboardRoutesTest, PathsAreDecodedOnceAndANulIsRefused) {
  // %00 anywhere in a job id or a file name: refused, not cut short.
  EXPECT_EQ(ParseDashboardRequest("/api/jobs/abc%00garbage/files/report.json", "").kind,
            DashboardRoute::Kind::kBadRequest);
  EXPECT_EQ(ParseDashboardRequest("/api/jobs/abc/files/report.json%00../../tally.db", "").kind,
            DashboardRoute::Kind::kNotFound);
  // Decoded once: %256a is "%6a", no job id; %6a is "j".
  EXPECT_EQ(ParseDashboardRequest("/api/jobs/%256a", "").kind, DashboardRoute::Kind::kBadRequest);
  const DashboardRoute r = ParseDashboardRequest("/api/jobs/%6Aob", "");
  EXPECT_EQ(r.kind, DashboardRoute::Kind::kJob);
  EXPECT_EQ(r.job_id, "job");
  EXPECT_EQ(ParseDashboardRequest("/api/jobs", "state=run%00ning").kind, DashboardRoute::Kind::kBadRequest);
}

TEST(DashboardRoutesTest, FollowsTheirCurvesAndNothingElse) {
  EXPECT_EQ(ParseDashboardRequest("/api/follows", "").kind, DashboardRoute::Kind::kFollows);
  DashboardRoute r = ParseDashboardRequest("/api/follows/f20261206-1", "");
  EXPECT_EQ(r.kind, DashboardRoute::Kind::kFollow);
  EXPECT_EQ(r.follow_id, "f20261206-1");
  r = ParseDashboardRequest("/api/follows/f1/files/curve.csv", "");
  EXPECT_EQ(r.kind, DashboardRoute::Kind::kFollowFile);
  EXPECT_EQ(r.follow_id, "f1");
  EXPECT_EQ(r.file, "curve.csv");
  // A follow serves its curve files only: not a job's files, not a path out of its folder.
  for (const char* missing : {"/api/follows/f1/files/report.json", "/api/follows/f1/files/../../tally.db",
                              "/api/follows/f1/files", "/api/follows/f1/curve.csv"}) {
    EXPECT_EQ(ParseDashboardRequest(missing, "").kind, DashboardRoute::Kind::kNotFound) << missing;
  }
  for (const char* bad : {"/api/follows/..", "/api/follows/", "/api/follows/f%001", "/api/follows/a%2Fb"}) {
    EXPECT_EQ(ParseDashboardRequest(bad, "").kind, DashboardRoute::Kind::kBadRequest) << bad;
  }
}

}  // namespace
}  // namespace tally
