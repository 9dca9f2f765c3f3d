// 3D surface distances and label counts against independent brute force: explicit 6-neighbour
// erosion, all-pairs distances, sorted percentiles, per-pixel counting.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/formats/decode.h"
#include "metrics/label_counts.h"
#include "metrics/surface_distance.h"
#include "common/formats/volume.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Vol {
  int d, h, w;
  std::vector<uint8_t> v;
  Vol(int d_, int h_, int w_) : d(d_), h(h_), w(w_), v(static_cast<size_t>(d_) * h_ * w_, 0) {}
  size_t I(int z, int y, int x) const { return (static_cast<size_t>(z) * h + y) * w + x; }
  bool At(int z, int y, int x) const {
    return z >= 0 && z < d && y >= 0 && y < h && x >= 0 && x < w && v[I(z, y, x)];
  }
};

struct P3 {
  int z, y, x;
};

std::vector<P3> BruteEdges(const Vol& m) {
  std::vector<P3> e;
  for (int z = 0; z < m.d; ++z)
    for (int y = 0; y < m.h; ++y)
      for (int x = 0; x < m.w; ++x)
        if (m.At(z, y, x) && !(m.At(z - 1, y, x) && m.At(z + 1, y, x) && m.At(z, y - 1, x) && m.At(z, y + 1, x) &&
                               m.At(z, y, x - 1) && m.At(z, y, x + 1)))
          e.push_back({z, y, x});
  return e;
}

std::vector<double> BruteDirected(const std::vector<P3>& from, const std::vector<P3>& to, double sz, double sy,
                                  double sx) {
  std::vector<double> out;
  for (const P3& a : from) {
    double best = kInf;
    for (const P3& b : to) {
      const double dz = sz * (a.z - b.z), dy = sy * (a.y - b.y), dx = sx * (a.x - b.x);
      best = std::min(best, std::sqrt(dz * dz + dy * dy + dx * dx));
    }
    out.push_back(best);
  }
  return out;
}

double BrutePercentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

SurfaceValues Brute(const Vol& p, const Vol& r, double sz, double sy, double sx, double tol) {
  auto ep = BruteEdges(p), er = BruteEdges(r);
  if (ep.empty() && er.empty()) return {NAN, NAN, NAN, NAN};
  if (ep.empty() || er.empty()) return {kInf, kInf, kInf, 0};
  auto a = BruteDirected(ep, er, sz, sy, sx), b = BruteDirected(er, ep, sz, sy, sx);
  SurfaceValues s;
  s.hd = std::max(*std::max_element(a.begin(), a.end()), *std::max_element(b.begin(), b.end()));
  s.hd95 = std::max(BrutePercentile(a, 0.95), BrutePercentile(b, 0.95));
  double sum = 0;
  int within = 0;
  for (double x : a) sum += x, within += x <= tol;
  for (double x : b) sum += x, within += x <= tol;
  s.assd = sum / (a.size() + b.size());
  s.nsd = static_cast<double>(within) / (a.size() + b.size());
  return s;
}

void ExpectNear(double got, double want) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got));
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, want);
  } else {
    EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, std::fabs(want)));
  }
}

// Random blobs (balls) and thin structures, some touching the border.
void Fill(Vol* m, std::mt19937* rng, int shapes) {
  std::uniform_int_distribution<int> kind(0, 2);
  for (int s = 0; s < shapes; ++s) {
    const int k = kind(*rng);
    const int cz = std::uniform_int_distribution<int>(0, m->d - 1)(*rng);
    const int cy = std::uniform_int_distribution<int>(0, m->h - 1)(*rng);
    const int cx = std::uniform_int_distribution<int>(0, m->w - 1)(*rng);
    const int r = std::uniform_int_distribution<int>(1, 5)(*rng);
    for (int z = 0; z < m->d; ++z)
      for (int y = 0; y < m->h; ++y)
        for (int x = 0; x < m->w; ++x) {
          bool in = false;
          if (k == 0) in = (z - cz) * (z - cz) + (y - cy) * (y - cy) + (x - cx) * (x - cx) <= r * r;
          if (k == 1) in = y == cy && z == cz;                           // A line along x.
          if (k == 2) in = z == cz && std::abs(y - cy) <= r && std::abs(x - cx) <= r;  // A plate.
          if (in) m->v[m->I(z, y, x)] = 1;
        }
  }
}

