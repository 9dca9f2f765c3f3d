// Which cores each local worker gets, from given topologies: two-socket boxes with hyperthreads,
// one-node boxes, unknown GPUs, restricted affinity; and the topology read from a fake /proc and /sys.
#include "common/process/cpu_placement.h"

#include <set>

#include "base/file_util.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

std::vector<int> Range(int a, int b) {  // [a, b]
  std::vector<int> out;
  for (int c = a; c <= b; ++c) out.push_back(c);
  return out;
}

std::vector<int> Concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

std::set<int> AsSet(const std::vector<int>& v) { return std::set<int>(v.begin(), v.end()); }

// 2 sockets x 32 cores x 2 threads, numbered as Linux numbers them on Intel servers: node 0 holds
// CPUs 0-31 and their siblings 64-95, node 1 holds 32-63 and 96-127.
struct TwoSockets {
  std::vector<int> all = Range(0, 127);
  std::vector<int> node0 = Concat(Range(0, 31), Range(64, 95));
  std::vector<int> node1 = Concat(Range(32, 63), Range(96, 127));
  std::map<int, int> core_of;
  TwoSockets() {
    for (int c = 0; c < 128; ++c) core_of[c] = c % 64;
  }
};

TEST(CpuPlacementTest, EightGpusOnTwoSocketsGetTheirNodesWholeCores) {
  TwoSockets box;
  std::vector<std::vector<int>> near;
  for (int g = 0; g < 8; ++g) near.push_back(g < 4 ? box.node0 : box.node1);
  const auto placed = PlaceWorkers(8, box.all, near, box.core_of);
  ASSERT_EQ(placed.size(), 8u);
  std::set<int> used;
  for (int w = 0; w < 8; ++w) {
    // Cores 8w..8w+7 of the socket's 32, each with its sibling: worker 5 gets 40-47 and 104-111.
    const int first = (w < 4 ? 0 : 32) + 8 * (w % 4);
    EXPECT_EQ(AsSet(placed[w]), AsSet(Concat(Range(first, first + 7), Range(first + 64, first + 71)))) << "worker " << w;
    for (int c : placed[w]) EXPECT_TRUE(used.insert(c).second) << "CPU " << c << " given twice";
  }
  EXPECT_EQ(used.size(), 128u);
}

TEST(CpuPlacementTest, GpusOfOneSocketLeaveTheOtherSocketsCoresUnused) {
  TwoSockets box;
  const std::vector<std::vector<int>> near(4, box.node0);
  const auto placed = PlaceWorkers(4, box.all, near, box.core_of);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(AsSet(placed[w]), AsSet(Concat(Range(8 * w, 8 * w + 7), Range(64 + 8 * w, 64 + 8 * w + 7))));
  }
}

TEST(CpuPlacementTest, OneNodeBoxSplitsContiguously) {
  // The four-H200 box of BENCHMARKS.md: every GPU's affinity is 0-63, no hyperthreads.
  const std::vector<std::vector<int>> near(4, Range(0, 63));
  const auto placed = PlaceWorkers(4, Range(0, 63), near, {});
  for (int w = 0; w < 4; ++w) EXPECT_EQ(placed[w], Range(16 * w, 16 * w + 15));
}

TEST(CpuPlacementTest, UnknownGpusOrCpuWorkersSplitEverythingAllowed) {
  TwoSockets box;
  const auto cpu_workers = PlaceWorkers(2, box.all, {}, box.core_of);
  // Whole cores: worker 0 gets cores 0-31 (CPUs 0-31 and 64-95), i.e. socket 0 by numbering.
  EXPECT_EQ(AsSet(cpu_workers[0]), AsSet(box.node0));
  EXPECT_EQ(AsSet(cpu_workers[1]), AsSet(box.node1));
  // One GPU's node unknown: no NUMA placement for anybody.
  std::vector<std::vector<int>> near = {box.node0, {}};
  EXPECT_EQ(PlaceWorkers(2, box.all, near, box.core_of), cpu_workers);
  // Odd counts: 3 workers over 10 cores get 3, 3 and 4.
  const auto three = PlaceWorkers(3, Range(0, 9), {}, {});
  EXPECT_EQ(three[0], Range(0, 2));
  EXPECT_EQ(three[1], Range(3, 5));
  EXPECT_EQ(three[2], Range(6, 9));
}

