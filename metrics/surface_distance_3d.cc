// The 3D surface distances of metrics/surface_distance.h (NIfTI volumes): exact Euclidean
// distances with anisotropic spacing, from each edge voxel to the nearest edge voxel of the other map.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "metrics/box_search.h"
#include "metrics/parallel_for.h"
#include "metrics/surface_distance.h"
#include "metrics/surface_summary.h"

namespace tally {
namespace {

using namespace surface_internal;  // NOLINT: the summaries this file shares with the 2D path.

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

// The features of SeparableDistances3D bucketed by (y, x) column of the bounding box of queries
// and features, z ascending in each column, with a cursor per column for the slices in turn.
struct FeatureColumns {
  int64_t plane = 0, width = 0;
  int64_t y0 = 0, x0 = 0;
  int H = 0, W = 0;
  std::vector<int64_t> start;   // Column c's features: fz[start[c], start[c + 1]).
  std::vector<int32_t> fz;
  std::vector<int64_t> cursor;  // First feature of column c at or after the current slice.

  void Zyx(int64_t i, int64_t* z, int64_t* y, int64_t* x) const {
    *z = i / plane;
    const int64_t r = i - *z * plane;
    *y = r / width;
    *x = r - *y * width;
  }

  FeatureColumns(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, const Dims3& dims)
      : plane(dims.height * dims.width), width(dims.width) {
    int64_t y1 = -1, x1 = -1;
    y0 = dims.height;
    x0 = dims.width;
    for (const auto* set : {&queries, &features}) {
      for (int64_t i : *set) {
        int64_t z, y, x;
        Zyx(i, &z, &y, &x);
        y0 = std::min(y0, y);
        y1 = std::max(y1, y);
        x0 = std::min(x0, x);
        x1 = std::max(x1, x);
      }
    }
    H = static_cast<int>(y1 - y0 + 1);
    W = static_cast<int>(x1 - x0 + 1);
    const size_t area = static_cast<size_t>(H) * W;
    start.assign(area + 1, 0);
    fz.resize(features.size());
    for (int64_t i : features) {
      int64_t z, y, x;
      Zyx(i, &z, &y, &x);
      start[(y - y0) * W + (x - x0) + 1]++;
    }
    for (size_t c = 0; c < area; ++c) start[c + 1] += start[c];
    cursor.assign(start.begin(), start.end() - 1);
    std::vector<int64_t> fill = cursor;
    for (int64_t i : features) {
      int64_t z, y, x;
      Zyx(i, &z, &y, &x);
      fz[fill[(y - y0) * W + (x - x0)]++] = static_cast<int32_t>(z);
    }
  }
};

using far_transform::kNoZ;

// Pass 1 of SeparableDistances3D: for each column of the box, the signed z offset from `slice` to
// its nearest feature (kNoZ: none) and that offset's cost (sz * gz)^2 (kInf: none). Slices must
// come in ascending order (the columns' cursors only move forward).
void ZPass(FeatureColumns& f, int64_t slice, double sz, std::vector<int32_t>* gz, std::vector<double>* cost) {
  const size_t area = static_cast<size_t>(f.H) * f.W;
  for (size_t c = 0; c < area; ++c) {
    const int64_t end = f.start[c + 1];
    int64_t& k = f.cursor[c];
    while (k < end && f.fz[k] < slice) ++k;
    const int32_t best = far_transform::NearestZAt(f.fz.data(), f.start[c], end, k, slice);
    (*gz)[c] = best;
    (*cost)[c] = far_transform::ZCost(best, sz);  // kInf for none.
  }
}

// For every query voxel (linear indices, ascending), the exact Euclidean distance to the nearest
// feature voxel (at least one exists), with spacing (sz, sy, sx), for queries far from the features
// (DirectedDistances3D handles the near ones). Separable: the features' column
// index along z gives, for a slice z, each (y, x) column's distance in z to its nearest feature;
// a lower-envelope pass along y (evaluated only at rows holding queries) and one along x (only at
// the queries) finish the transform. Everything happens inside the bounding box of the queries
// and features, slice by slice, and only on slices holding queries: memory is O(box area +
// features), not O(volume). The nearest feature's offsets are tracked through the passes, so each
// distance is computed as scipy's distance_transform_edt computes it, sqrt(sum of (s_i d_i)^2).
// `box_queries` (default: `queries`) with the features sets the box, and with it the envelopes'
// arithmetic: queries split into groups get the values of the whole set when each group passes it.
void SeparableDistances3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, const Dims3& dims,
                          double sz, double sy, double sx, std::vector<double>* out,
                          const std::vector<int64_t>* box_queries = nullptr) {
  FeatureColumns f(box_queries != nullptr ? *box_queries : queries, features, dims);
  const int H = f.H, W = f.W;
  const size_t area = static_cast<size_t>(H) * W;
  const double sy2 = sy * sy, sx2 = sx * sx;
  std::vector<int32_t> gz(area);      // Signed z offset to the column's nearest feature; kNoZ: none.
  std::vector<double> cost(area);     // (sz * gz)^2, or kInf.
  std::vector<double> column(H), row(W);
  std::vector<int> query_rows;
  std::vector<int32_t> best_y;  // Per (query row, x): the argmin row of the y pass.
  Envelope1D env;
  out->resize(queries.size());
  size_t qi = 0;
  while (qi < queries.size()) {
    int64_t z, y, x;
    f.Zyx(queries[qi], &z, &y, &x);
    const int64_t slice = z;
    size_t slice_end = qi;
    query_rows.clear();
    while (slice_end < queries.size() && queries[slice_end] / f.plane == slice) {
      f.Zyx(queries[slice_end], &z, &y, &x);
      const int r = static_cast<int>(y - f.y0);
      if (query_rows.empty() || query_rows.back() != r) query_rows.push_back(r);
      ++slice_end;
    }
    // 1. Distance in z from this slice to each column's nearest feature.
    ZPass(f, slice, sz, &gz, &cost);
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
        f.Zyx(queries[q], &z, &y, &x);
        if (y - f.y0 != r) break;
        const int qx = static_cast<int>(x - f.x0);
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

// The features of DirectedDistances3D as a bitmap over their bounding box.
struct FeatureBits {
  int64_t z0, z1, y0, y1, x0, x1, by = 0, bx = 0;
  std::vector<uint64_t> bits;
  FeatureBits(const std::vector<int64_t>& features, const Dims3& dims) {
    const int64_t plane = dims.height * dims.width;
    z0 = dims.depth, z1 = -1, y0 = dims.height, y1 = -1, x0 = dims.width, x1 = -1;
    for (int64_t i : features) {
      const int64_t z = i / plane, y = (i % plane) / dims.width, x = i % dims.width;
      z0 = std::min(z0, z), z1 = std::max(z1, z);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
      x0 = std::min(x0, x), x1 = std::max(x1, x);
    }
    const int64_t bz = z1 - z0 + 1;
    by = y1 - y0 + 1;
    bx = x1 - x0 + 1;
    bits.assign(static_cast<size_t>((bz * by * bx + 63) / 64), 0);
    for (int64_t i : features) {
      const int64_t z = i / plane, y = (i % plane) / dims.width, x = i % dims.width;
      const int64_t b = ((z - z0) * by + (y - y0)) * bx + (x - x0);
      bits[b >> 6] |= uint64_t{1} << (b & 63);
    }
  }
  bool operator()(int64_t z, int64_t y, int64_t x) const {
    const int64_t b = ((z - z0) * by + (y - y0)) * bx + (x - x0);
    return (bits[b >> 6] >> (b & 63)) & 1;
  }
};

// Queries are searched in chunks of this many, each with a budget of its own, so that which
// queries go to the separable transform (and hence every value, to the bit) does not depend on how
// the chunks are shared among threads.
constexpr size_t kQueryChunk = kSurfaceQueryChunk;

// The box search (metrics/box_search.h) of DirectedDistances3D for queries [begin, end): distances
// found into `out`, the queries left for the separable transform into `far`.
void NearSearch(const std::vector<int64_t>& queries, size_t begin, size_t end, const FeatureBits& feature,
                const Dims3& dims, double sz, double sy, double sx, std::vector<double>* out, std::vector<size_t>* far) {
  const int64_t plane = dims.height * dims.width;
  const FeatureBox box{feature.z0, feature.z1, feature.y0, feature.y1, feature.x0, feature.x1};
  int64_t budget = SurfaceChunkBudget(end - begin);
  for (size_t q = begin; q < end; ++q) {
    const int64_t i = queries[q];
    if (budget < 0) {
      far->push_back(q);
      continue;
    }
    double best = 0;  // Squared.
    int64_t spent = 0;
    const bool found =
        BoxSearch(i / plane, (i % plane) / dims.width, i % dims.width, box, sz, sy, sx, kSurfaceMaxBox, feature, &best,
                  &spent);
    budget -= spent;
    if (found) {
      (*out)[q] = std::sqrt(best);
    } else {
      far->push_back(q);
    }
  }
}

// The separable transform for the queries `far` (indices into `queries`, ascending) of
// DirectedDistances3D, in groups of slices over `threads`.
void FarDistances3D(const std::vector<int64_t>& queries, const std::vector<size_t>& far,
                    const std::vector<int64_t>& features, const Dims3& dims, double sz, double sy, double sx,
                    std::vector<double>* out, int threads) {
  if (far.empty()) return;
  // The separable transform per group of far queries (whole slices, about far / threads each), every
  // group in the box of all far queries: the values are those of one pass over them all.
  const size_t groups = std::min<size_t>(static_cast<size_t>(std::max(1, threads)), far.size());
  std::vector<size_t> cut = {0};
  const int64_t plane = dims.height * dims.width;
  for (size_t g = 1; g < groups; ++g) {
    size_t c = std::max(cut.back(), far.size() * g / groups);
    while (c > cut.back() && c < far.size() && queries[far[c]] / plane == queries[far[c - 1]] / plane) ++c;
    cut.push_back(c);
  }
  cut.push_back(far.size());
  std::vector<int64_t> far_queries(far.size());
  for (size_t k = 0; k < far.size(); ++k) far_queries[k] = queries[far[k]];
  ParallelFor(cut.size() - 1, threads, [&](size_t g) {
    if (cut[g] >= cut[g + 1]) return;
    const std::vector<int64_t> group_queries(far_queries.begin() + static_cast<std::ptrdiff_t>(cut[g]),
                                             far_queries.begin() + static_cast<std::ptrdiff_t>(cut[g + 1]));
    std::vector<double> group_out;
    SeparableDistances3D(group_queries, features, dims, sz, sy, sx, &group_out, &far_queries);
    for (size_t k = cut[g]; k < cut[g + 1]; ++k) (*out)[far[k]] = group_out[k - cut[g]];
  });
}

// For every query voxel (linear indices, ascending), the exact Euclidean distance to the nearest
// feature voxel (at least one exists). Most queries lie on or next to the other surface (a
// prediction close to its reference): each searches a box around itself in a bitmap of the
// features, growing the box's physical radius rho (doubling) until the best distance found is at
// most rho, which proves it is the nearest (every voxel outside the box is farther than rho). A
// query whose box would pass kSurfaceMaxBox voxels, and every query of a chunk once its searches have cost
// more than a budget proportional to the chunk, goes to the separable transform instead. So close
// predictions cost a few voxel tests per query and far ones no more than the transform. Chunks of
// queries (slabs of the volume) and then slices of the far queries spread over `threads`; the
// values do not depend on it.
void DirectedDistances3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, const Dims3& dims,
                         double sz, double sy, double sx, std::vector<double>* out, int threads = 1) {
  const FeatureBits feature(features, dims);
  out->resize(queries.size());
  const size_t chunks = (queries.size() + kQueryChunk - 1) / kQueryChunk;
  std::vector<std::vector<size_t>> far_by_chunk(chunks);
  ParallelFor(chunks, threads, [&](size_t k) {
    NearSearch(queries, k * kQueryChunk, std::min(queries.size(), (k + 1) * kQueryChunk), feature, dims, sz, sy, sx,
               out, &far_by_chunk[k]);
  });
  std::vector<size_t> far;
  for (const auto& f : far_by_chunk) far.insert(far.end(), f.begin(), f.end());
  FarDistances3D(queries, far, features, dims, sz, sy, sx, out, threads);
}

SurfaceValues FromEdges3D(const std::vector<int64_t>& pred_edges, const std::vector<int64_t>& ref_edges,
                          const Dims3& dims, const SurfaceOptions3D& o, int threads = 1) {
  if (pred_edges.empty() && ref_edges.empty()) return SurfaceValues{kNaN, kNaN, kNaN, kNaN};
  if (pred_edges.empty() || ref_edges.empty()) return SurfaceValues{kInf, kInf, kInf, 0.0};
  std::vector<double> d_pg, d_gp;
  DirectedDistances3D(pred_edges, ref_edges, dims, o.spacing_z, o.spacing_y, o.spacing_x, &d_pg, threads);
  DirectedDistances3D(ref_edges, pred_edges, dims, o.spacing_z, o.spacing_y, o.spacing_x, &d_gp, threads);
  return Combine(Summarise(&d_pg, o.nsd_tolerance), Summarise(&d_gp, o.nsd_tolerance));
}

}  // namespace

void FinishDirected3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, int depth,
                      int height, int width, const SurfaceOptions3D& o, const NearSearch3D& search,
                      std::vector<double>* out, int threads) {
  out->resize(queries.size());
  std::vector<size_t> far;
  for (size_t begin = 0; begin < queries.size(); begin += kQueryChunk) {
    const size_t end = std::min(queries.size(), begin + kQueryChunk);
    int64_t budget = SurfaceChunkBudget(end - begin);
    for (size_t q = begin; q < end; ++q) {
      if (budget < 0) {  // NearSearch's rule: this query and the chunk's rest go far.
        far.push_back(q);
        continue;
      }
      budget -= search.cost[q];
      if (search.found[q]) {
        (*out)[q] = search.near[q];
      } else {
        far.push_back(q);
      }
    }
  }
  FarDistances3D(queries, far, features, Dims3{depth, height, width}, o.spacing_z, o.spacing_y, o.spacing_x, out,
                 threads);
}

