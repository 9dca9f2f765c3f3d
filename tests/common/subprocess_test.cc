// Children of Tally's processes: the environment they are given.
#include "common/process/subprocess.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(WithHugePageMallocTest, AddsTheTunableOnceAndKeepsTheUsersOwn) {
  EXPECT_EQ(WithHugePageMalloc(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(WithHugePageMalloc(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(WithHugePageMalloc("glibc.malloc.arena_max=2"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  // The user's own setting of it stands, 0 (off) included.
  EXPECT_EQ(WithHugePageMalloc("glibc.malloc.hugetlb=0"), "glibc.malloc.hugetlb=0");
  EXPECT_EQ(WithHugePageMalloc("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2");
  // A tunable whose name only starts the same is another one.
  EXPECT_EQ(WithHugePageMalloc("glibc.malloc.hugetlbx=1"), "glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1");
}

// What a child of Spawn sees in GLIBC_TUNABLES, given the parent's value (null: unset).
std::string ChildTunables(const char* parent, bool keep) {
  if (parent == nullptr) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", parent, 1);
  }
  const std::string out = ::testing::TempDir() + "/subprocess_test_tunables";
  std::remove(out.c_str());
  SpawnOptions options;
  options.argv = {"/bin/sh", "-c", "printf '%s' \"${GLIBC_TUNABLES-unset}\" > \"$1\"", "sh", out};
  options.keep_malloc_tunables = keep;
  auto child = Subprocess::Spawn(options);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return "";
  for (int i = 0; i < 500 && (*child)->Running(); ++i) usleep(10000);
  unsetenv("GLIBC_TUNABLES");
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SubprocessTest, ChildrenGetHugePageMallocUnlessKeptAsTheyAre) {
  EXPECT_EQ(ChildTunables(nullptr, false), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(ChildTunables("glibc.malloc.arena_max=4", false), "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1");
  EXPECT_EQ(ChildTunables("glibc.malloc.hugetlb=0", false), "glibc.malloc.hugetlb=0");
  EXPECT_EQ(ChildTunables(nullptr, true), "unset");
  EXPECT_EQ(ChildTunables("glibc.malloc.arena_max=4", true), "glibc.malloc.arena_max=4");
}

}  // namespace
}  // namespace tally
