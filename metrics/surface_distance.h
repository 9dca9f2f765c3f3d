// Surface-distance metrics (hd, hd95, assd, nsd) between a predicted and a reference mask in 2D.
//
// Definitions follow MONAI (compute_hausdorff_distance, compute_average_surface_distance with
// symmetric=True, compute_surface_dice with use_subvoxels=False):
//   edges(M)  = M XOR erode(M), 4-connected cross, pixels outside the image count as background;
//   d_pg      = for each edge pixel of pred, the Euclidean distance to the nearest edge pixel of ref;
//   d_gp      = the same the other way round; distances in pixels scaled by (spacing_y, spacing_x);
//   hd        = max(max d_pg, max d_gp);
//   hd95      = max(P95(d_pg), P95(d_gp)), percentiles with linear interpolation (numpy default);
//   assd      = mean of d_pg and d_gp pooled;
//   nsd       = (#{d_pg <= T} + #{d_gp <= T}) / (|d_pg| + |d_gp|).
// Both masks empty: all NaN. Exactly one empty: hd = hd95 = assd = +inf, nsd = 0.
//
// Distances are exact. One pass over the label maps extracts the edge pixels of every class; each
// directed distance set then comes from a separable Euclidean distance transform evaluated only at
// the query edge pixels: the feature edges bucketed by column give the vertical distance per column
// (binary search), and each query searches outwards over columns until no closer feature can exist,
// falling back per row to the Felzenszwalb-Huttenlocher lower envelope when a row's queries are far
// from the features. Cost: O(pixels) for the pass, then O(edges) for close predictions and at most
// O(width log edges) per row. Thread-compatible; functions allocate their own scratch.
#ifndef TALLY_METRICS_SURFACE_DISTANCE_H_
#define TALLY_METRICS_SURFACE_DISTANCE_H_

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "metrics/catalogue.h"

namespace tally {

// Surface distances of one class in one image.
struct SurfaceValues {
  double hd = 0;
  double hd95 = 0;
  double assd = 0;
  double nsd = 0;
};
double SurfaceMetric(Metric m, const SurfaceValues& s);

struct SurfaceOptions {
  double spacing_y = 1.0;
  double spacing_x = 1.0;
  double nsd_tolerance = 1.0;  // In the units of the spacing.
};

// Masks are row-major height x width; a nonzero byte is "in the mask".
SurfaceValues BinarySurfaceMetrics(const uint8_t* pred, const uint8_t* ref, int height, int width,
                                   const SurfaceOptions& options);

// Per-class surface metrics for classes [0, num_classes) of two label maps. Pixels where
// ref == ignore_label are treated as background in both masks. `out` gets num_classes entries.
void ClassSurfaceMetrics(const uint16_t* pred, const uint16_t* ref, int height, int width, int num_classes,
                         uint16_t ignore_label, const SurfaceOptions& options,
                         std::vector<SurfaceValues>* out);

// 3D: the same definitions with the 6-connected cross for edges and (z, y, x) spacing. Volumes are
// row-major (z, y, x). Memory: the edge voxels plus O(area of the edges' bounding box) scratch.
struct SurfaceOptions3D {
  double spacing_z = 1.0;
  double spacing_y = 1.0;
  double spacing_x = 1.0;
  double nsd_tolerance = 1.0;
};
SurfaceValues BinarySurfaceMetrics3D(const uint8_t* pred, const uint8_t* ref, int depth, int height, int width,
                                     const SurfaceOptions3D& options);
// Per region (a sorted list of labels; nnU-Net's region_or_label_to_mask), the surface distances of
// the region's mask in the prediction against the reference's, in 2D (depth 1) or 3D. Pixels equal
// to `ignore_label` in the reference are outside every region in both maps.
void RegionSurfaceMetrics(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                          const std::vector<std::vector<int>>& regions, uint16_t ignore_label,
                          const SurfaceOptions3D& options, std::vector<SurfaceValues>* out);
// Per class of a volume. `threads` > 1 spreads the work over that many threads (the two maps' edges
// at once, then the classes, largest first taken as they come): the values are the same as on one.
void ClassSurfaceMetrics3D(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                           int num_classes, uint16_t ignore_label, const SurfaceOptions3D& options,
                           std::vector<SurfaceValues>* out, int threads = 1);

// The CPU's finish of one 3D direction whose box searches were done elsewhere, query by query.
// `queries` are one class's edge voxels (ascending linear indices) and `features` the other map's;
// for query q, `near[q]` is the distance its box search found (unused where !found[q]) and
// `cost[q]` the voxels of the boxes it tried. Chunks and budgets are applied as the CPU applies
// them, the far queries go through the CPU's separable transform on `threads`, and `out` gets every
// distance. The device path does all of it on the GPU; tests hold its separable transform
// (metrics/far_transform.h) to this one, every query marked not found.
struct NearSearch3D {
  std::vector<double> near;
  std::vector<uint8_t> found;
  std::vector<int64_t> cost;
};
void FinishDirected3D(const std::vector<int64_t>& queries, const std::vector<int64_t>& features, int depth,
                      int height, int width, const SurfaceOptions3D& options, const NearSearch3D& search,
                      std::vector<double>* out, int threads = 1);
// The box search's budget of a chunk of `queries` queries, and the chunk size (both as the CPU's).
// TALLY_SURFACE_BUDGET (tests and benchmarks only) overrides the voxels a query may cost on average.
inline constexpr size_t kSurfaceQueryChunk = 4096;
inline const int64_t kSurfaceBudgetPerQuery = [] {
  const char* v = std::getenv("TALLY_SURFACE_BUDGET");
  return v != nullptr && std::atoll(v) > 0 ? static_cast<int64_t>(std::atoll(v)) : int64_t{256};
}();
inline int64_t SurfaceChunkBudget(size_t queries) {
  return kSurfaceBudgetPerQuery * static_cast<int64_t>(queries) + (int64_t{1} << 16);
}
// The largest box a query searches before the separable transform takes it (TALLY_SURFACE_MAX_BOX
// overrides it: benchmarks only).
inline const int64_t kSurfaceMaxBox = [] {
  const char* v = std::getenv("TALLY_SURFACE_MAX_BOX");
  return v != nullptr && std::atoll(v) > 0 ? static_cast<int64_t>(std::atoll(v)) : int64_t{4096};
}();

}  // namespace tally

#endif  // TALLY_METRICS_SURFACE_DISTANCE_H_
