#include "common/surface_distance.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int32_t kFar = std::numeric_limits<int32_t>::max() / 4;

// A bounding-box view: masks are bh x bw, row-major, 0/1.
struct Box {
  int bh = 0;
  int bw = 0;
};

// Edge pixels of `mask` (in-mask pixels with a 4-neighbour outside the mask or outside the box;
// the box contains every mask pixel, so outside the box is background), as linear indices in
// row-major order, and as a 0/1 map.
void Edges(const uint8_t* mask, const Box& box, std::vector<uint8_t>* edge_map, std::vector<int32_t>* edges) {
  const int bh = box.bh, bw = box.bw;
  edge_map->assign(static_cast<size_t>(bh) * bw, 0);
  edges->clear();
  for (int y = 0; y < bh; ++y) {
    const uint8_t* row = mask + static_cast<size_t>(y) * bw;
    const uint8_t* up = y > 0 ? row - bw : nullptr;
    const uint8_t* down = y + 1 < bh ? row + bw : nullptr;
    for (int x = 0; x < bw; ++x) {
      if (!row[x]) continue;
      const bool interior = up && up[x] && down && down[x] && x > 0 && row[x - 1] && x + 1 < bw && row[x + 1];
      if (!interior) {
        (*edge_map)[static_cast<size_t>(y) * bw + x] = 1;
        edges->push_back(y * bw + x);
      }
    }
  }
}

// For every query pixel (row-major linear indices, sorted), the Euclidean distance to the nearest
// feature pixel (feature map nonzero). At least one feature pixel must exist.
void DistancesToFeatures(const std::vector<uint8_t>& feature, const Box& box, const std::vector<int32_t>& queries,
                         double sy, double sx, std::vector<double>* out) {
  const int bh = box.bh, bw = box.bw;
  // Column pass: vertical distance (in rows) to the nearest feature in the same column.
  std::vector<int32_t> g(static_cast<size_t>(bh) * bw);
  for (int x = 0; x < bw; ++x) g[x] = feature[x] ? 0 : kFar;
  for (int y = 1; y < bh; ++y) {
    const int32_t* prev = &g[static_cast<size_t>(y - 1) * bw];
    int32_t* cur = &g[static_cast<size_t>(y) * bw];
    const uint8_t* f = &feature[static_cast<size_t>(y) * bw];
    for (int x = 0; x < bw; ++x) cur[x] = f[x] ? 0 : std::min(prev[x] + 1, kFar);
  }
  for (int y = bh - 2; y >= 0; --y) {
    const int32_t* next = &g[static_cast<size_t>(y + 1) * bw];
    int32_t* cur = &g[static_cast<size_t>(y) * bw];
    for (int x = 0; x < bw; ++x) cur[x] = std::min(cur[x], next[x] + 1);
  }
  // Row pass (Felzenszwalb-Huttenlocher lower envelope of parabolas), only on rows with queries.
  const double sx2 = sx * sx, sy2 = sy * sy;
  std::vector<int> v(bw);           // Sites of the envelope.
  std::vector<double> z(bw + 1);    // Boundaries between envelope parabolas.
  std::vector<double> fsite(bw);    // sy^2 * g^2 of each site.
  out->resize(queries.size());
  size_t qi = 0;
  while (qi < queries.size()) {
    const int y = queries[qi] / bw;
    const int32_t* grow = &g[static_cast<size_t>(y) * bw];
    int k = -1;
    for (int q = 0; q < bw; ++q) {
      if (grow[q] >= kFar) continue;
      const double fq = sy2 * static_cast<double>(grow[q]) * static_cast<double>(grow[q]);
      double s = 0;
      while (k >= 0) {
        const int p = v[k];
        s = ((fq + sx2 * q * static_cast<double>(q)) - (fsite[k] + sx2 * p * static_cast<double>(p))) /
            (2.0 * sx2 * (q - p));
        if (s <= z[k]) {
          --k;
        } else {
          break;
        }
      }
      ++k;
      v[k] = q;
      fsite[k] = fq;
      z[k] = k == 0 ? -kInf : s;
      z[k + 1] = kInf;
    }
    // Queries of this row, in increasing x; the envelope has at least one site because a
    // feature exists somewhere in the box and every column's g is finite then... unless the
    // feature's column set is empty for this row, which cannot happen: g is finite in every
    // column that holds a feature, whatever the row.
    int j = 0;
    for (; qi < queries.size() && queries[qi] / bw == y; ++qi) {
      const int x = queries[qi] % bw;
      while (z[j + 1] < x) ++j;
      const double dx = static_cast<double>(x - v[j]);
      (*out)[qi] = std::sqrt(sx2 * dx * dx + fsite[j]);
    }
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

SurfaceValues FromMasks(const uint8_t* pred, const uint8_t* ref, const Box& box, const SurfaceOptions& options) {
  std::vector<uint8_t> pred_edge_map, ref_edge_map;
  std::vector<int32_t> pred_edges, ref_edges;
  Edges(pred, box, &pred_edge_map, &pred_edges);
  Edges(ref, box, &ref_edge_map, &ref_edges);
  SurfaceValues out;
  if (pred_edges.empty() && ref_edges.empty()) {
    out.hd = out.hd95 = out.assd = out.nsd = kNaN;
    return out;
  }
  if (pred_edges.empty() || ref_edges.empty()) {
    out.hd = out.hd95 = out.assd = kInf;
    out.nsd = 0;
    return out;
  }
  std::vector<double> d_pg, d_gp;
  DistancesToFeatures(ref_edge_map, box, pred_edges, options.spacing_y, options.spacing_x, &d_pg);
  DistancesToFeatures(pred_edge_map, box, ref_edges, options.spacing_y, options.spacing_x, &d_gp);
  const Directed a = Summarise(&d_pg, options.nsd_tolerance);
  const Directed b = Summarise(&d_gp, options.nsd_tolerance);
  out.hd = std::max(a.max, b.max);
  out.hd95 = std::max(a.p95, b.p95);
  const double n = static_cast<double>(a.n + b.n);
  out.assd = (a.sum + b.sum) / n;
  out.nsd = static_cast<double>(a.within + b.within) / n;
  return out;
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
  int y0 = height, y1 = -1, x0 = width, x1 = -1;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const size_t i = static_cast<size_t>(y) * width + x;
      if (pred[i] || ref[i]) {
        y0 = std::min(y0, y);
        y1 = std::max(y1, y);
        x0 = std::min(x0, x);
        x1 = std::max(x1, x);
      }
    }
  }
  if (y1 < 0) return SurfaceValues{kNaN, kNaN, kNaN, kNaN};
  Box box{y1 - y0 + 1, x1 - x0 + 1};
  std::vector<uint8_t> p(static_cast<size_t>(box.bh) * box.bw), r(p.size());
  for (int y = 0; y < box.bh; ++y) {
    for (int x = 0; x < box.bw; ++x) {
      const size_t src = static_cast<size_t>(y + y0) * width + (x + x0);
      p[static_cast<size_t>(y) * box.bw + x] = pred[src] != 0;
      r[static_cast<size_t>(y) * box.bw + x] = ref[src] != 0;
    }
  }
  return FromMasks(p.data(), r.data(), box, options);
}

