#include "metrics/surface_distance.h"
#include "metrics/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace tally {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Mask {
  int h, w;
  std::vector<uint8_t> v;
  Mask(int h_, int w_) : h(h_), w(w_), v(static_cast<size_t>(h_) * w_, 0) {}
  void Set(int y, int x) { v[static_cast<size_t>(y) * w + x] = 1; }
  bool At(int y, int x) const { return y >= 0 && y < h && x >= 0 && x < w && v[static_cast<size_t>(y) * w + x]; }
};

// Independent brute force: explicit erosion, all-pairs distances, sorted percentile.
std::vector<std::pair<int, int>> BruteEdges(const Mask& m) {
  std::vector<std::pair<int, int>> e;
  for (int y = 0; y < m.h; ++y) {
    for (int x = 0; x < m.w; ++x) {
      if (m.At(y, x) && !(m.At(y - 1, x) && m.At(y + 1, x) && m.At(y, x - 1) && m.At(y, x + 1))) e.emplace_back(y, x);
    }
  }
  return e;
}

std::vector<double> BruteDirected(const std::vector<std::pair<int, int>>& from,
                                  const std::vector<std::pair<int, int>>& to, double sy, double sx) {
  std::vector<double> d;
  for (auto [y, x] : from) {
    double best = kInf;
    for (auto [ty, tx] : to) best = std::min(best, std::hypot(sy * (y - ty), sx * (x - tx)));
    d.push_back(best);
  }
  return d;
}

double BrutePercentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

SurfaceValues Brute(const Mask& p, const Mask& r, double sy, double sx, double tol) {
  auto ep = BruteEdges(p), er = BruteEdges(r);
  auto a = BruteDirected(ep, er, sy, sx), b = BruteDirected(er, ep, sy, sx);
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

SurfaceValues Surface(const Mask& p, const Mask& r, double sy = 1, double sx = 1, double tol = 1) {
  SurfaceOptions o;
  o.spacing_y = sy;
  o.spacing_x = sx;
  o.nsd_tolerance = tol;
  return BinarySurfaceMetrics(p.v.data(), r.v.data(), p.h, p.w, o);
}

TEST(SurfaceDistanceTest, SinglePixelsThreeApart) {
  Mask p(8, 8), r(8, 8);
  p.Set(2, 2);
  r.Set(2, 5);
  SurfaceValues s = Surface(p, r, 1, 1, 1);
  EXPECT_DOUBLE_EQ(s.hd, 3);
  EXPECT_DOUBLE_EQ(s.hd95, 3);
  EXPECT_DOUBLE_EQ(s.assd, 3);
  EXPECT_DOUBLE_EQ(s.nsd, 0);
  EXPECT_DOUBLE_EQ(Surface(p, r, 1, 1, 3).nsd, 1);
}

// Two 3x3 squares, the second shifted one column right: worked out by hand in the comments of
// surface_distance.h's definition. Each has 8 edge pixels (all but the centre); 4 of each set are
// shared (distance 0), the other 4 are 1 away.
TEST(SurfaceDistanceTest, ShiftedSquaresHandWorked) {
  Mask p(6, 6), r(6, 6);
  for (int y = 1; y <= 3; ++y) {
    for (int x = 1; x <= 3; ++x) p.Set(y, x);
    for (int x = 2; x <= 4; ++x) r.Set(y, x);
  }
  SurfaceValues s = Surface(p, r, 1, 1, 0);
  EXPECT_DOUBLE_EQ(s.hd, 1);
  EXPECT_DOUBLE_EQ(s.hd95, 1);  // sorted [0,0,0,0,1,1,1,1], position 6.65 -> 1
  EXPECT_DOUBLE_EQ(s.assd, 0.5);
  EXPECT_DOUBLE_EQ(s.nsd, 0.5);  // tolerance 0: the 8 zeros of 16 distances
  EXPECT_DOUBLE_EQ(Surface(p, r, 1, 1, 1).nsd, 1);
}

TEST(SurfaceDistanceTest, IdenticalMasks) {
  Mask p(5, 7);
  for (int y = 1; y < 4; ++y)
    for (int x = 2; x < 6; ++x) p.Set(y, x);
  SurfaceValues s = Surface(p, p);
  EXPECT_EQ(s.hd, 0);
  EXPECT_EQ(s.hd95, 0);
  EXPECT_EQ(s.assd, 0);
  EXPECT_EQ(s.nsd, 1);
}

TEST(SurfaceDistanceTest, EmptyCases) {
  Mask empty(4, 4), one(4, 4);
  one.Set(1, 1);
  SurfaceValues both = Surface(empty, empty);
  EXPECT_TRUE(std::isnan(both.hd) && std::isnan(both.hd95) && std::isnan(both.assd) && std::isnan(both.nsd));
  for (SurfaceValues s : {Surface(empty, one), Surface(one, empty)}) {
    EXPECT_EQ(s.hd, kInf);
    EXPECT_EQ(s.hd95, kInf);
    EXPECT_EQ(s.assd, kInf);
    EXPECT_EQ(s.nsd, 0);
  }
}

TEST(SurfaceDistanceTest, AnisotropicSpacing) {
  Mask p(6, 6), r(6, 6);
  p.Set(0, 0);
  r.Set(3, 4);
  SurfaceValues s = Surface(p, r, 2.0, 0.5, 1);
  EXPECT_DOUBLE_EQ(s.hd, std::sqrt(40.0));  // sqrt((3*2)^2 + (4*0.5)^2)
}

TEST(SurfaceDistanceTest, FullImageMaskHasItsBorderAsEdge) {
  Mask full(4, 5), inner(4, 5);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 5; ++x) full.Set(y, x);
  inner.Set(1, 2);
  // Full-image edges: the 14 border pixels. Inner pixel (1,2) is 1 from (0,2).
  // d_pg (from full's edges to the single pixel) max: corner (3,0) or (3,4): sqrt(4 + 4).
  SurfaceValues s = Surface(full, inner);
  EXPECT_DOUBLE_EQ(s.hd, std::sqrt(8.0));
  SurfaceValues b = Brute(full, inner, 1, 1, 1);
  EXPECT_DOUBLE_EQ(s.hd95, b.hd95);
  EXPECT_DOUBLE_EQ(s.assd, b.assd);
}