TEST(SurfaceDistance3DTest, MatchesBruteForceOnRandomVolumes) {
  std::mt19937 rng(7);
  int finite = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int d = std::uniform_int_distribution<int>(1, 12)(rng);
    const int h = std::uniform_int_distribution<int>(1, 14)(rng);
    const int w = std::uniform_int_distribution<int>(1, 16)(rng);
    Vol p(d, h, w), r(d, h, w);
    Fill(&p, &rng, std::uniform_int_distribution<int>(0, 3)(rng));
    Fill(&r, &rng, std::uniform_int_distribution<int>(0, 3)(rng));
    const double sz = trial % 3 == 0 ? 2.5 : 1.0, sy = trial % 2 ? 0.7 : 1.0, sx = trial % 5 == 0 ? 1.3 : 1.0;
    const double tol = 1.5;
    const SurfaceValues got = BinarySurfaceMetrics3D(p.v.data(), r.v.data(), d, h, w, {sz, sy, sx, tol});
    const SurfaceValues want = Brute(p, r, sz, sy, sx, tol);
    finite += std::isfinite(want.hd) && want.hd > 0;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << d << "x" << h << "x" << w);
    ExpectNear(got.hd, want.hd);
    ExpectNear(got.hd95, want.hd95);
    ExpectNear(got.assd, want.assd);
    ExpectNear(got.nsd, want.nsd);
  }
  EXPECT_GT(finite, 100);  // Most trials compare real distances, not the empty cases.
}

TEST(SurfaceDistance3DTest, FarApartSurfacesTakeTheSeparablePath) {
  // Distances past the local search's box (4096 voxels) come from the separable transform.
  for (int trial = 0; trial < 4; ++trial) {
    const int d = 30 + trial, h = 34, w = 38;
    Vol p(d, h, w), r(d, h, w);
    for (int z = 0; z < d; ++z)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          if ((z - 4) * (z - 4) + (y - 5) * (y - 5) + (x - 5) * (x - 5) <= 9 + trial) p.v[p.I(z, y, x)] = 1;
          if ((z - d + 5) * (z - d + 5) + (y - h + 6) * (y - h + 6) + (x - w + 4) * (x - w + 4) <= 16) r.v[r.I(z, y, x)] = 1;
          if (trial % 2 && z == 12 && y == 3) r.v[r.I(z, y, x)] = 1;  // Plus a line: near and far queries mixed.
        }
    const double sz = trial == 2 ? 3.0 : 1.0, sy = 0.9, sx = 1.1;
    const SurfaceValues got = BinarySurfaceMetrics3D(p.v.data(), r.v.data(), d, h, w, {sz, sy, sx, 2.0});
    const SurfaceValues want = Brute(p, r, sz, sy, sx, 2.0);
    ExpectNear(got.hd, want.hd);
    ExpectNear(got.hd95, want.hd95);
    ExpectNear(got.assd, want.assd);
    ExpectNear(got.nsd, want.nsd);
  }
}

