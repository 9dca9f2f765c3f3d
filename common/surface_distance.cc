#include "common/surface_distance.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// Edge pixels of every class of a label map, in one pass. A pixel of class L is an edge pixel when
// a 4-neighbour is not of class L or lies outside the image: that is L's mask XOR its erosion by
// the cross, with outside pixels as background. `label(i)` gives the class of pixel i, or kNone
// for pixels outside every mask (ignored pixels). Edges come out in row-major order.
template <typename LabelFn>
void ExtractEdges(int height, int width, int num_classes, LabelFn label, std::vector<std::vector<int32_t>>* edges) {
  edges->assign(num_classes, {});
  for (int y = 0; y < height; ++y) {
    const int32_t base = y * width;
    for (int x = 0; x < width; ++x) {
      const int32_t i = base + x;
      const uint32_t l = label(i);
      if (l >= static_cast<uint32_t>(num_classes)) continue;
      const bool interior = y > 0 && y + 1 < height && x > 0 && x + 1 < width && label(i - width) == l &&
                            label(i + width) == l && label(i - 1) == l && label(i + 1) == l;
      if (!interior) (*edges)[l].push_back(i);
    }
  }
}

// Feature pixels bucketed by column, each column's rows ascending: the vertical distance from row y
// to the nearest feature of column c is a binary search.
class ColumnIndex {
 public:
  ColumnIndex(const std::vector<int32_t>& features, int width)
      : width_(width), start_(width + 1, 0), rows_(features.size()) {
    for (int32_t f : features) start_[f % width + 1]++;
    for (int c = 0; c < width; ++c) start_[c + 1] += start_[c];
    cursor_.assign(start_.begin(), start_.end() - 1);
    std::vector<int32_t> fill = cursor_;
    for (int32_t f : features) rows_[fill[f % width]++] = f / width;  // Row-major input: rows ascend.
  }
  // Squared, scaled vertical distances of every column for row y (kInf where a column has no
  // feature). Calls must come with non-decreasing y: per-column cursors only move forward, so all
  // the calls of one transform cost O(width x rows + features).
  void RowCosts(int32_t y, double sy2, std::vector<double>* out) {
    out->resize(width_);
    for (int c = 0; c < width_; ++c) {
      const int32_t end = start_[c + 1];
      int32_t& k = cursor_[c];
      while (k < end && rows_[k] < y) ++k;
      int32_t best = std::numeric_limits<int32_t>::max();
      if (k < end) best = rows_[k] - y;
      if (k > start_[c]) best = std::min(best, y - rows_[k - 1]);
      (*out)[c] = best == std::numeric_limits<int32_t>::max()
                      ? kInf
                      : sy2 * static_cast<double>(best) * static_cast<double>(best);
    }
  }
  // Vertical distance (in rows) from row y to the nearest feature of column c; -1 if none.
  int32_t Gap(int c, int32_t y) const {
    const int32_t* b = rows_.data() + start_[c];
    const int32_t* e = rows_.data() + start_[c + 1];
    if (b == e) return -1;
    const int32_t* it = std::lower_bound(b, e, y);
    int32_t best = std::numeric_limits<int32_t>::max();
    if (it != e) best = *it - y;
    if (it != b) best = std::min(best, y - *(it - 1));
    return best;
  }

 private:
  int width_;
  std::vector<int32_t> start_;
  std::vector<int32_t> rows_;
  std::vector<int32_t> cursor_;
};

// One dimension of the Felzenszwalb-Huttenlocher lower envelope of the parabolas
// f(p) + w^2 (q - p)^2 over sites p with a finite cost f(p) (kInf = no site): after Build, ArgMin(q)
// is the site minimising it at q (-1 when no site has a finite cost), for non-decreasing q.
class Envelope1D {
 public:
  void Build(const double* f, int n, double w2) {
    v_.resize(n);
    z_.resize(n + 1);
    fv_.resize(n);
    k_ = -1;
    for (int c = 0; c < n; ++c) {
      const double fc = f[c];
      if (fc == kInf) continue;
      double s = 0;
      while (k_ >= 0) {
        const int p = v_[k_];
        s = ((fc + w2 * c * static_cast<double>(c)) - (fv_[k_] + w2 * p * static_cast<double>(p))) /
            (2.0 * w2 * (c - p));
        if (s <= z_[k_]) {
          --k_;
        } else {
          break;
        }
      }
      ++k_;
      v_[k_] = c;
      fv_[k_] = fc;
      z_[k_] = k_ == 0 ? -kInf : s;
      z_[k_ + 1] = kInf;
    }
    j_ = 0;
  }
  bool empty() const { return k_ < 0; }
  // Queries must come in non-decreasing order between Build calls.
  int ArgMin(int q) {
    if (k_ < 0) return -1;
    while (z_[j_ + 1] < q) ++j_;
    return v_[j_];
  }

