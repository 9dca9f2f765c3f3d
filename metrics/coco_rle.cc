#include "metrics/coco_rle.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"

namespace tally {
namespace {

// Walks two masks' runs together: calls on_span(length, a_bit, b_bit) for every stretch where
// neither mask changes. Runs of length 0 (a mask starting with a 1) are stepped over.
template <typename OnSpan>
void WalkRuns(const Rle& a, const Rle& b, OnSpan on_span) {
  size_t ia = 0, ib = 0;
  uint64_t left_a = a.counts.empty() ? 0 : a.counts[0], left_b = b.counts.empty() ? 0 : b.counts[0];
  while (ia < a.counts.size() && ib < b.counts.size()) {
    if (left_a == 0) {
      if (++ia < a.counts.size()) left_a = a.counts[ia];
      continue;
    }
    if (left_b == 0) {
      if (++ib < b.counts.size()) left_b = b.counts[ib];
      continue;
    }
    const uint64_t step = std::min(left_a, left_b);
    on_span(step, ia % 2 == 1, ib % 2 == 1);
    left_a -= step;
    left_b -= step;
  }
}

// Appends `length` pixels of value `bit` to runs being built (0s first).
void AppendRun(std::vector<uint32_t>* runs, bool bit, uint64_t length) {
  if (runs->empty()) runs->push_back(0);
  if ((runs->size() % 2 == 0) != bit) runs->push_back(0);  // Odd count: the last run is of 0s.
  runs->back() += static_cast<uint32_t>(length);
}

absl::Status CheckSum(const std::vector<uint32_t>& counts, int64_t height, int64_t width) {
  uint64_t total = 0;
  for (uint32_t c : counts) total += c;
  const uint64_t want = static_cast<uint64_t>(height) * static_cast<uint64_t>(width);
  if (total != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("RLE counts sum to ", total, ", not height x width = ", height, " x ", width, " = ", want));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(int64_t height, int64_t width) {
  if (!ProductWithin({height, width}, 0xffffffffll)) {
    return absl::InvalidArgumentError(absl::StrCat("mask size ", height, " x ", width, " is out of range"));
  }
  return absl::OkStatus();
}

// pycocotools' polygon walk: the points of every edge on the 5x grid, in the polygon's order.
void BoundaryPoints(const std::vector<int>& gx, const std::vector<int>& gy, std::vector<int>* u,
                    std::vector<int>* v) {
  const size_t k = gx.size() - 1;  // gx[k] closes the polygon.
  for (size_t j = 0; j < k; ++j) {
    int xs = gx[j], xe = gx[j + 1], ys = gy[j], ye = gy[j + 1];
    const int64_t dx = std::abs(int64_t{xe} - xs), dy = std::abs(int64_t{ys} - ye);
    const bool flip = (dx >= dy && xs > xe) || (dx < dy && ys > ye);
    if (flip) {
      std::swap(xs, xe);
      std::swap(ys, ye);
    }
    if (dx == 0 && dy == 0) {  // A repeated vertex: one point (its position is never read).
      u->push_back(xs);
      v->push_back(ys);
      continue;
    }
    if (dx >= dy) {
      const double slope = static_cast<double>(int64_t{ye} - ys) / static_cast<double>(dx);
      for (int64_t d = 0; d <= dx; ++d) {
        const int64_t t = flip ? dx - d : d;
        u->push_back(static_cast<int>(t + xs));
        v->push_back(static_cast<int>(ys + slope * static_cast<double>(t) + .5));
      }
    } else {
      const double slope = static_cast<double>(int64_t{xe} - xs) / static_cast<double>(dy);
      for (int64_t d = 0; d <= dy; ++d) {
        const int64_t t = flip ? dy - d : d;
        v->push_back(static_cast<int>(t + ys));
        u->push_back(static_cast<int>(xs + slope * static_cast<double>(t) + .5));
      }
    }
  }
}

constexpr double kScale = 5;

// A polygon's vertices on the 5x grid (closed: the first again at the end), as rleFrPoly rounds them.
// Errors: an odd number of coordinates, fewer than 3 points, a point farther outside the image than
// its size (the walk visits every point of every edge, so a far-away vertex would cost memory and
// time for nothing) or one whose grid coordinate does not fit 32 bits.
absl::Status PolygonGrid(const std::vector<double>& xy, int64_t height, int64_t width, std::vector<int>* gx,
                         std::vector<int>* gy) {
  if (xy.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a polygon has an odd number of coordinates (", xy.size(), ")"));
  }
  if (xy.size() < 6) {
    return absl::InvalidArgumentError(absl::StrCat("a polygon needs at least 3 points, not ", xy.size() / 2));
  }
  const double margin = static_cast<double>(std::max<int64_t>({height, width, 1}));
  const double limit = (static_cast<double>(std::numeric_limits<int>::max()) - 1) / kScale;
  const size_t k = xy.size() / 2;
  gx->assign(k + 1, 0);
  gy->assign(k + 1, 0);
  for (size_t j = 0; j < k; ++j) {
    const double x = xy[2 * j], y = xy[2 * j + 1];
    if (!(x >= -margin && x <= static_cast<double>(width) + margin && y >= -margin &&
          y <= static_cast<double>(height) + margin)) {
      return absl::InvalidArgumentError(absl::StrCat("polygon point ", j, " (", x, ", ", y,
                                                     ") is more than the image's size outside it"));
    }
    if (!(std::fabs(x) < limit && std::fabs(y) < limit)) {
      return absl::InvalidArgumentError(absl::StrCat("polygon point ", j, " (", x, ", ", y,
                                                     ") is too far out to rasterise"));
    }
    (*gx)[j] = static_cast<int>(kScale * x + .5);  // Truncated toward 0, as C's (int) cast.
    (*gy)[j] = static_cast<int>(kScale * y + .5);
  }
  (*gx)[k] = (*gx)[0];
  (*gy)[k] = (*gy)[0];
  return absl::OkStatus();
}

// The points BoundaryPoints walks for these vertices.
int64_t WalkPoints(const std::vector<int>& gx, const std::vector<int>& gy) {
  int64_t points = 0;
  for (size_t j = 0; j + 1 < gx.size(); ++j) {
    points += std::max(std::abs(int64_t{gx[j + 1]} - gx[j]), std::abs(int64_t{gy[j + 1]} - gy[j])) + 1;
  }
  return points;
}

// The bytes a union of masks with these runs in all needs at most while it is merged (the parts,
// a level's results and the merge in progress).
int64_t UnionBytes(int64_t runs) { return 3 * runs * static_cast<int64_t>(sizeof(uint32_t)); }

std::string Bytes(int64_t b) {
  return b >= (int64_t{1} << 30) ? absl::StrFormat("%.1f GiB", b / 1073741824.0)
                                 : absl::StrFormat("%.1f MiB", b / 1048576.0);
}

}  // namespace

int64_t PolygonWalkBytes(const std::vector<double>& xy, int64_t height, int64_t width) {
  std::vector<int> gx, gy;
  if (!PolygonGrid(xy, height, width, &gx, &gy).ok()) return 0;
  return WalkPoints(gx, gy) * kPolygonBytesPerPoint;
}

Rle RleFromMask(const uint8_t* mask, int64_t height, int64_t width) {
  Rle r;
  r.height = height;
  r.width = width;
  r.counts.push_back(0);
  bool bit = false;
  for (int64_t x = 0; x < width; ++x) {
    for (int64_t y = 0; y < height; ++y) {
      const bool here = mask[y * width + x] != 0;
      if (here != bit) {
        r.counts.push_back(0);
        bit = here;
      }
      ++r.counts.back();
    }
  }
  return r;
}

void RleToMask(const Rle& rle, uint8_t* mask) {
  int64_t p = 0;
  const int64_t h = rle.height;
  for (size_t j = 0; j < rle.counts.size(); ++j) {
    const uint8_t bit = j % 2;
    for (uint32_t c = 0; c < rle.counts[j]; ++c, ++p) mask[(p % h) * rle.width + p / h] = bit;
  }
}

absl::StatusOr<Rle> RleFromString(absl::string_view counts, int64_t height, int64_t width) {
  if (absl::Status s = CheckSize(height, width); !s.ok()) return s;
  Rle r;
  r.height = height;
  r.width = width;
  r.counts.reserve(counts.size());  // A run takes one character at least.
  size_t p = 0;
  while (p < counts.size()) {
    int64_t x = 0;
    int shift = 0;
    bool more = true;
    while (more) {
      if (p >= counts.size()) return absl::InvalidArgumentError("RLE string ends inside a run");
      const int c = static_cast<unsigned char>(counts[p]) - 48;
      if (c < 0 || c > 63) {
        return absl::InvalidArgumentError(absl::StrCat("RLE string has a character outside '0'..'o' at ", p));
      }
      if (shift > 35) return absl::InvalidArgumentError(absl::StrCat("RLE string has a run too long at ", p));
      x |= static_cast<int64_t>(c & 0x1f) << shift;
      more = (c & 0x20) != 0;
      ++p;
      shift += 5;
      if (!more && (c & 0x10)) x -= int64_t{1} << shift;  // Negative: sign-extend the last group.
    }
    if (r.counts.size() > 2) x += r.counts[r.counts.size() - 2];
    if (x < 0 || x > 0xffffffffll) {
      return absl::InvalidArgumentError(absl::StrCat("RLE run ", r.counts.size(), " is ", x, " (out of range)"));
    }
    r.counts.push_back(static_cast<uint32_t>(x));
  }
  if (absl::Status s = CheckSum(r.counts, height, width); !s.ok()) return s;
  return r;
}

std::string RleToString(const Rle& rle) {
  std::string out;
  for (size_t i = 0; i < rle.counts.size(); ++i) {
    int64_t x = rle.counts[i];
    if (i > 2) x -= rle.counts[i - 2];
    bool more = true;
    while (more) {
      int c = static_cast<int>(x & 0x1f);
      x >>= 5;  // Arithmetic: a negative difference keeps its sign.
      more = (c & 0x10) ? x != -1 : x != 0;
      if (more) c |= 0x20;
      out.push_back(static_cast<char>(c + 48));
    }
  }
  return out;
}

absl::StatusOr<Rle> RleFromCounts(const std::vector<int64_t>& counts, int64_t height, int64_t width) {
  if (absl::Status s = CheckSize(height, width); !s.ok()) return s;
  Rle r;
  r.height = height;
  r.width = width;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0 || counts[i] > 0xffffffffll) {
      return absl::InvalidArgumentError(absl::StrCat("RLE run ", i, " is ", counts[i], " (out of range)"));
    }
    r.counts.push_back(static_cast<uint32_t>(counts[i]));
  }
  if (absl::Status s = CheckSum(r.counts, height, width); !s.ok()) return s;
  return r;
}

