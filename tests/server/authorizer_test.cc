// Who may call what: roles against the two services, unknown and missing tokens, reloads.
#include "server/access/authorizer.h"

#include <unistd.h>

#include <fstream>

#include "base/file_util.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

class AuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally-auth-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    file_ = dir_ + "/tokens";
    Write({TokenLine("alice", Role::kClient, "tally_a"), TokenLine("ops", Role::kAdmin, "tally_o"),
           TokenLine("gpu-1", Role::kWorker, "tally_w")});
    auto a = Authorizer::Create(file_);
    ASSERT_TRUE(a.ok()) << a.status();
    auth_ = *std::move(a);
  }
  void TearDown() override { RemoveTree(dir_).IgnoreError(); }
  void Write(const std::vector<std::string>& lines) {
    std::ofstream out(file_);
    for (const std::string& l : lines) out << l << "\n";
  }

  std::string dir_, file_;
  std::unique_ptr<Authorizer> auth_;
};

TEST_F(AuthorizerTest, RolesMapToServices) {
  auto alice = auth_->Check("Bearer tally_a", Api::kCoordinator);
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_FALSE(alice->sees_all);
  EXPECT_TRUE(alice->CanSee("alice"));
  EXPECT_FALSE(alice->CanSee("bob"));
  EXPECT_FALSE(alice->CanSee(""));  // Jobs submitted before tokens were turned on: admins only.
  auto ops = auth_->Check("bearer  tally_o ", Api::kCoordinator);
  ASSERT_TRUE(ops.ok());
  EXPECT_TRUE(ops->CanSee("bob"));
  EXPECT_TRUE(auth_->Check("Bearer tally_w", Api::kWorkerControl).ok());

  EXPECT_TRUE(absl::IsPermissionDenied(auth_->Check("Bearer tally_a", Api::kWorkerControl).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(auth_->Check("Bearer tally_o", Api::kWorkerControl).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(auth_->Check("Bearer tally_w", Api::kCoordinator).status()));
  for (const char* bad : {"", "Bearer", "Bearer ", "tally_a", "Basic tally_a", "Bearer tally_x"}) {
    EXPECT_TRUE(absl::IsUnauthenticated(auth_->Check(bad, Api::kCoordinator).status())) << bad;
  }
}

TEST_F(AuthorizerTest, ReloadSwapsTokensAndKeepsBuiltInOnes) {
  auth_->AddToken("spawned", Role::kWorker, "tally_spawned");
  Write({TokenLine("bob", Role::kClient, "tally_b")});
  ASSERT_TRUE(auth_->Reload().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(auth_->Check("Bearer tally_a", Api::kCoordinator).status()));
  EXPECT_EQ(auth_->Check("Bearer tally_b", Api::kCoordinator)->name, "bob");
  EXPECT_TRUE(auth_->Check("Bearer tally_spawned", Api::kWorkerControl).ok());
  // A broken file leaves the previous tokens in force.
  Write({"bob client not-a-hash"});
  EXPECT_FALSE(auth_->Reload().ok());
  EXPECT_EQ(auth_->Check("Bearer tally_b", Api::kCoordinator)->name, "bob");
}

TEST(AuthorizerOpenTest, WithoutTokensEveryCallIsAllowedAndSeesAll) {
  auto a = Authorizer::Create("");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->enabled());
  auto c = (*a)->Check("", Api::kWorkerControl);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->sees_all);
  EXPECT_FALSE(Authorizer::Create("/nonexistent/tokens").ok());
}

}  // namespace
}  // namespace tally
