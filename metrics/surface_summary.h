// Internal to the metrics library: what the 2D (surface_distance.cc) and 3D
// (surface_distance_3d.cc) surface distances share: the lower envelope of the distance transform,
// and the summary of each direction's distances.
#ifndef TALLY_METRICS_SURFACE_SUMMARY_H_
#define TALLY_METRICS_SURFACE_SUMMARY_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "metrics/far_transform.h"
#include "metrics/statistics.h"
#include "metrics/surface_distance.h"

namespace tally {
namespace surface_internal {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

struct Directed {
  double max = 0;
  double p95 = 0;
  double sum = 0;
  int64_t within = 0;
  size_t n = 0;
};

inline Directed Summarise(std::vector<double>* d, double tolerance) {
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
inline SurfaceValues Combine(const Directed& a, const Directed& b) {
  SurfaceValues out;
  out.hd = std::max(a.max, b.max);
  out.hd95 = std::max(a.p95, b.p95);
  const double n = static_cast<double>(a.n + b.n);
  out.assd = (a.sum + b.sum) / n;
  out.nsd = static_cast<double>(a.within + b.within) / n;
  return out;
}


// One dimension of the Felzenszwalb-Huttenlocher lower envelope of the parabolas
// f(p) + w^2 (q - p)^2 over sites p with a finite cost f(p) (kInf = no site): after Build, ArgMin(q)
// is the site minimising it at q (-1 when no site has a finite cost), for non-decreasing q. The
// envelope itself is far_transform::Envelope, which the GPU's separable transform runs too.
class Envelope1D {
 public:
  void Build(const double* f, int n, double w2) {
    v_.resize(n);
    z_.resize(n + 1);
    env_ = far_transform::Envelope{v_.data(), z_.data(), 1};
    env_.Build(far_transform::ArrayCosts{f}, n, w2);
  }
  bool empty() const { return env_.k < 0; }
  // Queries must come in non-decreasing order between Build calls.
  int ArgMin(int q) { return env_.ArgMin(q); }

 private:
  std::vector<int32_t> v_;
  std::vector<double> z_;
  far_transform::Envelope env_{nullptr, nullptr, 1};
};

}  // namespace surface_internal
}  // namespace tally

#endif  // TALLY_METRICS_SURFACE_SUMMARY_H_
