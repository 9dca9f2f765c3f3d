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

std::vector<int64_t> CountComponentsPerLabel(const uint16_t* labels, int depth, int height, int width, int max_label) {
  std::vector<int64_t> out(std::max(0, max_label + 1), 0);
  if (max_label < 0) return out;
  const bool volume = depth > 1;
  const std::vector<std::array<int, 3>> neighbours = EarlierNeighbours(volume, volume ? 26 : 8);
  const int64_t n = static_cast<int64_t>(depth) * height * width;
  thread_local std::vector<int32_t> provisional;
  provisional.assign(n, -1);
  std::vector<int32_t> parent;
  std::vector<uint16_t> label_of;  // Each provisional set's label.
  for (int z = 0; z < depth; ++z) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        const int64_t i = (static_cast<int64_t>(z) * height + y) * width + x;
        const uint16_t l = labels[i];
        if (l > max_label) continue;
        int32_t set = -1;
        for (const auto& [dz, dy, dx] : neighbours) {
          const int zz = z + dz, yy = y + dy, xx = x + dx;
          if (zz < 0 || yy < 0 || yy >= height || xx < 0 || xx >= width) continue;
          const int64_t j = (static_cast<int64_t>(zz) * height + yy) * width + xx;
          if (labels[j] != l) continue;
          const int32_t other = Find(parent, provisional[j]);
          if (set < 0) {
            set = other;
          } else if (other != set) {
            parent[std::max(set, other)] = std::min(set, other);
            set = std::min(set, other);
          }
        }
        if (set < 0) {
          set = static_cast<int32_t>(parent.size());
          parent.push_back(set);
          label_of.push_back(l);
        }
        provisional[i] = set;
      }
    }
  }
  for (size_t s = 0; s < parent.size(); ++s) {
    if (parent[s] == static_cast<int32_t>(s)) ++out[label_of[s]];
  }
  if (provisional.capacity() > (int64_t{1} << 24)) std::vector<int32_t>().swap(provisional);
  return out;
}

}  // namespace tally
