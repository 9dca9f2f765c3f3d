// Tokens, their hashes and the data roots: values checked against sha256sum / NIST vectors and
// against a folder tree with symlinks made here.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "common/security/auth_tokens.h"
#include "common/security/data_roots.h"
#include "base/file_util.h"
#include "common/security/sha256.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(Sha256Test, MatchesPublishedVectors) {
  // FIPS 180-4 examples and `printf %s ... | sha256sum`.
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 55, 56 and 64 bytes: the padding's edge cases.
  EXPECT_EQ(Sha256Hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(Sha256Hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The same million bytes from a file, read in blocks (`head -c 1000000 ... | sha256sum`).
  char dir[] = "/tmp/tally-sha-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/a";
  std::ofstream(file) << std::string(1000000, 'a');
  EXPECT_EQ(Sha256FileHex(file), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(Sha256FileHex(std::string(dir) + "/missing"), "");
  EXPECT_EQ(Sha256FileHex(dir), "");  // A folder.
  RemoveTree(dir).IgnoreError();
}

// The x86 SHA extensions' path (where the CPU has them) against the portable rounds: random
// inputs of every length up to 300 bytes and a few large ones, split across blocks every way.
TEST(Sha256Test, ShaExtensionsEqualThePortableRounds) {
  std::mt19937 rng(5);
  for (size_t n : {0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1000, 4096, 100003}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(Sha256(data), Sha256Portable(data)) << n;
  }
  for (size_t n = 0; n < 300; ++n) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(Sha256(data), Sha256Portable(data)) << n;
  }
  EXPECT_EQ(Sha256Portable("abc"), Sha256("abc"));
}

TEST(TokenTableTest, FindsHolderByHashAndRole) {
  const std::string alice = "tally_alice-secret", ops = "tally_ops-secret";
  const std::string text = "# comment\n\n" + TokenLine("alice", Role::kClient, alice) + "\n" +
                           TokenLine("ops", Role::kAdmin, ops) + "\n";
  // The file holds hashes only.
  EXPECT_EQ(text.find(alice), std::string::npos);
  auto table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  auto who = table->Find(alice);
  ASSERT_TRUE(who.has_value());
  EXPECT_EQ(who->name, "alice");
  EXPECT_EQ(who->role, Role::kClient);
  EXPECT_EQ(table->Find(ops)->role, Role::kAdmin);
  EXPECT_FALSE(table->Find("tally_alice-secreT").has_value());
  EXPECT_FALSE(table->Find("").has_value());
}

TEST(TokenTableTest, ErrorsNameTheLineNotItsContent) {
  const std::string hash(64, 'a');
  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"alice client\n", "line 1: 2 fields"},
      {"\nalice root sha256:" + hash + "\n", "line 2: the role must be client, worker or admin"},
      {"alice client " + hash + "\n", "line 1: the third field must be sha256:"},
      {"alice client sha256:" + hash.substr(1) + "\n", "line 1: the third field"},
      {"al/ice client sha256:" + hash + "\n", "line 1: the name must be"},
      {"a client sha256:" + hash + "\nb admin sha256:" + std::string(64, 'b') + "\na worker sha256:" +
           std::string(64, 'c') + "\n",
       "line 3: the name is already used on line 1"},
  };
  for (const Case& c : cases) {
    auto table = TokenTable::Parse(c.text, "/etc/tally/tokens");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_NE(table.status().message().find("tokens file '/etc/tally/tokens' " + c.expected), std::string::npos)
        << table.status().message();
    EXPECT_EQ(table.status().message().find(hash), std::string::npos);
  }
}