TEST(SurfaceDistance3DTest, ClassesOnSeveralThreadsGiveTheValuesOfOne) {
  // The threaded path must not change a bit (classes of very different sizes, empty ones too).
  std::mt19937 rng(12);
  const int d = 12, h = 14, w = 16, classes = 7;
  std::vector<uint16_t> pred(d * h * w), ref(d * h * w);
  for (size_t i = 0; i < pred.size(); ++i) {
    pred[i] = static_cast<uint16_t>(rng() % 3 == 0 ? rng() % classes : i % 5);
    ref[i] = rng() % 13 == 0 ? kIgnoredPixel : static_cast<uint16_t>(rng() % 4 == 0 ? rng() % classes : (i / 7) % 5);
  }
  std::vector<SurfaceValues> one, many;
  ClassSurfaceMetrics3D(pred.data(), ref.data(), d, h, w, classes, kIgnoredPixel, {1.5, 1.0, 0.7, 2.0}, &one, 1);
  for (int threads : {2, 3, 16}) {
    ClassSurfaceMetrics3D(pred.data(), ref.data(), d, h, w, classes, kIgnoredPixel, {1.5, 1.0, 0.7, 2.0}, &many, threads);
    ASSERT_EQ(many.size(), one.size());
    for (int c = 0; c < classes; ++c) {
      for (auto field : {&SurfaceValues::hd, &SurfaceValues::hd95, &SurfaceValues::assd, &SurfaceValues::nsd}) {
        const double a = one[c].*field, b = many[c].*field;
        EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0)
            << "class " << c << ", " << threads << " threads: " << a << " vs " << b;
      }
    }
  }
}

TEST(SurfaceDistance3DTest, OneLargeClassSpreadInSlabsGivesTheValuesOfOneThread) {
  // One class, thousands of edge voxels in several query chunks, most of them far from the other
  // surface (the separable transform, in groups of slices) and some near: any thread count, the
  // same bits.
  std::mt19937 rng(5);
  const int d = 40, h = 48, w = 52;
  std::vector<uint16_t> pred(d * h * w, 0), ref(d * h * w, 0);
  for (int z = 0; z < d; ++z) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const size_t i = (static_cast<size_t>(z) * h + y) * w + x;
        if (z > 2 && z < 30 && y > 3 && y < 20 && x > 2 && x < 45) ref[i] = 1;
        if ((z > 20 && z < 38 && y > 28 && y < 46 && x > 10 && x < 50) || (ref[i] && rng() % 3 == 0)) pred[i] = 1;
      }
    }
  }
  std::vector<SurfaceValues> one, many;
  const SurfaceOptions3D spacing{1.3, 0.7, 0.9, 2.0};
  ClassSurfaceMetrics3D(pred.data(), ref.data(), d, h, w, 2, kIgnoredPixel, spacing, &one, 1);
  EXPECT_GT(one[1].hd, 10.0);  // Far queries: the separable path ran.
  for (int threads : {2, 5, 16}) {
    ClassSurfaceMetrics3D(pred.data(), ref.data(), d, h, w, 2, kIgnoredPixel, spacing, &many, threads);
    for (int c = 0; c < 2; ++c) {
      for (auto field : {&SurfaceValues::hd, &SurfaceValues::hd95, &SurfaceValues::assd, &SurfaceValues::nsd}) {
        const double a = one[c].*field, b = many[c].*field;
        EXPECT_TRUE(std::memcmp(&a, &b, sizeof a) == 0) << "class " << c << ", " << threads << " threads: " << a
                                                        << " vs " << b;
      }
    }
  }
}

TEST(SurfaceDistance3DTest, ClassesLeaveIgnoredVoxelsOut) {
  // Class c's masks are label == c with ignored reference voxels cleared in both.
  std::mt19937 rng(11);
  const int d = 7, h = 9, w = 10, classes = 3;
  std::vector<uint16_t> pred(d * h * w), ref(d * h * w);
  for (size_t i = 0; i < pred.size(); ++i) {
    pred[i] = rng() % classes;
    ref[i] = rng() % 9 == 0 ? kIgnoredPixel : rng() % classes;
  }
  std::vector<SurfaceValues> got;
  ClassSurfaceMetrics3D(pred.data(), ref.data(), d, h, w, classes, kIgnoredPixel, {2.0, 1.0, 0.5, 1.0}, &got);
  ASSERT_EQ(got.size(), 3u);
  for (int c = 0; c < classes; ++c) {
    Vol p(d, h, w), r(d, h, w);
    for (size_t i = 0; i < pred.size(); ++i) {
      if (ref[i] == kIgnoredPixel) continue;
      p.v[i] = pred[i] == c;
      r.v[i] = ref[i] == c;
    }
    const SurfaceValues want = Brute(p, r, 2.0, 1.0, 0.5, 1.0);
    ExpectNear(got[c].hd, want.hd);
    ExpectNear(got[c].hd95, want.hd95);
    ExpectNear(got[c].assd, want.assd);
    ExpectNear(got[c].nsd, want.nsd);
  }
}

