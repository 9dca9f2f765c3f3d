// Connected components (metrics/connected_components.h): hand-worked neighbourhoods in 2D and 3D,
// and random masks against a flood fill written here (components started in scan order, so its
// numbering is the documented one).
#include "metrics/connected_components.h"

#include <deque>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

std::vector<int32_t> Label(const std::vector<uint8_t>& m, int d, int h, int w, int connectivity, int64_t* count) {
  std::vector<int32_t> labels;
  absl::StatusOr<int64_t> n = LabelComponents(m.data(), d, h, w, connectivity, &labels);
  EXPECT_TRUE(n.ok()) << n.status();
  *count = n.ok() ? *n : -1;
  return labels;
}

TEST(ConnectedComponentsTest, TwoDimensionalDiagonals) {
  // 1 0 0
  // 0 1 1
  // 1 0 0
  const std::vector<uint8_t> m = {1, 0, 0, 0, 1, 1, 1, 0, 0};
  int64_t n = 0;
  EXPECT_EQ(Label(m, 1, 3, 3, 4, &n), (std::vector<int32_t>{1, 0, 0, 0, 2, 2, 3, 0, 0}));
  EXPECT_EQ(n, 3);
  EXPECT_EQ(Label(m, 1, 3, 3, 8, &n), (std::vector<int32_t>{1, 0, 0, 0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(n, 1);
}

TEST(ConnectedComponentsTest, ThreeDimensionalFacesEdgesCorners) {
  // Two voxels sharing an edge (z and y differ), and one sharing only a corner with the second.
  const int d = 3, h = 3, w = 3;
  std::vector<uint8_t> m(d * h * w, 0);
  auto at = [&](int z, int y, int x) -> uint8_t& { return m[(z * h + y) * w + x]; };
  at(0, 0, 0) = 1;
  at(1, 1, 0) = 1;  // Edge with (0, 0, 0).
  at(2, 2, 1) = 1;  // Corner with (1, 1, 0).
  int64_t n = 0;
  Label(m, d, h, w, 6, &n);
  EXPECT_EQ(n, 3);
  std::vector<int32_t> l = Label(m, d, h, w, 18, &n);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(l[(1 * h + 1) * w + 0], 1);
  EXPECT_EQ(l[(2 * h + 2) * w + 1], 2);
  Label(m, d, h, w, 26, &n);
  EXPECT_EQ(n, 1);
  std::vector<int32_t> unused;
  EXPECT_FALSE(LabelComponents(m.data(), d, h, w, 8, &unused).ok());
  EXPECT_FALSE(LabelComponents(m.data(), 1, 9, 3, 26, &unused).ok());
}

TEST(ConnectedComponentsTest, UShapesMergeUnderTheFirstVoxelsNumber) {
  // Two arms that meet only at the bottom: provisional labels merge; numbers follow first voxels.
  // 0 1 0 1
  // 0 1 0 1
  // 1 1 1 1
  // 0 0 0 0
  // 1 0 0 0
  const std::vector<uint8_t> m = {0, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0};
  int64_t n = 0;
  const std::vector<int32_t> l = Label(m, 1, 5, 4, 4, &n);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(l, (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 0, 0, 0}));
}

// Flood fill from each unlabelled voxel in scan order.
std::vector<int32_t> FloodFill(const std::vector<uint8_t>& m, int d, int h, int w, int connectivity) {
  std::vector<int32_t> out(m.size(), 0);
  const int most = d > 1 ? (connectivity == 6 ? 1 : connectivity == 18 ? 2 : 3) : (connectivity == 4 ? 1 : 2);
  int32_t next = 0;
  for (size_t start = 0; start < m.size(); ++start) {
    if (!m[start] || out[start]) continue;
    out[start] = ++next;
    std::deque<size_t> queue = {start};
    while (!queue.empty()) {
      const size_t i = queue.front();
      queue.pop_front();
      const int z = static_cast<int>(i / (h * w)), y = static_cast<int>(i / w % h), x = static_cast<int>(i % w);
      for (int dz = -1; dz <= 1; ++dz) {
        for (int dy = -1; dy <= 1; ++dy) {
          for (int dx = -1; dx <= 1; ++dx) {
            const int order = (dz != 0) + (dy != 0) + (dx != 0);
            if (order == 0 || order > most || (d == 1 && dz != 0)) continue;
            const int zz = z + dz, yy = y + dy, xx = x + dx;
            if (zz < 0 || zz >= d || yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
            const size_t j = (static_cast<size_t>(zz) * h + yy) * w + xx;
            if (m[j] && !out[j]) {
              out[j] = next;
              queue.push_back(j);
            }
          }
        }
      }
    }
  }
  return out;
}

TEST(ConnectedComponentsTest, RandomMasksEqualAFloodFill) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 200; ++trial) {
    const bool volume = trial % 2 == 0;
    const int d = volume ? 2 + static_cast<int>(rng() % 6) : 1;
    const int h = 1 + static_cast<int>(rng() % 9), w = 1 + static_cast<int>(rng() % 9);
    const int density = 2 + static_cast<int>(rng() % 5);
    std::vector<uint8_t> m(static_cast<size_t>(d) * h * w);
    for (uint8_t& v : m) v = rng() % density == 0 ? 0 : (rng() % 2);
    for (int connectivity : volume ? std::vector<int>{6, 18, 26} : std::vector<int>{4, 8}) {
      int64_t n = 0;
      const std::vector<int32_t> got = Label(m, d, h, w, connectivity, &n);
      const std::vector<int32_t> want = FloodFill(m, d, h, w, connectivity);
      ASSERT_EQ(got, want) << "trial " << trial << ", connectivity " << connectivity;
      int32_t top = 0;
      for (int32_t v : want) top = std::max(top, v);
      EXPECT_EQ(n, top);
    }
  }
}

TEST(ConnectedComponentsTest, ComponentsPerLabelByHand) {
  // 1 1 0 2
  // 0 0 2 0
  // 1 9 1 1     9: above max_label 2 (an ignore value), in no component.
  const std::vector<uint16_t> m = {1, 1, 0, 2, 0, 0, 2, 0, 1, 9, 1, 1};
  // Label 0: (1,0)-(1,1) by a face, (1,1)-(0,2) and (0,2)-(1,3) by corners: one component. Label 1:
  // (0,0)-(0,1); (2,0) alone (its neighbours 0, 0, 9); (2,2)-(2,3): three. Label 2: (0,3)-(1,2): one.
  EXPECT_EQ(CountComponentsPerLabel(m.data(), 1, 3, 4, 2), (std::vector<int64_t>{1, 3, 1}));
  EXPECT_EQ(CountComponentsPerLabel(m.data(), 1, 3, 4, -1), (std::vector<int64_t>{}));
}

TEST(ConnectedComponentsTest, ComponentsPerLabelEqualTheBinaryCountOfEachLabel) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    const bool volume = trial % 2 == 0;
    const int d = volume ? 2 + static_cast<int>(rng() % 4) : 1;
    const int h = 1 + static_cast<int>(rng() % 9), w = 1 + static_cast<int>(rng() % 9);
    const int labels = 1 + static_cast<int>(rng() % 4);
    std::vector<uint16_t> m(static_cast<size_t>(d) * h * w);
    for (uint16_t& v : m) v = static_cast<uint16_t>(rng() % (labels + 1));  // labels: the ignore value.
    const std::vector<int64_t> got = CountComponentsPerLabel(m.data(), d, h, w, labels - 1);
    ASSERT_EQ(got.size(), static_cast<size_t>(labels));
    for (int l = 0; l < labels; ++l) {
      std::vector<uint8_t> binary(m.size());
      for (size_t i = 0; i < m.size(); ++i) binary[i] = m[i] == l;
      const std::vector<int32_t> want = FloodFill(binary, d, h, w, volume ? 26 : 8);
      int32_t top = 0;
      for (int32_t v : want) top = std::max(top, v);
      EXPECT_EQ(got[l], top) << "trial " << trial << ", label " << l;
    }
  }
}

}  // namespace
}  // namespace tally
