#include "common/label_counts.h"

#include <algorithm>

#include "common/image_io.h"

namespace tally {

void CountClasses(const uint16_t* pred, const uint16_t* ref, int64_t n, int num_classes,
                  std::vector<ConfusionCounts>* out) {
  // Three tallies instead of a C x C matrix: tp where both agree, and each side's pixel counts.
  std::vector<int64_t> agree(num_classes, 0), in_pred(num_classes, 0), in_ref(num_classes, 0);
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t r = ref[i];
    if (r == kIgnoredPixel) continue;
    const uint16_t p = pred[i];
    ++valid;
    ++in_pred[p];
    ++in_ref[r];
    agree[p] += p == r;
  }
  out->assign(num_classes, {});
  for (int c = 0; c < num_classes; ++c) {
    ConfusionCounts& k = (*out)[c];
    k.tp = agree[c];
    k.fp = in_pred[c] - agree[c];
    k.fn = in_ref[c] - agree[c];
    k.tn = valid - k.tp - k.fp - k.fn;
  }
}

void CountRegions(const uint16_t* pred, const uint16_t* ref, int64_t n, const std::vector<std::vector<int>>& regions,
                  std::vector<ConfusionCounts>* out) {
  out->assign(regions.size(), {});
  std::vector<uint8_t> member(65536);
  for (size_t r = 0; r < regions.size(); ++r) {
    std::fill(member.begin(), member.end(), 0);
    for (int l : regions[r]) member[l] = 1;
    int64_t tp = 0, fp = 0, fn = 0, tn = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t rv = ref[i];
      if (rv == kIgnoredPixel) continue;
      const bool in_ref = member[rv], in_pred = member[pred[i]];
      tp += in_ref & in_pred;
      fp += !in_ref & in_pred;
      fn += in_ref & !in_pred;
      tn += !in_ref & !in_pred;
    }
    (*out)[r] = ConfusionCounts{tp, fp, fn, tn};
  }
}

int64_t FirstLabelAtOrAbove(const uint16_t* labels, int64_t n, int limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] != kIgnoredPixel && labels[i] >= limit) return i;
  }
  return -1;
}

int MaxLabel(const uint16_t* labels, int64_t n) {
  int m = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] != kIgnoredPixel) m = std::max<int>(m, labels[i]);
  }
  return m;
}

}  // namespace tally
