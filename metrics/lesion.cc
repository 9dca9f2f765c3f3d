#include "metrics/lesion.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "metrics/connected_components.h"
#include "metrics/surface_distance.h"

namespace tally {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Dims {
  int d = 1, h = 1, w = 1;
  int64_t Index(int z, int y, int x) const { return (static_cast<int64_t>(z) * h + y) * w + x; }
  int64_t size() const { return static_cast<int64_t>(d) * h * w; }
};

// A half-open box [z0, z1) x [y0, y1) x [x0, x1); empty while z0 >= z1.
struct Box {
  int z0 = std::numeric_limits<int>::max(), y0 = std::numeric_limits<int>::max(), x0 = std::numeric_limits<int>::max();
  int z1 = 0, y1 = 0, x1 = 0;
  bool empty() const { return z0 >= z1; }
  void Add(int z, int y, int x) {
    z0 = std::min(z0, z), y0 = std::min(y0, y), x0 = std::min(x0, x);
    z1 = std::max(z1, z + 1), y1 = std::max(y1, y + 1), x1 = std::max(x1, x + 1);
  }
  void Add(const Box& b) {
    if (b.empty()) return;
    z0 = std::min(z0, b.z0), y0 = std::min(y0, b.y0), x0 = std::min(x0, b.x0);
    z1 = std::max(z1, b.z1), y1 = std::max(y1, b.y1), x1 = std::max(x1, b.x1);
  }
  Dims dims() const { return Dims{z1 - z0, y1 - y0, x1 - x0}; }
};

// `b` grown by r voxels on every side of the image's axes (not z in 2D), clipped to the image.
Box Grow(Box b, int r, const Dims& image, bool three_d) {
  if (three_d) b.z0 = std::max(0, b.z0 - r), b.z1 = std::min(image.d, b.z1 + r);
  b.y0 = std::max(0, b.y0 - r), b.y1 = std::min(image.h, b.y1 + r);
  b.x0 = std::max(0, b.x0 - r), b.x1 = std::min(image.w, b.x1 + r);
  return b;
}

// Calls fn(local index, global index) for every voxel of `b`, in row-major order.
template <typename Fn>
void ForBox(const Box& b, const Dims& image, Fn fn) {
  int64_t local = 0;
  for (int z = b.z0; z < b.z1; ++z) {
    for (int y = b.y0; y < b.y1; ++y) {
      const int64_t row = image.Index(z, y, 0);
      for (int x = b.x0; x < b.x1; ++x) fn(local++, row + x);
    }
  }
}

// One step of a 3-voxel line dilation along `axis` (0 z, 1 y, 2 x); voxels outside are empty.
std::vector<uint8_t> Dilate1D(const std::vector<uint8_t>& in, const Dims& dims, int axis) {
  std::vector<uint8_t> out(in);
  const int64_t stride = axis == 0 ? static_cast<int64_t>(dims.h) * dims.w : axis == 1 ? dims.w : 1;
  const int extent = axis == 0 ? dims.d : axis == 1 ? dims.h : dims.w;
  for (int64_t i = 0; i < dims.size(); ++i) {
    if (!in[i]) continue;
    const int pos = static_cast<int>((i / stride) % extent);
    if (pos > 0) out[i - stride] = 1;
    if (pos + 1 < extent) out[i + stride] = 1;
  }
  return out;
}

// scipy.ndimage.binary_dilation(mask, generate_binary_structure(rank, 2), iterations) of a box-local
// mask: offsets with at most two nonzero coordinates (3D: 18 neighbours) or all 8 (2D). The 3D
// structure is the union of the three axis-aligned 3x3 squares, each separable into two lines.
void Dilate(std::vector<uint8_t>* mask, const Dims& dims, bool three_d, int iterations) {
  for (int it = 0; it < iterations; ++it) {
    const std::vector<uint8_t> x = Dilate1D(*mask, dims, 2);
    if (!three_d) {
      *mask = Dilate1D(x, dims, 1);
      continue;
    }
    const std::vector<uint8_t> xy = Dilate1D(x, dims, 1), xz = Dilate1D(x, dims, 0);
    const std::vector<uint8_t> yz = Dilate1D(Dilate1D(*mask, dims, 1), dims, 0);
    for (size_t i = 0; i < mask->size(); ++i) (*mask)[i] = xy[i] | xz[i] | yz[i];
  }
}

struct Component {
  int64_t voxels = 0;
  Box box;
};

// Sizes and boxes of labels 1..n.
std::vector<Component> Describe(const std::vector<int32_t>& labels, int64_t n, const Dims& dims) {
  std::vector<Component> out(static_cast<size_t>(n) + 1);
  int64_t i = 0;
  for (int z = 0; z < dims.d; ++z) {
    for (int y = 0; y < dims.h; ++y) {
      for (int x = 0; x < dims.w; ++x, ++i) {
        if (labels[i] == 0) continue;
        Component& c = out[labels[i]];
        ++c.voxels;
        c.box.Add(z, y, x);
      }
    }
  }
  return out;
}

// Reference lesions merged by dilation (step 1): the reference voxels numbered by the component of
// the dilated mask they lie in. Every such component holds reference voxels, and numbering inside
// the box follows the image's row-major order, so the numbers are the whole image's.
absl::StatusOr<int64_t> MergedReferenceLesions(const uint8_t* ref, const Dims& dims, bool three_d, int connectivity,
                                               int dilation, std::vector<int32_t>* labels) {
  labels->assign(static_cast<size_t>(dims.size()), 0);
  Box all;
  int64_t i = 0;
  for (int z = 0; z < dims.d; ++z) {
    for (int y = 0; y < dims.h; ++y) {
      for (int x = 0; x < dims.w; ++x, ++i) {
        if (ref[i]) all.Add(z, y, x);
      }
    }
  }
  if (all.empty()) return 0;
  const Box box = Grow(all, dilation, dims, three_d);
  const Dims local_dims = box.dims();
  std::vector<uint8_t> local(static_cast<size_t>(local_dims.size()));
  ForBox(box, dims, [&](int64_t l, int64_t g) { local[l] = ref[g] != 0; });
  Dilate(&local, local_dims, three_d, dilation);
  std::vector<int32_t> merged;
  absl::StatusOr<int64_t> n = LabelComponents(local.data(), local_dims.d, local_dims.h, local_dims.w, connectivity,
                                              &merged);
  if (!n.ok()) return n.status();
  ForBox(box, dims, [&](int64_t l, int64_t g) {
    if (ref[g]) (*labels)[g] = merged[l];
  });
  return *n;
}

// HD95 of reference lesion `lesion` against the predicted components marked in `chosen`, on the
// box around both padded by one empty voxel (outside the image counts as empty anyway).
double MatchedHd95(const std::vector<int32_t>& rlab, int32_t lesion, const std::vector<int32_t>& plab,
                  const std::vector<uint8_t>& chosen, const Box& around, const Dims& dims, bool three_d,
                  const LesionOptions& o) {
  const int pad_z = three_d ? 1 : 0;
  const Dims local{around.z1 - around.z0 + 2 * pad_z, around.y1 - around.y0 + 2, around.x1 - around.x0 + 2};
  std::vector<uint8_t> p(static_cast<size_t>(local.size()), 0), r(p.size(), 0);
  for (int z = around.z0; z < around.z1; ++z) {
    for (int y = around.y0; y < around.y1; ++y) {
      for (int x = around.x0; x < around.x1; ++x) {
        const int64_t g = dims.Index(z, y, x);
        const int64_t l = local.Index(z - around.z0 + pad_z, y - around.y0 + 1, x - around.x0 + 1);
        r[l] = rlab[g] == lesion;
        p[l] = plab[g] != 0 && chosen[plab[g]];
      }
    }
  }
  if (three_d) {
    return BinarySurfaceMetrics3D(p.data(), r.data(), local.d, local.h, local.w,
                                  SurfaceOptions3D{o.spacing_z, o.spacing_y, o.spacing_x, 1.0})
        .hd95;
  }
  return BinarySurfaceMetrics(p.data(), r.data(), local.h, local.w, SurfaceOptions{o.spacing_y, o.spacing_x, 1.0})
      .hd95;
}

// Dilation matching: the predicted components with a voxel in the lesion's dilation, ascending.
// `chosen` (all 0) marks them.
std::vector<int32_t> TouchingComponents(const std::vector<int32_t>& rlab, int32_t lesion, const Box& lesion_box,
                                        const std::vector<int32_t>& plab, const Dims& dims, bool three_d, int dilation,
                                        std::vector<uint8_t>* chosen) {
  const Box box = Grow(lesion_box, dilation, dims, three_d);
  const Dims local_dims = box.dims();
  std::vector<uint8_t> local(static_cast<size_t>(local_dims.size()));
  ForBox(box, dims, [&](int64_t l, int64_t g) { local[l] = rlab[g] == lesion; });
  Dilate(&local, local_dims, three_d, dilation);
  std::vector<int32_t> out;
  ForBox(box, dims, [&](int64_t l, int64_t g) {
    if (local[l] && plab[g] != 0 && !(*chosen)[plab[g]]) {
      (*chosen)[plab[g]] = 1;
      out.push_back(plab[g]);
    }
  });
  std::sort(out.begin(), out.end());
  return out;
}

// IoU matching: per reference lesion, its component (0: none), greedy by IoU.
std::vector<int32_t> MatchByIou(const std::vector<int32_t>& rlab, const std::vector<int32_t>& plab,
                                const std::vector<Component>& rc, const std::vector<Component>& pc, double threshold) {
  std::map<std::pair<int32_t, int32_t>, int64_t> overlap;
  for (size_t i = 0; i < rlab.size(); ++i) {
    if (rlab[i] != 0 && plab[i] != 0) ++overlap[{rlab[i], plab[i]}];
  }
  std::vector<std::tuple<double, int32_t, int32_t>> pairs;  // (-IoU, ref, pred): sorted ascending.
  for (const auto& [key, both] : overlap) {
    const double iou = static_cast<double>(both) / static_cast<double>(rc[key.first].voxels + pc[key.second].voxels - both);
    if (iou >= threshold) pairs.emplace_back(-iou, key.first, key.second);
  }
  std::sort(pairs.begin(), pairs.end());
  std::vector<int32_t> match(rc.size(), 0);
  std::vector<uint8_t> taken(pc.size(), 0);
  for (const auto& [neg_iou, r, p] : pairs) {
    if (match[r] != 0 || taken[p]) continue;
    match[r] = p;
    taken[p] = 1;
  }
  return match;
}

}  // namespace