 private:
  std::vector<int> v_;
  std::vector<double> z_;
  std::vector<double> fv_;
  int k_ = -1;
  int j_ = 0;
};

// For every query pixel (row-major linear indices, sorted), the Euclidean distance to the nearest
// feature pixel (at least one exists). Exact and separable: with g(y, c) the vertical distance from
// row y to the nearest feature of column c, the squared distance of a query at (y, x) is
// min over columns c of sx^2 (x - c)^2 + sy^2 g(y, c)^2. The minimum is searched outwards from
// c = x, stopping once sx^2 (x - c)^2 alone reaches the best value: a query near the features
// (the usual case, a prediction close to its reference) costs a few columns. When a row's queries
// together scan more than width / 4 columns, the rest of the row uses the Felzenszwalb-Huttenlocher
// lower envelope of the row's parabolas, O(width). So no row costs more than O(width), plus the
// O(features) the per-column cursors advance over the whole transform.
void DirectedDistances(const std::vector<int32_t>& queries, ColumnIndex index, int width, double sy, double sx,
                       std::vector<double>* out) {
  const double sx2 = sx * sx, sy2 = sy * sy;
  auto column = [&](int c, int32_t y) {
    const int32_t gap = index.Gap(c, y);
    return gap < 0 ? kInf : sy2 * static_cast<double>(gap) * static_cast<double>(gap);
  };
  std::vector<double> costs;
  Envelope1D envelope;
  out->resize(queries.size());
  size_t qi = 0;
  while (qi < queries.size()) {
    const int32_t y = queries[qi] / width;
    size_t row_end = qi;
    while (row_end < queries.size() && queries[row_end] / width == y) ++row_end;
    int64_t budget = std::max<int64_t>(16, width / 4);
    size_t q = qi;
    for (; q < row_end && budget >= 0; ++q) {
      const int x = queries[q] % width;
      double best = column(x, y);
      int d = 1;
      for (; d < width; ++d) {
        const double dx2 = sx2 * static_cast<double>(d) * static_cast<double>(d);
        if (dx2 >= best || (x - d < 0 && x + d >= width)) break;
        if (x - d >= 0) best = std::min(best, dx2 + column(x - d, y));
        if (x + d < width) best = std::min(best, dx2 + column(x + d, y));
      }
      budget -= d;
      (*out)[q] = std::sqrt(best);
    }
    if (q < row_end) {
      // Far queries: the lower envelope of the parabolas sx^2 (x - c)^2 + f(c) of this row.
      index.RowCosts(y, sy2, &costs);
      envelope.Build(costs.data(), width, sx2);
      for (; q < row_end; ++q) {
        const int x = queries[q] % width;
        const int c = envelope.ArgMin(x);
        const double dx = static_cast<double>(x - c);
        (*out)[q] = std::sqrt(sx2 * dx * dx + costs[c]);
      }
    }
    qi = row_end;
  }
}

double Lerp(double a, double b, double t) {
  // numpy's _lerp: symmetric form that is exact at both ends.
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1.0 - t) : a + diff * t;
}

struct Directed {
  double max = 0;
  double p95 = 0;
  double sum = 0;
  int64_t within = 0;
  size_t n = 0;
};

Directed Summarise(std::vector<double>* d, double tolerance) {
  Directed s;
  s.n = d->size();
  for (double x : *d) {
    s.max = std::max(s.max, x);
    s.sum += x;
    s.within += x <= tolerance;
  }
  s.p95 = PercentileLinear(d, 0.95);
  return s;
}

// The symmetric values from the two directed summaries (prediction -> reference and back).
SurfaceValues Combine(const Directed& a, const Directed& b) {
  SurfaceValues out;
  out.hd = std::max(a.max, b.max);
  out.hd95 = std::max(a.p95, b.p95);
  const double n = static_cast<double>(a.n + b.n);
  out.assd = (a.sum + b.sum) / n;
  out.nsd = static_cast<double>(a.within + b.within) / n;
  return out;
}