TEST(TokenTest, NewTokensAreLongRandomAndUrlSafe) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = NewToken();
    ASSERT_EQ(t.size(), 6u + 43u);  // "tally_" and 256 bits in base64url.
    EXPECT_EQ(t.rfind("tally_", 0), 0u);
    for (char c : t.substr(6)) EXPECT_TRUE(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(TokenTest, ReadTokenPrefersTheFileThenTheEnvironment) {
  char dir[] = "/tmp/tally-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/t";
  std::ofstream(file) << "  tally_from-file \nignored\n";
  setenv("TALLY_TOKEN", "tally_from-env", 1);
  EXPECT_EQ(*ReadToken(file), "tally_from-file");
  EXPECT_EQ(*ReadToken(""), "tally_from-env");
  unsetenv("TALLY_TOKEN");
  EXPECT_EQ(*ReadToken(""), "");
  EXPECT_FALSE(ReadToken(std::string(dir) + "/missing").ok());
  RemoveTree(dir).IgnoreError();
}

class DataRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally-roots-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    base_ = dir;
    ASSERT_TRUE(MakeDirs(base_ + "/data/set").ok());
    ASSERT_TRUE(MakeDirs(base_ + "/private").ok());
    std::ofstream(base_ + "/data/set/a.png") << "x";
    std::ofstream(base_ + "/private/secret") << "root:*:20228";
    symlink((base_ + "/private/secret").c_str(), (base_ + "/data/set/escape.png").c_str());
    symlink((base_ + "/data/set/a.png").c_str(), (base_ + "/private/link-in.png").c_str());
    symlink((base_ + "/data").c_str(), (base_ + "/data-link").c_str());
    auto roots = DataRoots::Create({base_ + "/data-link"});  // Kept resolved: base/data.
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *roots;
  }
  void TearDown() override {
    SetProcessDataRoots(DataRoots());
    RemoveTree(base_).IgnoreError();
  }

  bool Allowed(const std::string& rel) { return roots_.Resolve(base_ + rel).ok(); }

  std::string base_;
  DataRoots roots_;
};

TEST_F(DataRootsTest, ResolvesSymlinksBeforeDeciding) {
  EXPECT_EQ(roots_.roots().size(), 1u);
  EXPECT_TRUE(Allowed("/data/set/a.png"));
  EXPECT_TRUE(Allowed("/data-link/set/a.png"));      // Through a link to the root itself.
  EXPECT_TRUE(Allowed("/private/link-in.png"));      // A link outside pointing in: its target counts.
  EXPECT_FALSE(Allowed("/data/set/escape.png"));     // A link inside pointing out.
  EXPECT_FALSE(Allowed("/private/secret"));
  EXPECT_FALSE(Allowed("/data/../private/secret"));
  EXPECT_FALSE(Allowed("/data2"));                   // A sibling sharing the prefix.
  EXPECT_FALSE(roots_.Resolve("/etc/shadow").ok());
  EXPECT_FALSE(roots_.Resolve("/proc/self/environ").ok());
}

TEST_F(DataRootsTest, MissingFilesAreJudgedByWhereTheyWouldBe) {
  EXPECT_TRUE(Allowed("/data/set/missing.png"));           // Inside: its own "not found" follows.
  EXPECT_TRUE(Allowed("/data/new/dir/missing.png"));
  EXPECT_FALSE(Allowed("/private/missing.png"));
  EXPECT_FALSE(Allowed("/data/new/../../private/secret"));  // ".." after a missing folder.
  EXPECT_FALSE(roots_.Resolve("/nonexistent/x.csv").ok());
  const absl::Status s = roots_.Resolve("/nonexistent/x.csv").status();
  EXPECT_TRUE(IsOutsideDataRoots(s));
  EXPECT_EQ(s.message(), "outside the allowed data roots");
}

TEST_F(DataRootsTest, OpenRegularFileEnforcesTheProcessRoots) {
  SetProcessDataRoots(roots_);
  auto inside = OpenRegularFile(base_ + "/data/set/a.png");
  ASSERT_TRUE(inside.ok()) << inside.status();
  close(inside->fd);
  // Outside: the same error whether the file exists, is a folder or is missing.
  for (const std::string& p : {base_ + "/private/secret", base_ + "/private", base_ + "/private/none",
                               base_ + "/data/set/escape.png"}) {
    auto f = OpenRegularFile(p);
    ASSERT_FALSE(f.ok()) << p;
    EXPECT_TRUE(IsOutsideDataRoots(f.status())) << f.status();
    EXPECT_EQ(f.status().message(), "outside the allowed data roots");
  }
  // Inside, the usual distinctions stay.
  EXPECT_TRUE(absl::IsNotFound(OpenRegularFile(base_ + "/data/set/none.png").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(OpenRegularFile(base_ + "/data/set").status()));
  EXPECT_EQ(OutsideDataRootsError("image", "/etc/shadow").message(),
            "image '/etc/shadow': outside the allowed data roots");
}

TEST(DataRootsCreateTest, RootsMustBeFolders) {
  EXPECT_FALSE(DataRoots::Create({"/nonexistent-root"}).ok());
  EXPECT_FALSE(DataRoots::Create({"/etc/hostname"}).ok());
  auto none = DataRoots::Create({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(*none->Resolve("/etc/shadow"), "/etc/shadow");  // No roots: everything, unchanged.
}

}  // namespace
}  // namespace tally