TEST(LabelCountsTest, ClassesAndRegionsMatchPerPixelCounting) {
  std::mt19937 rng(3);
  const int n = 5000, classes = 5;
  std::vector<uint16_t> pred(n), ref(n);
  for (int i = 0; i < n; ++i) {
    pred[i] = rng() % classes;
    ref[i] = rng() % 11 == 0 ? kIgnoredPixel : rng() % classes;
  }
  std::vector<ConfusionCounts> got;
  CountClasses(pred.data(), ref.data(), n, classes, &got);
  const std::vector<std::vector<int>> regions = {{1, 2}, {2}, {0, 3, 4}};
  std::vector<ConfusionCounts> got_regions;
  CountRegions(pred.data(), ref.data(), n, regions, &got_regions);
  auto check = [&](const ConfusionCounts& c, auto in) {
    int64_t tp = 0, fp = 0, fn = 0, tn = 0;
    for (int i = 0; i < n; ++i) {
      if (ref[i] == kIgnoredPixel) continue;
      const bool a = in(pred[i]), b = in(ref[i]);
      tp += a && b;
      fp += a && !b;
      fn += !a && b;
      tn += !a && !b;
    }
    EXPECT_EQ(c.tp, tp);
    EXPECT_EQ(c.fp, fp);
    EXPECT_EQ(c.fn, fn);
    EXPECT_EQ(c.tn, tn);
  };
  for (int c = 0; c < classes; ++c) check(got[c], [c](int v) { return v == c; });
  for (size_t r = 0; r < regions.size(); ++r) {
    check(got_regions[r], [&](int v) { return std::count(regions[r].begin(), regions[r].end(), v) > 0; });
  }
}

TEST(VolumeIoTest, RoundTripsEveryIntegerTypeAndBothFormats) {
  const std::string dir = ::testing::TempDir();
  VolumeGeometry g;
  g.depth = 3;
  g.height = 4;
  g.width = 5;
  g.spacing = {2.5, 0.8, 0.7};
  g.affine_source = "pixdim";
  std::vector<uint16_t> labels(60);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint16_t>(i % 7);
  int k = 0;
  for (int dt : {2, 4, 8, 16, 256, 512, 768, 1024, 1280}) {
    for (bool nifti2 : {false, true}) {
      const std::string path = dir + "/v" + std::to_string(k++) + (nifti2 ? ".nii" : ".nii.gz");
      ASSERT_TRUE(WriteNiftiLabels(path, g, labels.data(), dt, nifti2).ok());
      LabelMap m;
      VolumeGeometry got;
      absl::Status s = LoadNiftiLabels(path, int64_t{1} << 28, &m, &got);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(m.labels, labels) << "datatype " << dt;
      EXPECT_EQ(m.depth, 3);
      EXPECT_EQ(m.height, 4);
      EXPECT_EQ(m.width, 5);
      EXPECT_DOUBLE_EQ(got.spacing[0], 2.5);
      EXPECT_NEAR(got.spacing[1], 0.8, 1e-6);
      EXPECT_NEAR(got.spacing[2], 0.7, 1e-6);
      EXPECT_TRUE(CheckSameGeometry(g.affine_source == "pixdim" ? got : got, "a", got, "b").ok());
    }
  }
  LabelMap m;
  VolumeGeometry got;
  absl::Status s = LoadNiftiLabels(dir + "/v0.nii.gz", 10, &m, &got);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("more than the limit"), std::string::npos) << s;
  s = LoadNiftiLabels(dir + "/missing.nii.gz", 1 << 20, &m, &got);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace tally
