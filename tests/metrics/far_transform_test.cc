// The GPU's pieces of the far queries' separable transform (metrics/far_transform.h), run one
// after another on the host as the device's threads run them, against the CPU's transform
// (FinishDirected3D with every query far: SeparableDistances3D), bit for bit. The device runs the
// same code (tests/metrics/surface3d_kernel_test.cc checks the whole device path on a GPU); this
// test holds the arithmetic to the CPU's on every machine.
#include "metrics/far_transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/surface_distance.h"
#include "tests/metrics/prediction_kinds.h"

namespace tally {
namespace {

using far_transform::Envelope;
using far_transform::Geometry;

// The host's stand-in for the device's orchestration: box, column index, rows and slices, then
// every y-pass thread and every x-pass thread.
std::vector<double> FarByPieces(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, int depth,
                                int height, int width, double sz, double sy, double sx) {
  Geometry g;
  g.plane = static_cast<int64_t>(height) * width;
  g.width = width;
  g.sz = sz, g.sy = sy, g.sx = sx;
  int64_t y0 = height, y1 = -1, x0 = width, x1 = -1;
  for (const auto* set : {&queries, &features}) {
    for (int64_t i : *set) {
      const int64_t y = i % g.plane / width, x = i % width;
      y0 = std::min(y0, y), y1 = std::max(y1, y), x0 = std::min(x0, x), x1 = std::max(x1, x);
    }
  }
  g.y0 = y0, g.x0 = x0, g.H = static_cast<int>(y1 - y0 + 1), g.W = static_cast<int>(x1 - x0 + 1);
  // Column index: keys col * depth + z sorted, as the device sorts them.
  std::vector<int64_t> keys;
  for (int64_t i : features) {
    const int64_t z = i / g.plane, y = i % g.plane / width, x = i % width;
    keys.push_back(((y - y0) * g.W + (x - x0)) * depth + z);
  }
  std::sort(keys.begin(), keys.end());
  const int64_t area = static_cast<int64_t>(g.H) * g.W;
  std::vector<int64_t> col_start(area + 1);
  for (int64_t c = 0; c <= area; ++c) {
    col_start[c] = std::lower_bound(keys.begin(), keys.end(), c * depth) - keys.begin();
  }
  std::vector<int32_t> fz(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) fz[k] = static_cast<int32_t>(keys[k] % depth);
  // Rows (first query of each (z, y)) and slices (first row of each z).
  std::vector<int64_t> row_first, slice_first;
  for (size_t k = 0; k < queries.size(); ++k) {
    if (k == 0 || queries[k] / width != queries[k - 1] / width) row_first.push_back(static_cast<int64_t>(k));
  }
  for (size_t i = 0; i < row_first.size(); ++i) {
    if (i == 0 || queries[row_first[i]] / g.plane != queries[row_first[i - 1]] / g.plane) {
      slice_first.push_back(static_cast<int64_t>(i));
    }
  }
  row_first.push_back(static_cast<int64_t>(queries.size()));
  slice_first.push_back(static_cast<int64_t>(row_first.size() - 1));
  const int64_t rows_n = static_cast<int64_t>(row_first.size() - 1);
  std::vector<int32_t> row_y(rows_n);
  for (int64_t i = 0; i < rows_n; ++i) row_y[i] = static_cast<int32_t>(queries[row_first[i]] % g.plane / width - y0);
  std::vector<far_transform::RowBest> best(rows_n * g.W);
  // Envelope storage as the device lays it out: thread t's entry k at [k * threads + t].
  const int64_t threads = static_cast<int64_t>(g.W);
  const int most = std::max(g.H, g.W) + 1;
  std::vector<int32_t> v(most * threads);
  std::vector<double> z(most * threads);
  std::vector<int32_t> gz(area);  // Step 1 for a slice: every column's z offset, by row.
  for (size_t s = 0; s + 1 < slice_first.size(); ++s) {
    const int64_t first = slice_first[s], n = slice_first[s + 1] - first;
    const int64_t slice = queries[row_first[first]] / g.plane;
    for (int64_t c = 0; c < area; ++c) gz[c] = far_transform::NearestZ(fz.data(), col_start[c], col_start[c + 1], slice);
    for (int cx = 0; cx < g.W; ++cx) {
      far_transform::YPassColumn(g, gz.data() + cx, row_y.data() + first, n, best.data() + first * g.W + cx,
                                 Envelope{v.data() + cx, z.data() + cx, threads});
    }
  }
  std::vector<double> out(queries.size(), -1.0);
  std::vector<int64_t> out_at(queries.size());
  for (size_t k = 0; k < queries.size(); ++k) out_at[k] = static_cast<int64_t>(k);
  for (int64_t i = 0; i < rows_n; ++i) {
    const int t = static_cast<int>(i % threads);
    far_transform::XPassRow(g, row_y[i], best.data() + i * g.W, queries.data() + row_first[i],
                            row_first[i + 1] - row_first[i],
                            out_at.data() + row_first[i], out.data(), Envelope{v.data() + t, z.data() + t, threads});
  }
  return out;
}

std::vector<int64_t> RandomVoxels(std::mt19937& rng, int64_t n, double density) {
  std::vector<int64_t> out;
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < n; ++i) {
    if (u(rng) < density) out.push_back(i);
  }
  return out;
}

TEST(FarTransformTest, PiecesGiveTheCpuTransformBitForBit) {
  std::mt19937 rng(31);
  const double spacings[] = {0.5, 0.8, 1.0, 1.3, 2.5, 3.0};
  for (int trial = 0; trial < 150; ++trial) {
    const int d = 1 + rng() % 24, h = 1 + rng() % 30, w = 1 + rng() % 30;
    const int64_t n = static_cast<int64_t>(d) * h * w;
    // Sparse features (a few columns, sometimes one voxel) and queries anywhere, the sets apart or mixed.
    std::vector<int64_t> features = RandomVoxels(rng, n, trial % 4 == 0 ? 0.002 : 0.03);
    if (features.empty()) features.push_back(static_cast<int64_t>(rng() % n));
    std::vector<int64_t> queries = RandomVoxels(rng, n, trial % 5 == 0 ? 0.5 : 0.1);
    if (trial % 3 == 1) {  // Queries in one corner block only: a box smaller than the volume.
      queries.erase(std::remove_if(queries.begin(), queries.end(),
                                   [&](int64_t i) { return i % w > w / 2 || i / w % h > h / 3; }),
                    queries.end());
    }
    if (queries.empty()) continue;
    const SurfaceOptions3D o = trial % 4 == 2 ? SurfaceOptions3D{1, 1, 1, 1}
                                              : SurfaceOptions3D{spacings[rng() % 6], spacings[rng() % 6],
                                                                 spacings[rng() % 6], 1};
    NearSearch3D none;  // Nothing found near: every query goes to the CPU's separable transform.
    none.near.assign(queries.size(), 0);
    none.found.assign(queries.size(), 0);
    none.cost.assign(queries.size(), 0);
    std::vector<double> cpu;
    FinishDirected3D(queries, features, d, h, w, o, none, &cpu);
    const std::vector<double> pieces =
        FarByPieces(queries, features, d, h, w, o.spacing_z, o.spacing_y, o.spacing_x);
    ASSERT_EQ(cpu.size(), pieces.size());
    for (size_t k = 0; k < cpu.size(); ++k) {
      ASSERT_EQ(std::memcmp(&cpu[k], &pieces[k], sizeof(double)), 0)
          << "trial " << trial << " query " << k << ": cpu " << cpu[k] << " pieces " << pieces[k];
    }
  }
}

// The kinds of prediction models make (tests/metrics/prediction_kinds.h): each class's two
// directions with every query sent to the transform, the pieces against the CPU's bit for bit, and
// every 29th query against the nearest feature by brute force (independent of both).
TEST(FarTransformTest, PiecesGiveTheCpuTransformOnEveryKindOfPrediction) {
  std::mt19937 rng(45);
  const int labels = 4, d = 18, h = 34, w = 30;
  const SurfaceOptions3D o{2.5, 0.8, 0.8, 1};
  int directions = 0;
  for (test::PredictionKind kind : test::kPredictionKinds) {
    for (int trial = 0; trial < 2; ++trial) {
      const test::LabelVolume ref = test::OrganVolume(rng, d, h, w, labels);
      const test::LabelVolume pred = test::PredictionOf(rng, ref, labels, kind);
      for (uint16_t c = 0; c < labels; ++c) {
        const std::vector<int64_t> edges[2] = {test::EdgeVoxels(pred, c), test::EdgeVoxels(ref, c)};
        for (int m = 0; m < 2; ++m) {
          const std::vector<int64_t>& queries = edges[m];
          const std::vector<int64_t>& features = edges[1 - m];
          if (queries.empty() || features.empty()) continue;
          ++directions;
          NearSearch3D none;
          none.near.assign(queries.size(), 0);
          none.found.assign(queries.size(), 0);
          none.cost.assign(queries.size(), 0);
          std::vector<double> cpu;
          FinishDirected3D(queries, features, d, h, w, o, none, &cpu);
          const std::vector<double> pieces = FarByPieces(queries, features, d, h, w, o.spacing_z, o.spacing_y,
                                                         o.spacing_x);
          ASSERT_EQ(cpu.size(), pieces.size());
          for (size_t k = 0; k < cpu.size(); ++k) {
            ASSERT_EQ(std::memcmp(&cpu[k], &pieces[k], sizeof(double)), 0)
                << test::KindName(kind) << " class " << c << " direction " << m << " query " << k;
          }
          for (size_t k = 0; k < queries.size(); k += 29) {
            const int64_t q = queries[k];
            double best = 1e300;
            for (int64_t f : features) {
              const double dz = (q / (h * w) - f / (h * w)) * o.spacing_z;
              const double dy = (q / w % h - f / w % h) * o.spacing_y, dx = (q % w - f % w) * o.spacing_x;
              best = std::min(best, dz * dz + dy * dy + dx * dx);
            }
            EXPECT_NEAR(cpu[k], std::sqrt(best), 1e-12 * (1 + std::sqrt(best)))
                << test::KindName(kind) << " class " << c << " direction " << m << " query " << k;
          }
        }
      }
    }
  }
  EXPECT_GE(directions, 70);  // 5 kinds x 2 trials x 4 classes x 2, less the empty class's.
}

TEST(FarTransformTest, NearestZTakesTheLaterFeatureOnATie) {
  const int32_t fz[] = {2, 6, 10};
  EXPECT_EQ(far_transform::NearestZ(fz, 0, 3, 4), 2);   // 2 and 6 both 2 away: the later.
  EXPECT_EQ(far_transform::NearestZ(fz, 0, 3, 3), -1);  // 2 is nearer.
  EXPECT_EQ(far_transform::NearestZ(fz, 0, 3, 12), -2);
  EXPECT_EQ(far_transform::NearestZ(fz, 0, 3, 0), 2);
  EXPECT_EQ(far_transform::NearestZ(fz, 1, 1, 5), far_transform::kNoZ);
}

// ArgMin's galloping search against a walk through the same envelope, and the site it names against a
// brute-force minimum of f(p) + (q - p)^2 (integer costs: exact in doubles), for rows of every
// density: one query, a few far apart, every position.
TEST(FarTransformTest, ArgMinFindsTheWalksEntryAndALeastCostSite) {
  std::mt19937 rng(45);
  int rows = 0;
  for (int n : {1, 2, 7, 64, 513}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<double> f(n);
      std::uniform_int_distribution<int> cost(0, trial % 2 == 0 ? 4 : 400);
      for (double& c : f) c = (rng() % 5 == 0) ? far_transform::Infinity() : cost(rng);
      std::vector<int32_t> v(n + 1);
      std::vector<double> z(n + 2);
      Envelope env{v.data(), z.data(), 1};
      env.Build(far_transform::ArrayCosts{f.data()}, n, 1.0);
      std::vector<int> queries;
      for (int q = 0; q < n; ++q) {
        if (trial % 3 == 0 || rng() % (1 + trial % 7 * 20) == 0) queries.push_back(q);
      }
      int walk = 0;
      for (int q : queries) {
        const int site = env.ArgMin(q);
        double least = far_transform::Infinity();
        for (int p = 0; p < n; ++p) least = std::min(least, f[p] + double(q - p) * (q - p));
        if (least == far_transform::Infinity()) {
          EXPECT_EQ(site, -1);
          continue;
        }
        while (z[walk + 1] < q) ++walk;
        ASSERT_EQ(site, v[walk]) << "n " << n << " trial " << trial << " q " << q;
        ASSERT_EQ(f[site] + double(q - site) * (q - site), least) << "n " << n << " trial " << trial << " q " << q;
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 200);
}

}  // namespace
}  // namespace tally
