#include "metrics/label_counts.h"

#include <algorithm>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif


namespace tally {

namespace {

// Bit 2j+1 set where pixel j of the 32 at p (and r) differs from pixel j+1 in either map; pixel 32
// is read, so it must exist.
inline uint64_t StretchEnds32(const uint16_t* p, const uint16_t* r) {
#if defined(__SSE2__)
  uint64_t same = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128i pa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * q));
    const __m128i pb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * q + 1));
    const __m128i ra = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 8 * q));
    const __m128i rb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 8 * q + 1));
    const __m128i eq = _mm_and_si128(_mm_cmpeq_epi16(pa, pb), _mm_cmpeq_epi16(ra, rb));
    same |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(eq))) << (16 * q);
  }
  return ~same & 0xAAAAAAAAAAAAAAAAULL;
#else
  uint64_t ends = 0;
  for (int j = 0; j < 32; ++j) {
    if (p[j] != p[j + 1] || r[j] != r[j + 1]) ends |= uint64_t{1} << (2 * j + 1);
  }
  return ends;
#endif
}

}  // namespace

void CountClasses(const uint16_t* pred, const uint16_t* ref, int64_t n, int num_classes,
                  std::vector<ConfusionCounts>* out) {
  // Three tallies instead of a C x C matrix: tp where both agree, and each side's pixel counts.
  // One set of tallies would make every increment wait for the previous one's store (neighbouring
  // stretches often hold the same labels): four sets, taking turns, summed at the end.
  // Ignored pixels count in a spare slot (index C), without a branch.
  const size_t slots = static_cast<size_t>(num_classes) + 1;
  const size_t spare = static_cast<size_t>(num_classes);
  std::vector<int64_t> tallies(12 * slots, 0);
  int64_t* agree[4];
  int64_t* in_pred[4];
  int64_t* in_ref[4];
  for (int k = 0; k < 4; ++k) {
    agree[k] = tallies.data() + (3 * k) * slots;
    in_pred[k] = tallies.data() + (3 * k + 1) * slots;
    in_ref[k] = tallies.data() + (3 * k + 2) * slots;
  }
  // `weight` pixels of the pair (p, r) into tally set k.
  auto add = [&](int k, uint16_t p, uint16_t r, int64_t weight) {
    const bool ignored = r == kIgnoredPixel;
    const size_t pi = ignored ? spare : p, ri = ignored ? spare : r;
    in_pred[k][pi] += weight;
    in_ref[k][ri] += weight;
    agree[k][pi] += p == r ? weight : 0;
  };
  auto one = [&](int k, int64_t i) { add(k, pred[i], ref[i], 1); };
  // Label maps are mostly long stretches of one (prediction, reference) pair: each block of 32
  // pixels is cut where either map changes (vector compares of each pixel with the next), and each
  // stretch is counted at once; tally sets take turns by stretch.
  constexpr int kBlock = 32;
  int64_t i = 0;
  int k = 0;
  for (; i + kBlock + 1 <= n; i += kBlock) {
    uint64_t ends = StretchEnds32(pred + i, ref + i) | (uint64_t{1} << 63);  // The block's last pixel ends one.
    int64_t start = i;
    while (ends != 0) {
      const int64_t stop = i + (__builtin_ctzll(ends) >> 1) + 1;
      ends &= ends - 1;
      add(k, pred[start], ref[start], stop - start);
      k = (k + 1) & 3;
      start = stop;
    }
  }
  for (; i < n; ++i) one(0, i);
  const int64_t ignored = in_ref[0][spare] + in_ref[1][spare] + in_ref[2][spare] + in_ref[3][spare];
  const int64_t valid = n - ignored;
  out->assign(num_classes, {});
  for (int c = 0; c < num_classes; ++c) {
    int64_t a = 0, q = 0, f = 0;
    for (int k = 0; k < 4; ++k) {
      a += agree[k][c];
      q += in_pred[k][c];
      f += in_ref[k][c];
    }
    ConfusionCounts& t = (*out)[c];
    t.tp = a;
    t.fp = q - a;
    t.fn = f - a;
    t.tn = valid - t.tp - t.fp - t.fn;
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


void CountConfusionMatrix(const uint16_t* pred, const uint16_t* ref, size_t n, int k, int64_t* counts) {
  // Neighbouring pixels mostly fall in the same cell, and one table would make every increment
  // wait for the previous one's store: four tables, one per pixel mod 4, summed at the end (3-4x
  // faster on the completion thread, where the Python backend's counting runs). Ignored pixels and
  // reference labels >= k (they fail the row in the pipeline) go to a spare cell, without a branch.
  const size_t cells = static_cast<size_t>(k) * k;
  thread_local std::vector<uint32_t> tables;  // Per image: at most 2^28 pixels, so 32 bits suffice.
  tables.assign(4 * (cells + 1), 0);
  uint32_t* t[4] = {tables.data(), tables.data() + (cells + 1), tables.data() + 2 * (cells + 1),
                    tables.data() + 3 * (cells + 1)};
  auto cell = [k, cells](uint16_t r, uint16_t q) -> size_t {
    return r != kIgnoredPixel && r < k ? static_cast<size_t>(r) * k + q : cells;
  };
  size_t p = 0;
  for (; p + 4 <= n; p += 4) {
    ++t[0][cell(ref[p], pred[p])];
    ++t[1][cell(ref[p + 1], pred[p + 1])];
    ++t[2][cell(ref[p + 2], pred[p + 2])];
    ++t[3][cell(ref[p + 3], pred[p + 3])];
  }
  for (; p < n; ++p) ++t[0][cell(ref[p], pred[p])];
  for (size_t c = 0; c < cells; ++c) counts[c] += static_cast<int64_t>(t[0][c]) + t[1][c] + t[2][c] + t[3][c];
}

void ClassCountsFromMatrix(const int64_t* m, int k, std::vector<ConfusionCounts>* out) {
  out->assign(k, ConfusionCounts{});
  int64_t total = 0;
  for (int a = 0; a < k * k; ++a) total += m[a];
  for (int c = 0; c < k; ++c) {
    int64_t row = 0, col = 0;
    for (int o = 0; o < k; ++o) {
      row += m[c * k + o];
      col += m[o * k + c];
    }
    const int64_t tp = m[c * k + c];
    (*out)[c] = ConfusionCounts{tp, col - tp, row - tp, total - row - col + tp};
  }
}

namespace {

#if defined(__SSE2__)
// Eight labels clamped to 255 (reference: to 254, and `ignore` to 255), still 16 bits each.
inline __m128i Narrow8(__m128i x, bool reference, __m128i ignore) {
  const __m128i c255 = _mm_set1_epi16(255);
  const __m128i small = _mm_cmpeq_epi16(_mm_srli_epi16(x, 8), _mm_setzero_si128());  // x < 256.
  __m128i c = _mm_or_si128(_mm_and_si128(small, x), _mm_andnot_si128(small, c255));
  if (!reference) return c;
  const __m128i big = _mm_cmpgt_epi16(c, _mm_set1_epi16(253));  // c in [0, 255]: a signed compare.
  c = _mm_or_si128(_mm_andnot_si128(big, c), _mm_and_si128(big, _mm_set1_epi16(254)));
  const __m128i ignored = _mm_cmpeq_epi16(x, ignore);
  return _mm_or_si128(_mm_andnot_si128(ignored, c), _mm_and_si128(ignored, c255));
}
#endif

// The scalar loops stayed a byte at a time at -O2 (1.3-2 ns a voxel: most of the device path's
// upload of a 512x512x300 pair on 16 threads, 10-11 ms on an H200's host): sixteen at once here.
void Narrow(const uint16_t* labels, int64_t n, bool reference, uint16_t ignore, uint8_t* out) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128i ign = _mm_set1_epi16(static_cast<short>(ignore));
  for (; i + 16 <= n; i += 16) {
    const __m128i a = Narrow8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(labels + i)), reference, ign);
    const __m128i b = Narrow8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(labels + i + 8)), reference, ign);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(a, b));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t v = labels[i];
    out[i] = static_cast<uint8_t>(reference ? (v == ignore ? 255 : std::min<uint16_t>(v, 254)) : std::min<uint16_t>(v, 255));
  }
}

}  // namespace

void NarrowPrediction(const uint16_t* labels, int64_t n, uint8_t* out) { Narrow(labels, n, false, 0, out); }

void NarrowReference(const uint16_t* labels, int64_t n, uint16_t ignore, uint8_t* out) {
  Narrow(labels, n, true, ignore, out);
}

}  // namespace tally