TEST(SurfaceDistanceTest, MatchesBruteForceOnRandomMasks) {
  std::mt19937 rng(7);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int h = 1 + rng() % 40, w = 1 + rng() % 40;
    Mask p(h, w), r(h, w);
    const int kind = trial % 3;
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        if (kind == 0) {  // Speckle.
          if (rng() % 5 == 0) p.Set(y, x);
          if (rng() % 4 == 0) r.Set(y, x);
        } else {  // Blobs (discs), possibly touching the border.
          const double cy = h * 0.4, cx = w * 0.5, rad = std::min(h, w) * (0.2 + 0.1 * kind);
          if ((y - cy) * (y - cy) + (x - cx) * (x - cx) <= rad * rad) p.Set(y, x);
          if ((y - cy - 2) * (y - cy - 2) + (x - cx + 1) * (x - cx + 1) <= rad * rad * 0.8) r.Set(y, x);
        }
      }
    }
    if (BruteEdges(p).empty() || BruteEdges(r).empty()) continue;
    const double sy = trial % 4 == 0 ? 0.7 : 1.0, sx = trial % 4 == 0 ? 1.3 : 1.0;
    SurfaceValues got = Surface(p, r, sy, sx, 1.5), want = Brute(p, r, sy, sx, 1.5);
    EXPECT_NEAR(got.hd, want.hd, 1e-12 * (1 + want.hd)) << trial;
    EXPECT_NEAR(got.hd95, want.hd95, 1e-12 * (1 + want.hd95)) << trial;
    EXPECT_NEAR(got.assd, want.assd, 1e-12 * (1 + want.assd)) << trial;
    EXPECT_DOUBLE_EQ(got.nsd, want.nsd) << trial;
    ++compared;
  }
  EXPECT_GT(compared, 250);
}

TEST(SurfaceDistanceTest, PercentileLinearMatchesNumpy) {
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(PercentileLinear(&v, 0.5), 2.5);
  v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(PercentileLinear(&v, 0.95), 3.85);  // numpy.percentile([1,2,3,4], 95)
  v = {7};
  EXPECT_DOUBLE_EQ(PercentileLinear(&v, 0.95), 7);
  v = {1, kInf};
  EXPECT_EQ(PercentileLinear(&v, 0.95), kInf);
  v.clear();
  EXPECT_TRUE(std::isnan(PercentileLinear(&v, 0.5)));
}

// Label maps: class c of pred vs ref, with an ignore pixel treated as background in both.
TEST(SurfaceDistanceTest, ClassMetricsFromLabelMapsWithIgnore) {
  const int h = 5, w = 6;
  std::vector<uint16_t> pred(h * w, 0), ref(h * w, 0);
  pred[1 * w + 1] = 1;
  ref[1 * w + 4] = 1;
  pred[3 * w + 2] = 2;
  ref[3 * w + 2] = 2;
  pred[4 * w + 5] = 1;  // Predicted class 1 on an ignored pixel: must not count.
  ref[4 * w + 5] = 255;
  std::vector<SurfaceValues> out;
  SurfaceOptions o;
  ClassSurfaceMetrics(pred.data(), ref.data(), h, w, 3, 255, o, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_DOUBLE_EQ(out[1].hd, 3);  // (1,1) vs (1,4), the ignored (4,5) left out
  EXPECT_DOUBLE_EQ(out[2].hd, 0);
  // Class 0 (background) equals the binary computation on the same masks.
  Mask p0(h, w), r0(h, w);
  for (int i = 0; i < h * w; ++i) {
    if (ref[i] == 255) continue;
    if (pred[i] == 0) p0.v[i] = 1;
    if (ref[i] == 0) r0.v[i] = 1;
  }
  SurfaceValues b0 = Surface(p0, r0);
  EXPECT_DOUBLE_EQ(out[0].hd, b0.hd);
  EXPECT_DOUBLE_EQ(out[0].assd, b0.assd);
}

}  // namespace
}  // namespace tally
