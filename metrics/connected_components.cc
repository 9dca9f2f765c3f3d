#include "metrics/connected_components.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"

namespace tally {
namespace {

int32_t Find(std::vector<int32_t>& parent, int32_t x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

// The neighbours that come earlier in a row-major scan, as (dz, dy, dx), for a connectivity.
std::vector<std::array<int, 3>> EarlierNeighbours(bool volume, int connectivity) {
  std::vector<std::array<int, 3>> out;
  for (int dz = volume ? -1 : 0; dz <= 0; ++dz) {
    for (int dy = -1; dy <= 1; ++dy) {
      for (int dx = -1; dx <= 1; ++dx) {
        const bool earlier = dz < 0 || (dz == 0 && (dy < 0 || (dy == 0 && dx < 0)));
        if (!earlier) continue;
        const int order = (dz != 0) + (dy != 0) + (dx != 0);  // 1 face, 2 edge, 3 corner.
        const int most = volume ? (connectivity == 6 ? 1 : connectivity == 18 ? 2 : 3) : (connectivity == 4 ? 1 : 2);
        if (order <= most) out.push_back({dz, dy, dx});
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<int64_t> LabelComponents(const uint8_t* mask, int depth, int height, int width, int connectivity,
                                        std::vector<int32_t>* labels) {
  const bool volume = depth > 1;
  if (volume ? (connectivity != 6 && connectivity != 18 && connectivity != 26)
             : (connectivity != 4 && connectivity != 8)) {
    return absl::InvalidArgumentError(absl::StrCat("connectivity ", connectivity, " is not one of ",
                                                   volume ? "6, 18, 26 (3D)" : "4, 8 (2D)"));
  }
  const int64_t n = static_cast<int64_t>(depth) * height * width;
  labels->assign(n, 0);
  const std::vector<std::array<int, 3>> neighbours = EarlierNeighbours(volume, connectivity);
  // First pass: provisional labels in scan order, equivalences in a union-find whose roots are the
  // smallest provisional label of their set (so the first voxel's label is the root).
  std::vector<int32_t> parent = {0};
  for (int z = 0; z < depth; ++z) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        const int64_t i = (static_cast<int64_t>(z) * height + y) * width + x;
        if (!mask[i]) continue;
        int32_t label = 0;
        for (const auto& [dz, dy, dx] : neighbours) {
          const int zz = z + dz, yy = y + dy, xx = x + dx;
          if (zz < 0 || yy < 0 || yy >= height || xx < 0 || xx >= width) continue;
          const int32_t other = (*labels)[(static_cast<int64_t>(zz) * height + yy) * width + xx];
          if (other == 0) continue;
          if (label == 0) {
            label = Find(parent, other);
          } else {
            const int32_t a = Find(parent, label), b = Find(parent, other);
            if (a != b) parent[std::max(a, b)] = std::min(a, b);
            label = std::min(a, b);
          }
        }
        if (label == 0) {
          label = static_cast<int32_t>(parent.size());
          parent.push_back(label);
        }
        (*labels)[i] = label;
      }
    }
  }
  // Second pass: final numbers in the order of each set's first voxel (its root, the smallest label).
  std::vector<int32_t> number(parent.size(), 0);
  int32_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t& l = (*labels)[i];
    if (l == 0) continue;
    const int32_t root = Find(parent, l);
    if (number[root] == 0) number[root] = ++count;
    l = number[root];
  }
  return count;
}

namespace {

// A run of equal labels along x in one line (z, y): [begin, end).
struct Run {
  int begin, end;
  uint16_t label;
};

}  // namespace

// Runs of each line, joined to the runs of the earlier lines they touch (8- and 26-connectivity:
// runs touch when their x ranges overlap or meet at a corner), in a union-find over runs: linear
// in the pixels, with the work per run, not per pixel, where labels form regions.
std::vector<int64_t> CountComponentsPerLabel(const uint16_t* labels, int depth, int height, int width, int max_label) {
  std::vector<int64_t> out(std::max(0, max_label + 1), 0);
  if (max_label < 0 || height <= 0 || width <= 0) return out;
  std::vector<Run> runs;
  std::vector<size_t> line_start = {0};  // Runs of line (z * height + y) are [line_start[l], line_start[l + 1]).
  std::vector<int32_t> parent;
  const auto join = [&](size_t a, size_t b) {
    const int32_t x = Find(parent, static_cast<int32_t>(a)), y = Find(parent, static_cast<int32_t>(b));
    if (x != y) parent[std::max(x, y)] = std::min(x, y);
  };
  // Joins run r of the current line to the touching runs of line `other` with its label.
  const auto touch = [&](size_t r, int64_t other) {
    for (size_t k = line_start[other]; k < line_start[other + 1]; ++k) {
      if (runs[k].begin > runs[r].end) break;
      if (runs[k].end >= runs[r].begin && runs[k].label == runs[r].label) join(r, k);
    }
  };
  for (int z = 0; z < depth; ++z) {
    for (int y = 0; y < height; ++y) {
      const uint16_t* row = labels + (static_cast<int64_t>(z) * height + y) * width;
      const size_t first = runs.size();
      for (int x = 0; x < width;) {
        const uint16_t l = row[x];
        int e = x + 1;
        while (e < width && row[e] == l) ++e;
        if (l <= max_label) {
          runs.push_back({x, e, l});
          parent.push_back(static_cast<int32_t>(parent.size()));
        }
        x = e;
      }
      line_start.push_back(runs.size());
      const int64_t line = static_cast<int64_t>(z) * height + y;
      for (size_t r = first; r < runs.size(); ++r) {
        if (y > 0) touch(r, line - 1);
        for (int dy = -1; z > 0 && dy <= 1; ++dy) {
          if (y + dy >= 0 && y + dy < height) touch(r, line - height + dy);
        }
      }
    }
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    if (parent[r] == static_cast<int32_t>(r)) ++out[runs[r].label];
  }
  return out;
}

}  // namespace tally