SurfaceValues BinarySurfaceMetrics3D(const uint8_t* pred, const uint8_t* ref, int depth, int height, int width,
                                     const SurfaceOptions3D& options) {
  std::vector<std::vector<int64_t>> pred_edges, ref_edges;
  ExtractEdges3D(depth, height, width, 1, [&](int64_t i) { return pred[i] ? 0u : kNone; }, &pred_edges);
  ExtractEdges3D(depth, height, width, 1, [&](int64_t i) { return ref[i] ? 0u : kNone; }, &ref_edges);
  return FromEdges3D(pred_edges[0], ref_edges[0], Dims3{depth, height, width}, options);
}

void ClassSurfaceMetrics3D(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                           int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                           std::vector<SurfaceValues>* out, int threads) {
  std::vector<std::vector<int64_t>> pred_edges, ref_edges;
  auto pred_pass = [&] {
    ExtractEdges3D(
        depth, height, width, num_classes,
        [&](int64_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(pred[i]); }, &pred_edges);
  };
  auto ref_pass = [&] {
    ExtractEdges3D(
        depth, height, width, num_classes,
        [&](int64_t i) { return ref[i] == ignore_label ? kNone : static_cast<uint32_t>(ref[i]); }, &ref_edges);
  };
  if (threads > 1) {
    std::thread other(pred_pass);
    ref_pass();
    other.join();
  } else {
    pred_pass();
    ref_pass();
  }
  out->assign(num_classes, SurfaceValues{});
  const Dims3 dims{depth, height, width};
  // Each class on its own: the largest first (the most edge voxels), then whoever is free takes the next.
  std::vector<int> order(num_classes);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return pred_edges[a].size() + ref_edges[a].size() > pred_edges[b].size() + ref_edges[b].size();
  });
  // Fewer classes with edges than threads: each class's queries spread over the rest (slabs).
  int busy = 0;
  for (int c = 0; c < num_classes; ++c) busy += !pred_edges[c].empty() || !ref_edges[c].empty();
  const int per_class = std::max(1, threads / std::max(1, busy));
  ParallelFor(order.size(), std::min(threads, std::max(1, busy)), [&](size_t k) {
    const int c = order[k];
    (*out)[c] = FromEdges3D(pred_edges[c], ref_edges[c], dims, options, per_class);
  });
}

void RegionSurfaceMetrics(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                          const std::vector<std::vector<int>>& regions, uint16_t ignore_label,
                          const SurfaceOptions3D& options, std::vector<SurfaceValues>* out) {
  const int64_t n = static_cast<int64_t>(depth) * height * width;
  std::vector<uint8_t> pm(n), rm(n), member(65536);
  out->resize(regions.size());
  for (size_t c = 0; c < regions.size(); ++c) {
    std::fill(member.begin(), member.end(), 0);
    for (int l : regions[c]) member[l] = 1;
    for (int64_t i = 0; i < n; ++i) {
      const bool ignored = ref[i] == ignore_label;  // Outside every region, in both maps.
      rm[i] = !ignored && member[ref[i]];
      pm[i] = !ignored && member[pred[i]];
    }
    (*out)[c] = depth > 1 ? BinarySurfaceMetrics3D(pm.data(), rm.data(), depth, height, width, options)
                          : BinarySurfaceMetrics(pm.data(), rm.data(), height, width,
                                                 SurfaceOptions{options.spacing_y, options.spacing_x,
                                                                options.nsd_tolerance});
  }
}

}  // namespace tally