absl::StatusOr<Rle> RleFromPolygon(const std::vector<double>& xy, int64_t height, int64_t width) {
  if (absl::Status s = CheckSize(height, width); !s.ok()) return s;
  std::vector<int> gx, gy;
  if (absl::Status s = PolygonGrid(xy, height, width, &gx, &gy); !s.ok()) return s;
  // Sized before the walk: kPolygonBytesPerPoint is what a point costs (PolygonWalkBytes).
  const size_t points = static_cast<size_t>(WalkPoints(gx, gy));
  std::vector<int> u, v;
  u.reserve(points);
  v.reserve(points);
  BoundaryPoints(gx, gy, &u, &v);
  // Where the boundary moves from one column of the fine grid to the next at a pixel centre:
  // the first pixel of that column below the crossing.
  const uint32_t h = static_cast<uint32_t>(height);
  std::vector<uint32_t> crossings;
  crossings.reserve(points + 1);
  for (size_t j = 1; j < u.size(); ++j) {
    if (u[j] == u[j - 1]) continue;
    double xd = u[j] < u[j - 1] ? u[j] : u[j] - 1;
    xd = (xd + .5) / kScale - .5;
    if (std::floor(xd) != xd || xd < 0 || xd > static_cast<double>(width - 1)) continue;
    double yd = v[j] < v[j - 1] ? v[j] : v[j - 1];
    yd = (yd + .5) / kScale - .5;
    if (yd < 0) {
      yd = 0;
    } else if (yd > static_cast<double>(height)) {
      yd = static_cast<double>(height);
    }
    yd = std::ceil(yd);
    crossings.push_back(static_cast<uint32_t>(static_cast<int>(xd) * static_cast<int>(h) + static_cast<int>(yd)));
  }
  crossings.push_back(static_cast<uint32_t>(height * width));
  std::sort(crossings.begin(), crossings.end());
  // Runs between crossings; a crossing repeated at one place toggles twice, so the run after it
  // joins the run before.
  Rle r;
  r.height = height;
  r.width = width;
  u = {};
  v = {};
  uint32_t previous = 0;
  std::vector<uint32_t> gaps;
  gaps.reserve(crossings.size());
  for (uint32_t c : crossings) {
    gaps.push_back(c - previous);
    previous = c;
  }
  r.counts.push_back(gaps[0]);
  for (size_t j = 1; j < gaps.size(); ++j) {
    if (gaps[j] > 0) {
      r.counts.push_back(gaps[j]);
    } else if (++j < gaps.size()) {
      r.counts.back() += gaps[j];
    }
  }
  return r;
}