void ClassSurfaceMetrics(const uint16_t* pred, const uint16_t* ref, int height, int width, int num_classes,
                         uint16_t ignore_label, const SurfaceOptions& options,
                         std::vector<SurfaceValues>* out) {
  struct Bounds {
    int y0, y1, x0, x1;
  };
  std::vector<Bounds> bounds(num_classes, Bounds{height, -1, width, -1});
  auto grow = [&](int c, int y, int x) {
    if (c < 0 || c >= num_classes) return;
    Bounds& b = bounds[c];
    b.y0 = std::min(b.y0, y);
    b.y1 = std::max(b.y1, y);
    b.x0 = std::min(b.x0, x);
    b.x1 = std::max(b.x1, x);
  };
  for (int y = 0; y < height; ++y) {
    const uint16_t* pr = pred + static_cast<size_t>(y) * width;
    const uint16_t* rr = ref + static_cast<size_t>(y) * width;
    for (int x = 0; x < width; ++x) {
      if (rr[x] == ignore_label) continue;
      grow(pr[x], y, x);
      if (rr[x] != pr[x]) grow(rr[x], y, x);
    }
  }
  out->assign(num_classes, SurfaceValues{kNaN, kNaN, kNaN, kNaN});
  std::vector<uint8_t> p, r;
  for (int c = 0; c < num_classes; ++c) {
    const Bounds& b = bounds[c];
    if (b.y1 < 0) continue;
    Box box{b.y1 - b.y0 + 1, b.x1 - b.x0 + 1};
    p.assign(static_cast<size_t>(box.bh) * box.bw, 0);
    r.assign(p.size(), 0);
    for (int y = 0; y < box.bh; ++y) {
      const uint16_t* pr = pred + static_cast<size_t>(y + b.y0) * width + b.x0;
      const uint16_t* rr = ref + static_cast<size_t>(y + b.y0) * width + b.x0;
      uint8_t* po = &p[static_cast<size_t>(y) * box.bw];
      uint8_t* ro = &r[static_cast<size_t>(y) * box.bw];
      for (int x = 0; x < box.bw; ++x) {
        const bool ignored = rr[x] == ignore_label;
        po[x] = !ignored && pr[x] == c;
        ro[x] = rr[x] == c;
      }
    }
    (*out)[c] = FromMasks(p.data(), r.data(), box, options);
  }
}

}  // namespace tally