SurfaceValues FromEdges(const std::vector<int32_t>& pred_edges, const std::vector<int32_t>& ref_edges, int width,
                        const SurfaceOptions& options) {
  if (pred_edges.empty() && ref_edges.empty()) return SurfaceValues{kNaN, kNaN, kNaN, kNaN};
  if (pred_edges.empty() || ref_edges.empty()) return SurfaceValues{kInf, kInf, kInf, 0.0};
  std::vector<double> d_pg, d_gp;
  DirectedDistances(pred_edges, ColumnIndex(ref_edges, width), width, options.spacing_y, options.spacing_x, &d_pg);
  DirectedDistances(ref_edges, ColumnIndex(pred_edges, width), width, options.spacing_y, options.spacing_x, &d_gp);
  return Combine(Summarise(&d_pg, options.nsd_tolerance), Summarise(&d_gp, options.nsd_tolerance));
}


// ---- 3D --------------------------------------------------------------------------------------

// Edge voxels of every class of a label volume, in one pass: a voxel of class L whose 6-neighbour
// is not of class L or lies outside the volume (L's mask XOR its erosion by the 6-connected cross,
// outside voxels as background). Linear indices (z, y, x row-major), ascending.
template <typename LabelFn>
void ExtractEdges3D(int depth, int height, int width, int num_classes, LabelFn label,
                    std::vector<std::vector<int64_t>>* edges) {
  edges->assign(num_classes, {});
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int z = 0; z < depth; ++z) {
    for (int y = 0; y < height; ++y) {
      const int64_t base = z * plane + static_cast<int64_t>(y) * width;
      const bool inner_zy = z > 0 && z + 1 < depth && y > 0 && y + 1 < height;
      for (int x = 0; x < width; ++x) {
        const int64_t i = base + x;
        const uint32_t l = label(i);
        if (l >= static_cast<uint32_t>(num_classes)) continue;
        const bool interior = inner_zy && x > 0 && x + 1 < width && label(i - 1) == l && label(i + 1) == l &&
                              label(i - width) == l && label(i + width) == l && label(i - plane) == l &&
                              label(i + plane) == l;
        if (!interior) (*edges)[l].push_back(i);
      }
    }
  }
}

struct Dims3 {
  int64_t depth, height, width;
};