absl::StatusOr<Rle> RleFromPolygons(const std::vector<std::vector<double>>& polygons, int64_t height,
                                    int64_t width, int64_t max_bytes) {
  std::vector<Rle> parts;
  int64_t runs = 0;
  for (size_t i = 0; i < polygons.size(); ++i) {
    // The cost is known before the work: a polygon that would pass the budget is refused unwalked.
    const int64_t walk = PolygonWalkBytes(polygons[i], height, width);
    if (max_bytes >= 0 && walk + UnionBytes(runs) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "polygon ", i, ": rasterising it walks ", walk / kPolygonBytesPerPoint, " boundary points (about ", Bytes(walk),
          polygons.size() > 1 ? absl::StrCat(" beside ", Bytes(UnionBytes(runs)), " for the polygons before it") : "",
          "), more than the ", Bytes(max_bytes), " this row may use"));
    }
    absl::StatusOr<Rle> part = RleFromPolygon(polygons[i], height, width);
    if (!part.ok()) return absl::InvalidArgumentError(absl::StrCat("polygon ", i, ": ", part.status().message()));
    runs += static_cast<int64_t>(part->counts.size());
    parts.push_back(*std::move(part));
  }
  if (parts.size() == 1) return parts[0];
  std::vector<const Rle*> all;
  for (const Rle& p : parts) all.push_back(&p);
  return RleUnion(all, height, width);
}

