// The separable distance transform of the 3D surface distances' far queries (SeparableDistances3D in
// metrics/surface_distance_3d.cc) cut into independent pieces of work, one per GPU thread: the same
// arithmetic in the same order, so the values are the CPU's to the bit. Plain C++ that nvcc also
// compiles for the device (metrics/gpu/surface3d_kernel.cu, built with --fmad=false like the CPU,
// which has no fused multiply-add either); the CPU's own envelope (Envelope1D) is this file's
// Envelope, and tests/metrics/far_transform_test.cc runs the pieces on the host against the CPU's
// transform.
//
// The pieces, over the box (y0..y0+H-1, x0..x0+W-1) of all far queries and features:
//   - the features of column c = (y - y0) * W + (x - x0) as their z, ascending: fz[col_start[c],
//     col_start[c + 1]); NearestZ is the CPU's z pass (ZPass) for one column and slice, done for
//     every column of a slice holding queries first (step 1; NearestZAt for a column walked slice by
//     slice);
//   - YPassColumn: one slice holding queries and one column x of the box: the lower envelope along y
//     of the z pass's costs, evaluated at the slice's query rows (the CPU's step 2);
//   - XPassRow: one row holding queries: the envelope along x of the y pass's costs, evaluated at the
//     row's queries, and each query's distance (the CPU's step 3).
// Each piece keeps its envelope in caller-given storage whose entry k lies at [k * stride]:
// consecutive GPU threads' entries side by side.
#ifndef TALLY_METRICS_FAR_TRANSFORM_H_
#define TALLY_METRICS_FAR_TRANSFORM_H_

#include <cmath>
#include <cstdint>

#include "metrics/host_device.h"