// For every query voxel (linear indices, ascending), the exact Euclidean distance to the nearest
// feature voxel (at least one exists), with spacing (sz, sy, sx), for queries far from the features
// (DirectedDistances3D handles the near ones). Separable: the features' column
// index along z gives, for a slice z, each (y, x) column's distance in z to its nearest feature;
// a lower-envelope pass along y (evaluated only at rows holding queries) and one along x (only at
// the queries) finish the transform. Everything happens inside the bounding box of the queries
// and features, slice by slice, and only on slices holding queries: memory is O(box area +
// features), not O(volume). The nearest feature's offsets are tracked through the passes, so each
// distance is computed as scipy's distance_transform_edt computes it, sqrt(sum of (s_i d_i)^2).
void SeparableDistances3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, const Dims3& dims,
                          double sz, double sy, double sx, std::vector<double>* out) {
  const int64_t plane = dims.height * dims.width;
  auto zyx = [&](int64_t i, int64_t* z, int64_t* y, int64_t* x) {
    *z = i / plane;
    const int64_t r = i - *z * plane;
    *y = r / dims.width;
    *x = r - *y * dims.width;
  };
  int64_t y0 = dims.height, y1 = -1, x0 = dims.width, x1 = -1;
  for (const auto* set : {&queries, &features}) {
    for (int64_t i : *set) {
      int64_t z, y, x;
      zyx(i, &z, &y, &x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
    }
  }
  const int H = static_cast<int>(y1 - y0 + 1), W = static_cast<int>(x1 - x0 + 1);
  const size_t area = static_cast<size_t>(H) * W;
  // Features bucketed by (y, x) column of the box, z ascending (the input is z-major).
  std::vector<int64_t> start(area + 1, 0);
  std::vector<int32_t> fz(features.size());
  for (int64_t i : features) {
    int64_t z, y, x;
    zyx(i, &z, &y, &x);
    start[(y - y0) * W + (x - x0) + 1]++;
  }
  for (size_t c = 0; c < area; ++c) start[c + 1] += start[c];
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  {
    std::vector<int64_t> fill = cursor;
    for (int64_t i : features) {
      int64_t z, y, x;
      zyx(i, &z, &y, &x);
      fz[fill[(y - y0) * W + (x - x0)]++] = static_cast<int32_t>(z);
    }
  }
  const double sy2 = sy * sy, sx2 = sx * sx;
  std::vector<int32_t> gz(area);      // Signed z offset to the column's nearest feature; kNoZ: none.
  std::vector<double> cost(area);     // (sz * gz)^2, or kInf.
  constexpr int32_t kNoZ = std::numeric_limits<int32_t>::max();
  std::vector<double> column(H), row(W);
  std::vector<int> query_rows;
  std::vector<int32_t> best_y;  // Per (query row, x): the argmin row of the y pass.
  Envelope1D env;
  out->resize(queries.size());
  size_t qi = 0;
  while (qi < queries.size()) {
    int64_t z, y, x;
    zyx(queries[qi], &z, &y, &x);
    const int64_t slice = z;
    size_t slice_end = qi;
    query_rows.clear();
    while (slice_end < queries.size() && queries[slice_end] / plane == slice) {
      zyx(queries[slice_end], &z, &y, &x);
      const int r = static_cast<int>(y - y0);
      if (query_rows.empty() || query_rows.back() != r) query_rows.push_back(r);
      ++slice_end;
    }
    // 1. Distance in z from this slice to each column's nearest feature.
    for (size_t c = 0; c < area; ++c) {
      const int64_t end = start[c + 1];
      int64_t& k = cursor[c];
      while (k < end && fz[k] < slice) ++k;
      int32_t best = kNoZ;
      int64_t best_abs = std::numeric_limits<int64_t>::max();
      if (k < end) {
        best = static_cast<int32_t>(fz[k] - slice);
        best_abs = best;
      }
      if (k > start[c] && slice - fz[k - 1] < best_abs) best = static_cast<int32_t>(fz[k - 1] - slice);
      gz[c] = best;
      if (best == kNoZ) {
        cost[c] = kInf;
      } else {
        const double d = sz * static_cast<double>(best);
        cost[c] = d * d;
      }
    }
    // 2. Along y, for every column x, at the rows holding queries.
    best_y.assign(query_rows.size() * W, -1);
    for (int cx = 0; cx < W; ++cx) {
      for (int r = 0; r < H; ++r) column[r] = cost[static_cast<size_t>(r) * W + cx];
      env.Build(column.data(), H, sy2);
      if (env.empty()) continue;
      for (size_t qr = 0; qr < query_rows.size(); ++qr) best_y[qr * W + cx] = env.ArgMin(query_rows[qr]);
    }
    // 3. Along x, at the queries of each row.
    size_t q = qi;
    for (size_t qr = 0; qr < query_rows.size(); ++qr) {
      const int r = query_rows[qr];
      for (int cx = 0; cx < W; ++cx) {
        const int by = best_y[qr * W + cx];
        if (by < 0) {
          row[cx] = kInf;
        } else {
          const double dy = sy * static_cast<double>(r - by);
          row[cx] = cost[static_cast<size_t>(by) * W + cx] + dy * dy;
        }
      }
      env.Build(row.data(), W, sx2);
      for (; q < slice_end; ++q) {
        zyx(queries[q], &z, &y, &x);
        if (y - y0 != r) break;
        const int qx = static_cast<int>(x - x0);
        const int bx = env.ArgMin(qx);
        const int by = bx < 0 ? -1 : best_y[qr * W + bx];
        if (by < 0) {
          (*out)[q] = kInf;  // Unreachable: the box holds a feature.
          continue;
        }
        const double dz = sz * static_cast<double>(gz[static_cast<size_t>(by) * W + bx]);
        const double dy = sy * static_cast<double>(r - by);
        const double dx = sx * static_cast<double>(qx - bx);
        // scipy's order: axis 0 first, for nibabel's (x, y, z) array.
        (*out)[q] = std::sqrt((dx * dx + dy * dy) + dz * dz);
      }
    }
    qi = slice_end;
  }
}

// For every query voxel (linear indices, ascending), the exact Euclidean distance to the nearest
// feature voxel (at least one exists). Most queries lie on or next to the other surface (a
// prediction close to its reference): each searches a box around itself in a bitmap of the
// features, growing the box's physical radius rho (doubling) until the best distance found is at
// most rho, which proves it is the nearest (every voxel outside the box is farther than rho). A
// query whose box would pass kMaxBox voxels, and every query once the searches have cost more than
// a budget proportional to the number of queries, goes to the separable transform instead. So
// close predictions cost a few voxel tests per query and far ones no more than the transform.
void DirectedDistances3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, const Dims3& dims,
                         double sz, double sy, double sx, std::vector<double>* out) {
  constexpr int64_t kMaxBox = 4096;
  const int64_t plane = dims.height * dims.width;
  int64_t z0 = dims.depth, z1 = -1, y0 = dims.height, y1 = -1, x0 = dims.width, x1 = -1;
  for (int64_t i : features) {
    const int64_t z = i / plane, y = (i % plane) / dims.width, x = i % dims.width;
    z0 = std::min(z0, z), z1 = std::max(z1, z);
    y0 = std::min(y0, y), y1 = std::max(y1, y);
    x0 = std::min(x0, x), x1 = std::max(x1, x);
  }
  const int64_t bz = z1 - z0 + 1, by = y1 - y0 + 1, bx = x1 - x0 + 1;
  std::vector<uint64_t> bits(static_cast<size_t>((bz * by * bx + 63) / 64), 0);
  for (int64_t i : features) {
    const int64_t z = i / plane, y = (i % plane) / dims.width, x = i % dims.width;
    const int64_t b = ((z - z0) * by + (y - y0)) * bx + (x - x0);
    bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  auto feature = [&](int64_t z, int64_t y, int64_t x) {
    const int64_t b = ((z - z0) * by + (y - y0)) * bx + (x - x0);
    return (bits[b >> 6] >> (b & 63)) & 1;
  };
  const double smin = std::min({sz, sy, sx});
  int64_t budget = 256 * static_cast<int64_t>(queries.size()) + (int64_t{1} << 20);
  out->resize(queries.size());
  std::vector<size_t> far;
  for (size_t q = 0; q < queries.size(); ++q) {
    const int64_t i = queries[q];
    const int64_t z = i / plane, y = (i % plane) / dims.width, x = i % dims.width;
    if (budget < 0) {
      far.push_back(q);
      continue;
    }
    double best = kInf;  // Squared.
    bool found = false;
    for (double rho = 0;; rho = rho == 0 ? smin : 2 * rho) {
      // Box radii: every feature within rho lies inside (the tiny excess only widens the box).
      const int64_t rz = static_cast<int64_t>(std::floor(rho / sz * (1 + 1e-12)));
      const int64_t ry = static_cast<int64_t>(std::floor(rho / sy * (1 + 1e-12)));
      const int64_t rx = static_cast<int64_t>(std::floor(rho / sx * (1 + 1e-12)));
      if ((2 * rz + 1) * (2 * ry + 1) * (2 * rx + 1) > kMaxBox) break;
      const int64_t za = std::max(z - rz, z0), zb = std::min(z + rz, z1);
      const int64_t ya = std::max(y - ry, y0), yb = std::min(y + ry, y1);
      const int64_t xa = std::max(x - rx, x0), xb = std::min(x + rx, x1);
      budget -= (2 * rz + 1) * (2 * ry + 1) * (2 * rx + 1);
      for (int64_t cz = za; cz <= zb; ++cz) {
        const double dz = sz * static_cast<double>(cz - z);
        for (int64_t cy = ya; cy <= yb; ++cy) {
          const double dy = sy * static_cast<double>(cy - y);
          for (int64_t cx = xa; cx <= xb; ++cx) {
            if (!feature(cz, cy, cx)) continue;
            const double dx = sx * static_cast<double>(cx - x);
            best = std::min(best, (dx * dx + dy * dy) + dz * dz);  // scipy's order, as below.
          }
        }
      }
      if (best <= rho * rho) {
        found = true;
        break;
      }
    }
    if (found) {
      (*out)[q] = std::sqrt(best);
    } else {
      far.push_back(q);
    }
  }
  if (far.empty()) return;
  std::vector<int64_t> far_queries(far.size());
  for (size_t k = 0; k < far.size(); ++k) far_queries[k] = queries[far[k]];
  std::vector<double> far_out;
  SeparableDistances3D(far_queries, features, dims, sz, sy, sx, &far_out);
  for (size_t k = 0; k < far.size(); ++k) (*out)[far[k]] = far_out[k];
}

SurfaceValues FromEdges3D(const std::vector<int64_t>& pred_edges, const std::vector<int64_t>& ref_edges,
                          const Dims3& dims, const SurfaceOptions3D& o) {
  if (pred_edges.empty() && ref_edges.empty()) return SurfaceValues{kNaN, kNaN, kNaN, kNaN};
  if (pred_edges.empty() || ref_edges.empty()) return SurfaceValues{kInf, kInf, kInf, 0.0};
  std::vector<double> d_pg, d_gp;
  DirectedDistances3D(pred_edges, ref_edges, dims, o.spacing_z, o.spacing_y, o.spacing_x, &d_pg);
  DirectedDistances3D(ref_edges, pred_edges, dims, o.spacing_z, o.spacing_y, o.spacing_x, &d_gp);
  return Combine(Summarise(&d_pg, o.nsd_tolerance), Summarise(&d_gp, o.nsd_tolerance));
}

}  // namespace

