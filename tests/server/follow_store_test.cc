// Follows in tallyd's database (server/follow/follow_store.h): what is saved is what a reopened
// database (a restarted tallyd) loads, one record a follow, beside the other service state.
#include "server/follow/follow_store.h"

#include "store_fixture.h"

namespace tally {
namespace {

class FollowStoreTest : public StoreFixture {
 protected:
  FollowStoreTest() : StoreFixture("follow_store") {}
};

v1::Follow MakeFollow(const std::string& id, int checkpoints) {
  v1::Follow f;
  f.set_follow_id(id);
  f.set_state(v1::Follow::FOLLOW_STATE_FOLLOWING);
  f.mutable_spec()->set_folder("/runs/" + id);
  f.mutable_spec()->mutable_job()->set_manifest("/data/val.csv");
  for (int i = 0; i < checkpoints; ++i) {
    v1::FollowCheckpoint* c = f.add_checkpoints();
    c->set_name("ckpt-" + std::to_string(i) + ".pt");
    c->set_step(100 * i);
    c->set_state(i == 0 ? "best" : "worse");
    c->set_race_rows(12 * i);
  }
  f.set_best_step(0);
  return f;
}

TEST_F(FollowStoreTest, FollowsSurviveAReopenAndAreReplacedWhole) {
  ASSERT_TRUE(SaveFollow(store_.get(), MakeFollow("f2", 1)).ok());
  ASSERT_TRUE(SaveFollow(store_.get(), MakeFollow("f1", 3)).ok());
  ASSERT_TRUE(store_->PutState("handoff", "not a follow").ok());  // Other service state: not listed.
  ASSERT_TRUE(store_->PutState("followers", "nor this").ok());
  ASSERT_TRUE(SaveFollow(store_.get(), MakeFollow("f2", 2)).ok());  // Replaced, not added.
  store_.reset();
  absl::StatusOr<std::unique_ptr<JobStore>> reopened = JobStore::Open(dir_ + "/state.db");
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  store_ = std::move(*reopened);
  absl::StatusOr<std::vector<v1::Follow>> follows = LoadFollows(store_.get());
  ASSERT_TRUE(follows.ok()) << follows.status();
  ASSERT_EQ(follows->size(), 2u);
  EXPECT_EQ((*follows)[0].follow_id(), "f1");
  EXPECT_EQ((*follows)[0].checkpoints_size(), 3);
  EXPECT_EQ((*follows)[0].checkpoints(2).race_rows(), 24);
  EXPECT_EQ((*follows)[1].checkpoints_size(), 2);
  EXPECT_EQ((*follows)[1].spec().job().manifest(), "/data/val.csv");
  ASSERT_TRUE(DeleteFollow(store_.get(), "f1").ok());
  follows = LoadFollows(store_.get());
  ASSERT_TRUE(follows.ok());
  ASSERT_EQ(follows->size(), 1u);
  EXPECT_EQ((*follows)[0].follow_id(), "f2");
  ASSERT_TRUE(store_->PutState("follow/f3", "\xff\xff garbage").ok());
  EXPECT_TRUE(absl::IsDataLoss(LoadFollows(store_.get()).status()));
}

}  // namespace
}  // namespace tally