const char* LesionKindName(LesionKind k) {
  switch (k) {
    case LesionKind::kTruePositive: return "tp";
    case LesionKind::kFalseNegative: return "fn";
    case LesionKind::kFalsePositive: return "fp";
    case LesionKind::kSmall: return "small";
  }
  return "?";
}

double LesionDice(int64_t lesions, int64_t fp, double dice_sum) {
  const int64_t n = lesions + fp;
  return n > 0 ? dice_sum / static_cast<double>(n) : 1.0;
}

double LesionHd95(int64_t lesions, int64_t fp, double hd95_sum) {
  const int64_t n = lesions + fp;
  return n > 0 ? hd95_sum / static_cast<double>(n) : 0.0;
}

// What the components cost beside the voxels' own buffers, against what the row may still use.
absl::Status CheckComponentBytes(int64_t predicted, int64_t reference, int64_t max_bytes) {
  if (max_bytes < 0 || (predicted + reference) * kLesionBytesPerComponent <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      predicted, " predicted and ", reference, " reference components need about ",
      (predicted + reference) * kLesionBytesPerComponent / 1048576, " MiB beside the voxels, more than the ",
      max_bytes / 1048576, " MiB left for them (--max-worker-memory)"));
}

// Steps: components of both masks; reference lesions (merged by dilation, or the components); per
// lesion its components (dilation or IoU), Dice and HD95; the components nobody took are false
// positives.
absl::Status ComputeLesions(const uint8_t* pred, const uint8_t* ref, int depth, int height, int width,
                            const LesionOptions& options, LesionSummary* summary, std::vector<LesionRecord>* records) {
  const bool three_d = depth > 1;
  const Dims dims{depth, height, width};
  const int connectivity = options.connectivity != 0 ? options.connectivity : three_d ? 26 : 8;
  const bool by_iou = options.iou_threshold > 0;
  std::vector<int32_t> plab, rlab;
  absl::StatusOr<int64_t> np = LabelComponents(pred, depth, height, width, connectivity, &plab);
  if (!np.ok()) return np.status();
  absl::StatusOr<int64_t> nr = by_iou || options.dilation <= 0
                                   ? LabelComponents(ref, depth, height, width, connectivity, &rlab)
                                   : MergedReferenceLesions(ref, dims, three_d, connectivity, options.dilation, &rlab);
  if (!nr.ok()) return nr.status();
  RETURN_IF_ERROR(CheckComponentBytes(*np, *nr, options.max_component_bytes));
  const std::vector<Component> pc = Describe(plab, *np, dims), rc = Describe(rlab, *nr, dims);
  const std::vector<int32_t> iou_match = by_iou ? MatchByIou(rlab, plab, rc, pc, options.iou_threshold)
                                                : std::vector<int32_t>();
  auto volume = [&](int64_t voxels) {  // BraTS: np.sum(gt_tmp) * sx * sy * sz, in that order.
    const double v = static_cast<double>(voxels) * options.spacing_x * options.spacing_y;
    return three_d ? v * options.spacing_z : v;
  };
  *summary = LesionSummary{};
  if (records != nullptr) records->clear();
  std::vector<uint8_t> used(pc.size(), 0), chosen(pc.size(), 0);
  for (int32_t lesion = 1; lesion <= *nr; ++lesion) {
    const Component& c = rc[lesion];
    std::vector<int32_t> mine;  // Its predicted components, ascending.
    if (by_iou) {
      if (iou_match[lesion] != 0) mine.push_back(iou_match[lesion]);
    } else {
      mine = TouchingComponents(rlab, lesion, c.box, plab, dims, three_d, options.dilation, &chosen);
    }
    LesionRecord rec;
    rec.lesion = lesion;
    rec.voxels = c.voxels;
    rec.volume = volume(c.voxels);
    rec.matched = static_cast<int32_t>(mine.size());
    Box around = c.box;
    for (int32_t p : mine) {
      chosen[p] = 1;
      used[p] = 1;
      rec.matched_voxels += pc[p].voxels;
      around.Add(pc[p].box);
    }
    int64_t both = 0;
    ForBox(c.box, dims, [&](int64_t, int64_t g) { both += rlab[g] == lesion && plab[g] != 0 && chosen[plab[g]]; });
    rec.dice = 2.0 * static_cast<double>(both) / static_cast<double>(c.voxels + rec.matched_voxels);
    rec.hd95 = mine.empty() ? kInf : MatchedHd95(rlab, lesion, plab, chosen, around, dims, three_d, options);
    for (int32_t p : mine) chosen[p] = 0;
    const bool counted = rec.volume > options.min_volume;
    rec.kind = !counted ? LesionKind::kSmall : mine.empty() ? LesionKind::kFalseNegative : LesionKind::kTruePositive;
    if (counted) {
      ++summary->lesions;
      ++(mine.empty() ? summary->fn : summary->tp);
      summary->dice_sum += rec.dice;
      summary->hd95_sum += std::isinf(rec.hd95) ? options.max_hd95 : rec.hd95;
    } else {
      ++summary->small;
    }
    if (records != nullptr) records->push_back(rec);
  }
  for (int32_t p = 1; p <= *np; ++p) {
    if (used[p]) continue;
    ++summary->fp;
    if (records == nullptr) continue;
    LesionRecord rec;
    rec.kind = LesionKind::kFalsePositive;
    rec.component = p;
    rec.voxels = pc[p].voxels;
    rec.volume = volume(pc[p].voxels);
    rec.dice = 0;
    rec.hd95 = options.max_hd95;
    records->push_back(rec);
  }
  summary->hd95_sum += options.max_hd95 * static_cast<double>(summary->fp);
  return absl::OkStatus();
}

}  // namespace tally
