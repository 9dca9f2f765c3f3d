// Reference and prediction label volumes of the kinds of prediction models make (smooth, speckled, fragmented, ...), at test
// size, as bench/volume_bench.py --prediction makes them at full size: ellipsoid "organs" and a
// prediction of them that is
//   smooth:      each label shifted by a voxel or two along one axis;
//   speckled:    smooth, plus 0.5% of all voxels (isolated) given a random label, as a weak model or
//                a thresholded probability map gives;
//   fragmented:  smooth, plus 200 small components (1-3 voxels a side) of random labels;
//   empty-class: smooth without its last label (that class empty on one side);
//   filling:     smooth, with the last label wherever it has background (a class filling the volume).
// Used by the far transform's host test and the device path's test (surface3d_kernel_test).
#ifndef TALLY_TESTS_METRICS_PREDICTION_KINDS_H_
#define TALLY_TESTS_METRICS_PREDICTION_KINDS_H_

#include <cstdint>
#include <random>
#include <vector>

namespace tally {
namespace test {

enum class PredictionKind { kSmooth, kSpeckled, kFragmented, kEmptyClass, kFilling };
inline constexpr PredictionKind kPredictionKinds[] = {PredictionKind::kSmooth, PredictionKind::kSpeckled,
                                                      PredictionKind::kFragmented, PredictionKind::kEmptyClass,
                                                      PredictionKind::kFilling};

inline const char* KindName(PredictionKind k) {
  switch (k) {
    case PredictionKind::kSmooth: return "smooth";
    case PredictionKind::kSpeckled: return "speckled";
    case PredictionKind::kFragmented: return "fragmented";
    case PredictionKind::kEmptyClass: return "empty-class";
    case PredictionKind::kFilling: return "filling";
  }
  return "?";
}

struct LabelVolume {
  int d = 0, h = 0, w = 0;
  std::vector<uint16_t> v;
  uint16_t& at(int z, int y, int x) { return v[(static_cast<size_t>(z) * h + y) * w + x]; }
  uint16_t at(int z, int y, int x) const { return v[(static_cast<size_t>(z) * h + y) * w + x]; }
};

// Labels 1..labels-1 as ellipsoids (centres in the middle 40%, radii 8-30% of each side), later
// labels over earlier ones.
inline LabelVolume OrganVolume(std::mt19937& rng, int d, int h, int w, int labels) {
  LabelVolume m{d, h, w, std::vector<uint16_t>(static_cast<size_t>(d) * h * w, 0)};
  std::uniform_real_distribution<double> u(0, 1);
  for (int c = 1; c < labels; ++c) {
    const double cz = (0.3 + 0.4 * u(rng)) * d, cy = (0.3 + 0.4 * u(rng)) * h, cx = (0.3 + 0.4 * u(rng)) * w;
    const double rz = (0.08 + 0.22 * u(rng)) * d, ry = (0.08 + 0.22 * u(rng)) * h, rx = (0.08 + 0.22 * u(rng)) * w;
    for (int z = 0; z < d; ++z) {
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const double a = (z - cz) / rz, b = (y - cy) / ry, e = (x - cx) / rx;
          if (a * a + b * b + e * e <= 1) m.at(z, y, x) = static_cast<uint16_t>(c);
        }
      }
    }
  }
  return m;
}

inline LabelVolume PredictionOf(std::mt19937& rng, const LabelVolume& ref, int labels, PredictionKind kind) {
  LabelVolume p{ref.d, ref.h, ref.w, std::vector<uint16_t>(ref.v.size(), 0)};
  for (int c = 1; c < labels; ++c) {  // Smooth: each label moved by -2..2 voxels along one axis.
    const int axis = static_cast<int>(rng() % 3), s = static_cast<int>(rng() % 5) - 2;
    for (int z = 0; z < ref.d; ++z) {
      for (int y = 0; y < ref.h; ++y) {
        for (int x = 0; x < ref.w; ++x) {
          const int sz = z - (axis == 0 ? s : 0), sy = y - (axis == 1 ? s : 0), sx = x - (axis == 2 ? s : 0);
          const bool in = sz >= 0 && sz < ref.d && sy >= 0 && sy < ref.h && sx >= 0 && sx < ref.w &&
                          ref.at(sz, sy, sx) == c;
          if (in) p.at(z, y, x) = static_cast<uint16_t>(c);
        }
      }
    }
  }
  switch (kind) {
    case PredictionKind::kSmooth: break;
    case PredictionKind::kSpeckled:
      for (size_t k = 0; k < p.v.size() / 200; ++k) p.v[rng() % p.v.size()] = static_cast<uint16_t>(rng() % labels);
      break;
    case PredictionKind::kFragmented:
      for (int k = 0; k < 200; ++k) {
        const int sz = 1 + static_cast<int>(rng() % 3), sy = 1 + static_cast<int>(rng() % 3),
                  sx = 1 + static_cast<int>(rng() % 3);
        const int z0 = static_cast<int>(rng() % (p.d - 3)), y0 = static_cast<int>(rng() % (p.h - 3)),
                  x0 = static_cast<int>(rng() % (p.w - 3));
        const uint16_t c = static_cast<uint16_t>(1 + rng() % (labels - 1));
        for (int z = z0; z < z0 + sz; ++z)
          for (int y = y0; y < y0 + sy; ++y)
            for (int x = x0; x < x0 + sx; ++x) p.at(z, y, x) = c;
      }
      break;
    case PredictionKind::kEmptyClass:
      for (uint16_t& v : p.v) v = v == labels - 1 ? 0 : v;
      break;
    case PredictionKind::kFilling:
      for (uint16_t& v : p.v) v = v == 0 ? static_cast<uint16_t>(labels - 1) : v;
      break;
  }
  return p;
}

// Class c's edge voxels (6-neighbourhood; outside the volume counts as another label), ascending.
inline std::vector<int64_t> EdgeVoxels(const LabelVolume& m, uint16_t c) {
  std::vector<int64_t> out;
  for (int z = 0; z < m.d; ++z) {
    for (int y = 0; y < m.h; ++y) {
      for (int x = 0; x < m.w; ++x) {
        if (m.at(z, y, x) != c) continue;
        const bool inner = z > 0 && z + 1 < m.d && y > 0 && y + 1 < m.h && x > 0 && x + 1 < m.w;
        const bool interior = inner && m.at(z - 1, y, x) == c && m.at(z + 1, y, x) == c && m.at(z, y - 1, x) == c &&
                              m.at(z, y + 1, x) == c && m.at(z, y, x - 1) == c && m.at(z, y, x + 1) == c;
        if (!interior) out.push_back((static_cast<int64_t>(z) * m.h + y) * m.w + x);
      }
    }
  }
  return out;
}

}  // namespace test
}  // namespace tally

#endif  // TALLY_TESTS_METRICS_PREDICTION_KINDS_H_