namespace {

// Two masks of one size united (canonical runs: no empty run but a first run of 0s).
Rle Union2(const Rle& a, const Rle& b) {
  Rle merged;
  merged.height = a.height;
  merged.width = a.width;
  merged.counts.reserve(a.counts.size() + b.counts.size());
  WalkRuns(a, b, [&](uint64_t n, bool x, bool y) { AppendRun(&merged.counts, x || y, n); });
  if (merged.counts.empty()) merged.counts.push_back(0);
  return merged;
}

}  // namespace

Rle RleUnion(const std::vector<const Rle*>& masks, int64_t height, int64_t width) {
  Rle empty;
  empty.height = height;
  empty.width = width;
  empty.counts.push_back(static_cast<uint32_t>(height * width));
  if (masks.empty()) return empty;
  if (masks.size() == 1) return Union2(empty, *masks[0]);
  // Pairwise, level by level: each level walks every run once, so n masks cost their runs times
  // log2 n, not n times (uniting them one after another made 200 000 polygons take minutes). The
  // union is one set of pixels whatever the order, and its canonical runs are unique.
  std::vector<Rle> level;
  level.reserve((masks.size() + 1) / 2);
  for (size_t i = 0; i < masks.size(); i += 2) {
    level.push_back(i + 1 < masks.size() ? Union2(*masks[i], *masks[i + 1]) : Union2(empty, *masks[i]));
  }
  while (level.size() > 1) {
    std::vector<Rle> next;
    next.reserve((level.size() + 1) / 2);
    for (size_t i = 0; i < level.size(); i += 2) {
      next.push_back(i + 1 < level.size() ? Union2(level[i], level[i + 1]) : std::move(level[i]));
    }
    level = std::move(next);
  }
  return std::move(level[0]);
}

void RleSpans(const Rle& a, const Rle& b, const std::function<void(uint64_t, uint64_t, bool, bool)>& on_span) {
  uint64_t at = 0;
  WalkRuns(a, b, [&](uint64_t n, bool x, bool y) {
    on_span(at, n, x, y);
    at += n;
  });
}

uint64_t RleArea(const Rle& rle) {
  uint64_t area = 0;
  for (size_t j = 1; j < rle.counts.size(); j += 2) area += rle.counts[j];
  return area;
}

std::array<double, 4> RleBbox(const Rle& rle) {
  const uint64_t h = static_cast<uint64_t>(rle.height);
  const size_t pairs = rle.counts.size() / 2;
  if (pairs == 0 || h == 0) return {0, 0, 0, 0};
  uint64_t xs = static_cast<uint64_t>(rle.width), ys = h, xe = 0, ye = 0;
  uint64_t end = 0;
  for (size_t p = 0; p < pairs; ++p) {
    end += rle.counts[2 * p];
    const uint64_t first = end;  // The run of 1s: its first pixel...
    end += rle.counts[2 * p + 1];
    const uint64_t last = end - 1;  // ...and its last.
    const uint64_t x0 = first / h, x1 = last / h;
    xs = std::min(xs, std::min(x0, x1));
    xe = std::max(xe, std::max(x0, x1));
    ys = std::min(ys, std::min(first % h, last % h));
    ye = std::max(ye, std::max(first % h, last % h));
    if (x0 < x1) {  // Across a column: every row.
      ys = 0;
      ye = h - 1;
    }
  }
  return {static_cast<double>(xs), static_cast<double>(ys), static_cast<double>(xe - xs + 1),
          static_cast<double>(ye - ys + 1)};
}

double RleIou(const Rle& detection, const Rle& reference, bool reference_is_crowd) {
  uint64_t inter = 0, uni = 0;
  WalkRuns(detection, reference, [&](uint64_t n, bool d, bool r) {
    if (d || r) uni += n;
    if (d && r) inter += n;
  });
  if (inter == 0) return 0;
  if (reference_is_crowd) uni = RleArea(detection);
  return static_cast<double>(inter) / static_cast<double>(uni);
}

}  // namespace tally