TEST(CpuPlacementTest, RestrictedAffinityWithoutTheGpusNodeFallsBackToAllowed) {
  TwoSockets box;
  std::vector<std::vector<int>> near;
  for (int g = 0; g < 8; ++g) near.push_back(g < 4 ? box.node0 : box.node1);
  // taskset -c 0-15: node 1 has no allowed CPU, so its workers cannot be local; all share 0-15.
  const auto placed = PlaceWorkers(8, Range(0, 15), near, box.core_of);
  for (int w = 0; w < 8; ++w) EXPECT_EQ(placed[w], Range(2 * w, 2 * w + 1));
}

TEST(CpuPlacementTest, OverlappingLocalSetsAreNotNodes) {
  const std::vector<std::vector<int>> near = {Range(0, 7), Range(4, 11)};
  const auto placed = PlaceWorkers(2, Range(0, 11), near, {});
  EXPECT_EQ(placed[0], Range(0, 5));
  EXPECT_EQ(placed[1], Range(6, 11));
}

TEST(CpuPlacementTest, FewerCpusThanWorkersShareRoundRobin) {
  const auto placed = PlaceWorkers(3, {4, 5}, {}, {});
  EXPECT_EQ(placed[0], std::vector<int>{4});
  EXPECT_EQ(placed[1], std::vector<int>{5});
  EXPECT_EQ(placed[2], std::vector<int>{4});
}

TEST(CpuPlacementTest, ParsesKernelCpuLists) {
  EXPECT_EQ(ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(ParseCpuList("5"), std::vector<int>{5});
  EXPECT_TRUE(ParseCpuList("3-1").empty());
  EXPECT_TRUE(ParseCpuList("a").empty());
  EXPECT_TRUE(ParseCpuList("").empty());
}

void Write(const std::string& path, const std::string& text) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
}

TEST(CpuPlacementTest, ReadsEachGpusNodeFromProcAndSys) {
  const std::string root = ::testing::TempDir() + "/cpu_placement_root";
  ASSERT_TRUE(RemoveTree(root).ok());
  // Two GPUs; the directory listing order is not the bus order.
  Write(root + "/proc/driver/nvidia/gpus/0000:9a:00.0/information", "Model: H100\nGPU UUID: GPU-bbbb\n");
  Write(root + "/proc/driver/nvidia/gpus/0000:18:00.0/information", "Model: H100\nGPU UUID: GPU-aaaa\n");
  Write(root + "/sys/bus/pci/devices/0000:18:00.0/local_cpulist", "0-31,64-95\n");
  Write(root + "/sys/bus/pci/devices/0000:9a:00.0/local_cpulist", "32-63,96-127\n");
  Write(root + "/sys/devices/system/cpu/cpu3/topology/thread_siblings_list", "3,67\n");
  Write(root + "/sys/devices/system/cpu/cpu67/topology/thread_siblings_list", "3,67\n");
  EXPECT_EQ(GpuLocalCpus("0", root), Concat(Range(0, 31), Range(64, 95)));
  EXPECT_EQ(GpuLocalCpus("1", root), Concat(Range(32, 63), Range(96, 127)));
  EXPECT_EQ(GpuLocalCpus("GPU-aaaa", root), GpuLocalCpus("0", root));
  EXPECT_EQ(GpuLocalCpus(" GPU-bbbb", root), GpuLocalCpus("1", root));
  EXPECT_TRUE(GpuLocalCpus("2", root).empty());
  EXPECT_TRUE(GpuLocalCpus("MIG-1234", root).empty());
  EXPECT_TRUE(GpuLocalCpus("0", root + "/nothing").empty());
  const std::map<int, int> cores = CoreOfCpus({3, 67, 5}, root);
  EXPECT_EQ(cores, (std::map<int, int>{{3, 3}, {67, 3}}));
}

}  // namespace
}  // namespace tally