namespace tally {
namespace far_transform {

constexpr int32_t kNoZ = 2147483647;  // No feature in the column.

TALLY_HD double Infinity() { return HUGE_VAL; }

// The box and the spacing.
struct Geometry {
  int64_t plane = 0, width = 0;  // The volume's: a voxel's linear index is z * plane + y * width + x.
  int64_t y0 = 0, x0 = 0;
  int H = 0, W = 0;
  double sz = 1, sy = 1, sx = 1;
};

// The first index of [lo, hi) where below(index) is false, for a predicate true on a prefix of the
// range (std::partition_point over indices; the device has no <algorithm>).
template <typename Below>
TALLY_HD int64_t PartitionPoint(int64_t lo, int64_t hi, Below below) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (below(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// ZPass for one column whose features fz[begin, end) before `lo` lie below `slice` and from `lo` on
// at or above it: the signed z offset from `slice` to the nearest (the later one on a tie), kNoZ
// for none. A column walked slice by slice moves lo forward (the CPU's ZPass, the device's).
TALLY_HD int32_t NearestZAt(const int32_t* fz, int64_t begin, int64_t end, int64_t lo, int64_t slice) {
  int32_t best = kNoZ;
  int64_t best_abs = INT64_MAX;
  if (lo < end) {
    best = static_cast<int32_t>(fz[lo] - slice);
    best_abs = best;
  }
  if (lo > begin && slice - fz[lo - 1] < best_abs) best = static_cast<int32_t>(fz[lo - 1] - slice);
  return best;
}

// The same for one slice on its own: lo by binary search.
TALLY_HD int32_t NearestZ(const int32_t* fz, int64_t begin, int64_t end, int64_t slice) {
  const int64_t lo = PartitionPoint(begin, end, [&](int64_t i) { return fz[i] < slice; });
  return NearestZAt(fz, begin, end, lo, slice);
}

// (sz * gz)^2, the z pass's cost.
TALLY_HD double ZCost(int32_t gz, double sz) {
  if (gz == kNoZ) return Infinity();
  const double d = sz * static_cast<double>(gz);
  return d * d;
}

// The Felzenszwalb-Huttenlocher lower envelope of the parabolas f(p) + w2 (q - p)^2 over the sites p
// of finite cost (the CPU's Envelope1D in metrics/surface_summary.h runs this one with stride 1), in
// caller-given storage: v (sites) and z (n + 1 boundaries), entry k at [k * stride].
struct Envelope {
  static constexpr int kAhead = 8;  // Sites read ahead.
  int32_t* v;
  double* z;
  int64_t stride;
  int k = -1;
  int j = 0;

  // Site c in [0, n) costs f.Cost(f.Load(c)), Infinity() for none: Load reads what the cost needs
  // and Cost computes it, so that the reads of the next kAhead sites are issued before this group's
  // steps and overlap them (on the device a load stalls only when its value is used; one site ahead
  // left each step of a column's y pass waiting on memory: an H200's y passes 5.1 -> 4.4 ms on a
  // 2-label speckled 512x512x300 prediction, 3.1 -> 2.2 on a fragmented one). The top entry's site,
  // f(p) + w2 p^2 and boundary stay in registers (the same expressions on the same values): a push
  // reads nothing back, and only a pop reads the entry below. The closing Infinity() is written once.
  template <typename F>
  TALLY_HD void Build(const F& f, int n, double w2) {
    k = -1;
    j = 0;
    if (n <= 0) return;
    int top = 0;
    double top_g = 0, top_z = 0;  // v[k], f(v[k]) + w2 v[k]^2, z[k].
    using Raw = decltype(f.Load(0));
    Raw cur[kAhead] = {}, next[kAhead] = {};
    TALLY_UNROLL
    for (int i = 0; i < kAhead; ++i) {
      if (i < n) cur[i] = f.Load(i);
    }
    for (int c0 = 0; c0 < n; c0 += kAhead) {
      TALLY_UNROLL
      for (int i = 0; i < kAhead; ++i) {
        if (c0 + kAhead + i < n) next[i] = f.Load(c0 + kAhead + i);
      }
      TALLY_UNROLL
      for (int i = 0; i < kAhead; ++i) {
        if (c0 + i < n) Push(f, c0 + i, f.Cost(cur[i]), w2, top, top_g, top_z);
      }
      TALLY_UNROLL
      for (int i = 0; i < kAhead; ++i) cur[i] = next[i];
    }
    if (k >= 0) z[(k + 1) * stride] = Infinity();
  }
  // Site c of cost fc (Infinity(): none) onto the envelope: the entries it hides are popped.
  template <typename F>
  TALLY_HD void Push(const F& f, int c, double fc, double w2, int& top, double& top_g, double& top_z) {
    if (fc == Infinity()) return;
    const double gc = fc + w2 * c * static_cast<double>(c);
    double s = 0;
    while (k >= 0) {
      s = (gc - top_g) / (2.0 * w2 * (c - top));
      if (!(s <= top_z)) break;
      if (--k >= 0) {
        top = v[k * stride];
        top_g = f.Cost(f.Load(top)) + w2 * top * static_cast<double>(top);
        top_z = z[k * stride];
      }
    }
    ++k;
    top = c;
    top_g = gc;
    top_z = k == 0 ? -Infinity() : s;
    v[k * stride] = c;
    z[k * stride] = top_z;
  }
  // Non-decreasing q between Build calls; -1 when no site. The envelope entry j whose interval holds
  // q: the first j (from the last answer on) with z[j + 1] >= q. The boundaries increase strictly (a
  // push's exceeds the top's, z[k + 1] is Infinity()), so a galloping search from the last answer
  // finds the entry a walk would: a row's few queries far apart cost a few reads each, not a chain of
  // dependent reads through the envelope (an H200's x passes 8.3 -> 5.8 ms on a 2-label speckled
  // 512x512x300 prediction).
  TALLY_HD int ArgMin(int q) {
    if (k < 0) return -1;
    if (z[(j + 1) * stride] < q) {
      int lo = j + 1, hi = j + 2, step = 1;  // z[lo] < q; the answer's z lies in (lo, k + 1].
      while (hi <= k && z[hi * stride] < q) {
        lo = hi;
        step *= 2;
        hi = lo + step;
      }
      if (hi > k + 1) hi = k + 1;
      const int64_t first = PartitionPoint(lo + 1, hi, [&](int64_t i) { return z[i * stride] < q; });
      j = static_cast<int>(first) - 1;
    }
    return v[j * stride];
  }
};

// Envelope::Build's costs from an array (the CPU's Envelope1D).
struct ArrayCosts {
  const double* f;
  TALLY_HD double Load(int c) const { return f[c]; }
  TALLY_HD double Cost(double fc) const { return fc; }
};

// The y pass's: a column's z offsets at gz[r * W].
struct ColumnCosts {
  const int32_t* gz;
  int64_t W;
  double sz;
  TALLY_HD int32_t Load(int r) const { return gz[r * W]; }
  TALLY_HD double Cost(int32_t g) const { return ZCost(g, sz); }
};

// The y pass's result for one query row and box column: the nearest row (-1: none) and that row's
// z offset, side by side (one 8-byte read a site for the x pass, where two arrays took two).
struct alignas(8) RowBest {
  int32_t by, gz;
};

// The x pass's for query row r: each column's RowBest.
struct RowCosts {
  const RowBest* best;
  int r;
  double sy, sz;
  TALLY_HD RowBest Load(int cx) const { return best[cx]; }
  TALLY_HD double Cost(RowBest s) const {
    if (s.by < 0) return Infinity();
    const double dy = sy * static_cast<double>(r - s.by);
    return ZCost(s.gz, sz) + dy * dy;
  }
};

// Step 2 for one slice and box column: gz[r * W] is the z pass's offset at row r of the column (a
// slice's NearestZ for every column, laid out by row), rows[0..rows_n) the slice's query rows
// (y - y0, ascending); best[i * W] gets row i's nearest row (-1: none) and that row's z offset.
TALLY_HD void YPassColumn(const Geometry& g, const int32_t* gz, const int32_t* rows, int64_t rows_n, RowBest* best,
                          Envelope env) {
  env.Build(ColumnCosts{gz, g.W, g.sz}, g.H, g.sy * g.sy);
  for (int64_t i = 0; i < rows_n; ++i) {
    const int by = env.ArgMin(rows[i]);
    best[i * g.W] = RowBest{by, by < 0 ? kNoZ : gz[static_cast<int64_t>(by) * g.W]};
  }
}

// Step 3 for the query row r (y - y0) whose step-2 results are best[0..W): the distance of each of
// its queries (linear indices, ascending) into out[out_at[k]].
TALLY_HD void XPassRow(const Geometry& g, int r, const RowBest* best, const int64_t* queries, int64_t queries_n,
                       const int64_t* out_at, double* out, Envelope env) {
  env.Build(RowCosts{best, r, g.sy, g.sz}, g.W, g.sx * g.sx);
  for (int64_t k = 0; k < queries_n; ++k) {
    const int qx = static_cast<int>(queries[k] % g.width - g.x0);
    const int bx = env.ArgMin(qx);
    const int by = bx < 0 ? -1 : best[bx].by;
    if (by < 0) {
      out[out_at[k]] = Infinity();  // Unreachable: the box holds a feature.
      continue;
    }
    const double dz = g.sz * static_cast<double>(best[bx].gz);
    const double dy = g.sy * static_cast<double>(r - by);
    const double dx = g.sx * static_cast<double>(qx - bx);
    out[out_at[k]] = sqrt((dx * dx + dy * dy) + dz * dz);
  }
}

}  // namespace far_transform
}  // namespace tally

#endif  // TALLY_METRICS_FAR_TRANSFORM_H_
