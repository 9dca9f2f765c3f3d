#include "worker/early_cuda.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

// tally-worker starts CUDA's initialisation before main() only when its command line names a CUDA
// device; the parser runs before libstdc++ exists, so it is tested here on its own.
int Ordinal(std::vector<std::string> args) {
  args.insert(args.begin(), "tally-worker");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return EarlyCudaOrdinal(static_cast<int>(args.size()), argv.data());
}

TEST(EarlyCudaTest, FindsTheCudaDeviceOfTheCommandLine) {
  EXPECT_EQ(Ordinal({"--coordinator", "127.0.0.1:1", "--device", "cuda:0"}), 0);
  EXPECT_EQ(Ordinal({"--device=cuda:3", "--threads=4"}), 3);
  EXPECT_EQ(Ordinal({"-device", "cuda"}), 0);
  EXPECT_EQ(Ordinal({"--device", "cuda:12"}), 12);
  EXPECT_EQ(Ordinal({"--estimate", "m.pt", "--device", "cuda:1"}), 1);
  EXPECT_EQ(Ordinal({"--device=cpu", "--device=cuda:2"}), 2);  // The last one counts, as for absl flags.
}

TEST(EarlyCudaTest, StartsNothingForOtherCommandLines) {
  EXPECT_EQ(Ordinal({}), -1);
  EXPECT_EQ(Ordinal({"--device", "cpu"}), -1);
  EXPECT_EQ(Ordinal({"--device=cuda:x"}), -1);
  EXPECT_EQ(Ordinal({"--device=cuda:1x"}), -1);
  EXPECT_EQ(Ordinal({"--device=cuda:"}), -1);
  EXPECT_EQ(Ordinal({"--device=cudax"}), -1);
  EXPECT_EQ(Ordinal({"--device=cuda:99999999999999999999"}), -1);
  EXPECT_EQ(Ordinal({"--device"}), -1);                        // No value.
  EXPECT_EQ(Ordinal({"--version", "--device", "cuda:0"}), -1);  // Prints and exits.
  EXPECT_EQ(Ordinal({"--device", "cuda:0", "--helpfull"}), -1);
  EXPECT_EQ(Ordinal({"--", "--device", "cuda:0"}), -1);  // Not a flag after "--".
  EXPECT_EQ(Ordinal({"device=cuda:0"}), -1);             // Not a flag at all.
  JoinEarlyCuda();  // Nothing started: returns at once.
}

}  // namespace
}  // namespace tally
