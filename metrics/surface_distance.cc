#include "metrics/surface_distance.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "metrics/surface_summary.h"

namespace tally {
namespace {

using namespace surface_internal;  // NOLINT: the summaries this file shares with the 3D path.

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

SurfaceValues FromEdges(const std::vector<int32_t>& pred_edges, const std::vector<int32_t>& ref_edges, int width,
                        const SurfaceOptions& options) {
  if (pred_edges.empty() && ref_edges.empty()) return SurfaceValues{kNaN, kNaN, kNaN, kNaN};
  if (pred_edges.empty() || ref_edges.empty()) return SurfaceValues{kInf, kInf, kInf, 0.0};
  std::vector<double> d_pg, d_gp;
  DirectedDistances(pred_edges, ColumnIndex(ref_edges, width), width, options.spacing_y, options.spacing_x, &d_pg);
  DirectedDistances(ref_edges, ColumnIndex(pred_edges, width), width, options.spacing_y, options.spacing_x, &d_gp);
  return Combine(Summarise(&d_pg, options.nsd_tolerance), Summarise(&d_gp, options.nsd_tolerance));
}


}  // namespace

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

double SurfaceMetric(Metric m, const SurfaceValues& s) {
  switch (m) {
    case Metric::kHd: return s.hd;
    case Metric::kHd95: return s.hd95;
    case Metric::kAssd: return s.assd;
    case Metric::kNsd: return s.nsd;
    default: return kNaN;
  }
}

}  // namespace tally