double PercentileLinear(std::vector<double>* values, double q) {
  const size_t n = values->size();
  if (n == 0) return kNaN;
  const double pos = q * static_cast<double>(n - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const double t = pos - static_cast<double>(lo);
  std::nth_element(values->begin(), values->begin() + lo, values->end());
  const double a = (*values)[lo];
  if (lo + 1 >= n || t == 0) return a;
  const double b = *std::min_element(values->begin() + lo + 1, values->end());
  if (std::isinf(a) || std::isinf(b)) return a == b ? a : (t > 0 ? b : a);
  return Lerp(a, b, t);
}

SurfaceValues BinarySurfaceMetrics(const uint8_t* pred, const uint8_t* ref, int height, int width,
                                   const SurfaceOptions& options) {
  std::vector<std::vector<int32_t>> pred_edges, ref_edges;
  ExtractEdges(height, width, 1, [&](int32_t i) { return pred[i] ? 0u : kNone; }, &pred_edges);
  ExtractEdges(height, width, 1, [&](int32_t i) { return ref[i] ? 0u : kNone; }, &ref_edges);
  return FromEdges(pred_edges[0], ref_edges[0], width, options);
}

void ClassSurfaceMetrics(const uint16_t* pred, const uint16_t* ref, int height, int width, int num_classes,
                         uint16_t ignore_label, const SurfaceOptions& options,
                         std::vector<SurfaceValues>* out) {
  // Ignored pixels are outside every class's mask, in the prediction and the reference alike.
  std::vector<std::vector<int32_t>> pred_edges, ref_edges;
  ExtractEdges(
      height, width, num_classes,
      [&](int32_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(pred[i]); }, &pred_edges);
  ExtractEdges(
      height, width, num_classes,
      [&](int32_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(ref[i]); }, &ref_edges);
  out->resize(num_classes);
  for (int c = 0; c < num_classes; ++c) (*out)[c] = FromEdges(pred_edges[c], ref_edges[c], width, options);
}

}  // namespace tally

