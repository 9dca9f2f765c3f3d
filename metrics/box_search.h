// The 3D surface distances' box search for one query (DirectedDistances3D in
// metrics/surface_distance_3d.cc, and NearKernel in metrics/gpu/surface3d_kernel.cu): one copy of
// the arithmetic both paths must share to the bit.
#ifndef TALLY_METRICS_BOX_SEARCH_H_
#define TALLY_METRICS_BOX_SEARCH_H_

#include <cmath>
#include <cstdint>

#include "metrics/host_device.h"

namespace tally {

// The features' bounding box (inclusive).
struct FeatureBox {
  int64_t z0, z1, y0, y1, x0, x1;
};

// Query (z, y, x) searches boxes of growing physical radius rho (0, then the smallest spacing,
// doubling) in the features (has(cz, cy, cx): a feature voxel there), until the best squared
// distance found, (dx*dx + dy*dy) + dz*dz in double precision (scipy's order, no fused
// multiply-add), is at most rho^2: then it is the nearest (every voxel outside the box is farther),
// *best_sq holds it and the search returns true. It returns false once the next box would pass
// max_box voxels. *spent gets the voxels of the boxes it tried (their full size, clipped or not).
template <typename Has>
TALLY_HD bool BoxSearch(int64_t z, int64_t y, int64_t x, const FeatureBox& f, double sz, double sy, double sx,
                        int64_t max_box, const Has& has, double* best_sq, int64_t* spent) {
  const double syx = sy < sx ? sy : sx, smin = sz < syx ? sz : syx;
  double best = HUGE_VAL;
  *spent = 0;
  for (double rho = 0;; rho = rho == 0 ? smin : 2 * rho) {
    // Box radii: every feature within rho lies inside (the tiny excess only widens the box).
    const int64_t rz = static_cast<int64_t>(floor(rho / sz * (1 + 1e-12)));
    const int64_t ry = static_cast<int64_t>(floor(rho / sy * (1 + 1e-12)));
    const int64_t rx = static_cast<int64_t>(floor(rho / sx * (1 + 1e-12)));
    const int64_t box = (2 * rz + 1) * (2 * ry + 1) * (2 * rx + 1);
    if (box > max_box) return false;
    *spent += box;
    const int64_t za = z - rz > f.z0 ? z - rz : f.z0, zb = z + rz < f.z1 ? z + rz : f.z1;
    const int64_t ya = y - ry > f.y0 ? y - ry : f.y0, yb = y + ry < f.y1 ? y + ry : f.y1;
    const int64_t xa = x - rx > f.x0 ? x - rx : f.x0, xb = x + rx < f.x1 ? x + rx : f.x1;
    for (int64_t cz = za; cz <= zb; ++cz) {
      const double dz = sz * static_cast<double>(cz - z);
      for (int64_t cy = ya; cy <= yb; ++cy) {
        const double dy = sy * static_cast<double>(cy - y);
        for (int64_t cx = xa; cx <= xb; ++cx) {
          if (!has(cz, cy, cx)) continue;
          const double dx = sx * static_cast<double>(cx - x);
          const double d = (dx * dx + dy * dy) + dz * dz;
          if (d < best) best = d;  // No fmin: a library call on the host, and no NaN comes here.
        }
      }
    }
    if (best <= rho * rho) {
      *best_sq = best;
      return true;
    }
  }
}

}  // namespace tally

#endif  // TALLY_METRICS_BOX_SEARCH_H_