namespace tally {

SurfaceValues BinarySurfaceMetrics3D(const uint8_t* pred, const uint8_t* ref, int depth, int height, int width,
                                     const SurfaceOptions3D& options) {
  std::vector<std::vector<int64_t>> pred_edges, ref_edges;
  ExtractEdges3D(depth, height, width, 1, [&](int64_t i) { return pred[i] ? 0u : kNone; }, &pred_edges);
  ExtractEdges3D(depth, height, width, 1, [&](int64_t i) { return ref[i] ? 0u : kNone; }, &ref_edges);
  return FromEdges3D(pred_edges[0], ref_edges[0], Dims3{depth, height, width}, options);
}

void ClassSurfaceMetrics3D(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                           int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                           std::vector<SurfaceValues>* out) {
  std::vector<std::vector<int64_t>> pred_edges, ref_edges;
  ExtractEdges3D(
      depth, height, width, num_classes,
      [&](int64_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(pred[i]); }, &pred_edges);
  ExtractEdges3D(
      depth, height, width, num_classes,
      [&](int64_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(ref[i]); }, &ref_edges);
  out->resize(num_classes);
  const Dims3 dims{depth, height, width};
  for (int c = 0; c < num_classes; ++c) (*out)[c] = FromEdges3D(pred_edges[c], ref_edges[c], dims, options);
}

}  // namespace tally
