#include "metrics/coco_eval.h"

#include <algorithm>
#include <cfloat>
#include <map>
#include <numeric>
#include <thread>

#include "metrics/parallel_for.h"

namespace tally {
namespace {

// numpy.linspace(start, stop, num): i * ((stop - start) / (num - 1)) + start, the last one `stop`.
std::vector<double> Linspace(double start, double stop, int num) {
  std::vector<double> out(num);
  const double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; ++i) out[i] = static_cast<double>(i) * step + start;
  out[num - 1] = stop;
  return out;
}

// numpy's pairwise summation of one contiguous block (numpy/_core/src/umath/loops_utils.h).
double PairwiseSum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

// The detections of one image kept for one category: indices into `detections`, best first.
std::vector<size_t> KeptDetections(const std::vector<CocoDetection>& detections, size_t max_det) {
  std::vector<size_t> order(detections.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return detections[x].score > detections[y].score; });
  if (order.size() > max_det) order.resize(max_det);
  return order;
}

// COCOeval.evaluateImg's matching at one area range: the outcome of each kept detection at each
// threshold, written to out[t * D + d].
void MatchAtAreaRange(const std::vector<CocoReference>& refs, const std::vector<CocoDetection>& dets,
                      const std::vector<size_t>& kept, const std::vector<double>& ious, const std::array<double, 2>& range,
                      const CocoParams& p, CocoOutcome* out, int64_t* positives, std::vector<int64_t>* matched) {
  const size_t G = refs.size(), D = kept.size();
  std::vector<bool> ignore(G);
  for (size_t g = 0; g < G; ++g) ignore[g] = refs[g].crowd || refs[g].area < range[0] || refs[g].area > range[1];
  std::vector<size_t> gorder(G);
  std::iota(gorder.begin(), gorder.end(), 0);
  std::stable_sort(gorder.begin(), gorder.end(), [&](size_t x, size_t y) { return !ignore[x] && ignore[y]; });
  *positives = static_cast<int64_t>(std::count(ignore.begin(), ignore.end(), false));
  for (size_t t = 0; t < p.iou_thresholds.size(); ++t) {
    std::vector<bool> taken(G, false);
    for (size_t d = 0; d < D; ++d) {
      double best = std::min(p.iou_thresholds[t], 1 - 1e-10);
      long m = -1;  // Position in gorder.
      for (size_t j = 0; j < G; ++j) {
        const size_t g = gorder[j];
        if (taken[g] && !refs[g].crowd) continue;
        if (m > -1 && !ignore[gorder[m]] && ignore[g]) break;
        const double iou = ious[d * G + g];
        if (iou < best) continue;
        best = iou;
        m = static_cast<long>(j);
      }
      CocoOutcome o;
      if (m > -1) {
        const size_t g = gorder[m];
        taken[g] = true;
        o = ignore[g] ? CocoOutcome::kIgnored : CocoOutcome::kTruePositive;
      } else {
        const double area = dets[kept[d]].area;
        o = (area < range[0] || area > range[1]) ? CocoOutcome::kIgnored : CocoOutcome::kFalsePositive;
      }
      out[t * D + d] = o;
      if (t == 0 && matched != nullptr) matched->push_back(m > -1 ? static_cast<int64_t>(gorder[m]) : -1);
    }
  }
}

// One category's kept detections in COCOeval's order (scores descending, a stable sort over the
// images in id order), their outcomes laid out for the curves: outcome[(a * T + t) * n + i] for
// area range a, threshold t and the i-th detection in that order, and rank[i] its rank in its
// image (for the maxDets cut). Each curve then reads its outcomes in order; read through each
// image's evaluation instead, every detection of every threshold was a cache miss (a third of
// tallyd's accumulate time on COCO val2017's 500 000 detections).
struct CategoryCurves {
  size_t n = 0;
  std::vector<CocoOutcome> outcome;
  std::vector<uint32_t> rank;
};

CategoryCurves OrderDetections(const std::vector<const CocoImageEval*>& images, size_t A, size_t T) {
  CategoryCurves c;
  std::vector<double> scores;
  for (const CocoImageEval* e : images) scores.insert(scores.end(), e->scores.begin(), e->scores.end());
  c.n = scores.size();
  std::vector<uint32_t> order(c.n);  // Sorted position -> position in image order.
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return scores[x] > scores[y]; });
  std::vector<uint32_t> sorted_at(c.n);
  for (size_t i = 0; i < c.n; ++i) sorted_at[order[i]] = static_cast<uint32_t>(i);
  c.outcome.resize(A * T * c.n);
  c.rank.resize(c.n);
  size_t base = 0;
  for (const CocoImageEval* e : images) {  // Each image's outcomes read in order, scattered by position.
    const size_t D = e->scores.size();
    for (size_t d = 0; d < D; ++d) c.rank[sorted_at[base + d]] = static_cast<uint32_t>(d);
    for (size_t at = 0; at < A * T; ++at) {
      const CocoOutcome* from = e->outcome.data() + at * D;
      CocoOutcome* to = c.outcome.data() + at * c.n;
      for (size_t d = 0; d < D; ++d) to[sorted_at[base + d]] = from[d];
    }
    base += D;
  }
  return c;
}

// COCOeval.accumulate's curves for one (category, area range, maxDets) cell, into `acc`: the
// detections of rank < max_det taken, in the category's order.
void AccumulateOne(const CategoryCurves& c, size_t max_det, int64_t positives, size_t k, size_t a, size_t m,
                   const CocoParams& p, CocoAccumulated* acc) {
  const size_t R = p.recall_thresholds.size(), T = p.iou_thresholds.size();
  std::vector<uint32_t> taken;
  taken.reserve(c.n);
  for (size_t i = 0; i < c.n; ++i) {
    if (c.rank[i] < max_det) taken.push_back(static_cast<uint32_t>(i));
  }
  const size_t nd = taken.size();
  const bool all = nd == c.n;
  std::vector<double> tps(nd), fps(nd), rc(nd), pr(nd);
  for (size_t t = 0; t < T; ++t) {
    const CocoOutcome* outcome = c.outcome.data() + (a * T + t) * c.n;
    // COCOeval's cumulative sums keep a place for each ignored detection, where recall and
    // precision repeat the previous place's (0 before the first counted one). Those places are left
    // out here: every recall threshold's first place at or above it is a counted detection's (or
    // the first place, for threshold 0, whose precision after the running maximum is the counted
    // ones' maximum either way), so the curve's values are COCOeval's to the bit, in fewer steps
    // (most detections are ignored at three of the four area ranges).
    double tp = 0, fp = 0;
    size_t nc = 0;
    for (size_t i = 0; i < nd; ++i) {
      const CocoOutcome o = outcome[all ? i : taken[i]];
      if (o == CocoOutcome::kIgnored) continue;
      tp += o == CocoOutcome::kTruePositive ? 1 : 0;
      fp += o == CocoOutcome::kFalsePositive ? 1 : 0;
      tps[nc] = tp;
      fps[nc] = fp;
      ++nc;
    }
    // COCOeval's divisions, element by element (a loop of its own, without the sums' dependence).
    const double npig = static_cast<double>(positives);
    for (size_t i = 0; i < nc; ++i) {
      rc[i] = tps[i] / npig;
      pr[i] = tps[i] / ((fps[i] + tps[i]) + DBL_EPSILON);
    }
    acc->recall[((t * acc->K + k) * acc->A + a) * acc->M + m] = nc > 0 ? rc[nc - 1] : 0;
    // COCOeval's running maximum from the end (pr[i - 1] = pr[i] where larger), carried in a
    // register (precisions are >= +0).
    double best = 0;
    for (size_t i = nc; i-- > 0;) {
      best = std::max(best, pr[i]);
      pr[i] = best;
    }
    const auto rc_end = rc.begin() + static_cast<std::ptrdiff_t>(nc);
    for (size_t r = 0; r < R; ++r) {
      const size_t at = std::lower_bound(rc.begin(), rc_end, p.recall_thresholds[r]) - rc.begin();
      const double q = at < nc ? pr[at] : 0;
      acc->precision[(((t * R + r) * acc->K + k) * acc->A + a) * acc->M + m] = q;
      if (at >= nc) {  // COCOeval stops at the first recall it cannot reach: 0 from there on.
        for (size_t r2 = r; r2 < R; ++r2) acc->precision[(((t * R + r2) * acc->K + k) * acc->A + a) * acc->M + m] = 0;
        break;
      }
    }
  }
}

// The mean of the values > -1 that `at(i)` yields for i in [0, n), -1 when there are none.
template <typename At>
double MeanDefined(size_t n, At at) {
  std::vector<double> values;
  for (size_t i = 0; i < n; ++i) {
    const double v = at(i);
    if (v > -1) values.push_back(v);
  }
  return values.empty() ? -1 : NumpyMean(values);
}

}  // namespace

const CocoParams& CocoDefaultParams() {
  static const CocoParams* params = [] {
    auto* p = new CocoParams;
    p->iou_thresholds = Linspace(.5, 0.95, 10);
    p->recall_thresholds = Linspace(.0, 1.00, 101);
    p->area_ranges = {{0, 1e5 * 1e5}, {0, 32 * 32}, {32 * 32, 96 * 96}, {96 * 96, 1e5 * 1e5}};
    p->max_dets = {1, 10, 100};
    return p;
  }();
  return *params;
}

double NumpyMean(const std::vector<double>& values) {
  constexpr size_t kBlock = 8192;  // numpy's buffer size: the reduction's inner loop sees this much.
  double sum = 0;
  for (size_t i = 0; i < values.size(); i += kBlock) {
    sum += PairwiseSum(values.data() + i, std::min(kBlock, values.size() - i));
  }
  return sum / static_cast<double>(values.size());
}

CocoImageEval EvaluateCocoImage(int64_t image_id, int64_t category_id, const std::vector<CocoReference>& references,
                                const std::vector<CocoDetection>& detections,
                                const std::function<double(size_t d, size_t g)>& iou, const CocoParams& p) {
  CocoImageEval e;
  e.image_id = image_id;
  e.category_id = category_id;
  e.references = static_cast<int64_t>(references.size());
  e.detections = static_cast<int64_t>(detections.size());
  const std::vector<size_t> kept = KeptDetections(detections, static_cast<size_t>(p.max_dets.back()));
  for (size_t d : kept) e.scores.push_back(detections[d].score);
  e.kept.assign(kept.begin(), kept.end());
  const size_t G = references.size(), D = kept.size(), T = p.iou_thresholds.size(), A = p.area_ranges.size();
  std::vector<double> ious(D * G);
  for (size_t d = 0; d < D; ++d) {
    for (size_t g = 0; g < G; ++g) ious[d * G + g] = iou(kept[d], g);
  }
  e.outcome.resize(A * T * D);
  e.positives.resize(A);
  for (size_t a = 0; a < A; ++a) {
    MatchAtAreaRange(references, detections, kept, ious, p.area_ranges[a], p, e.outcome.data() + a * T * D,
                     &e.positives[a], a == 0 ? &e.matched : nullptr);
  }
  return e;
}

CocoAccumulated AccumulateCoco(const std::vector<const CocoImageEval*>& evals, std::vector<int64_t> category_ids,
                               const CocoParams& p) {
  std::sort(category_ids.begin(), category_ids.end());
  category_ids.erase(std::unique(category_ids.begin(), category_ids.end()), category_ids.end());
  CocoAccumulated acc;
  acc.category_ids = category_ids;
  acc.T = p.iou_thresholds.size();
  acc.R = p.recall_thresholds.size();
  acc.K = category_ids.size();
  acc.A = p.area_ranges.size();
  acc.M = p.max_dets.size();
  acc.precision.assign(acc.T * acc.R * acc.K * acc.A * acc.M, -1);
  acc.recall.assign(acc.T * acc.K * acc.A * acc.M, -1);
  // Per category, its images in image-id order.
  std::map<int64_t, std::vector<const CocoImageEval*>> by_category;
  for (const CocoImageEval* e : evals) by_category[e->category_id].push_back(e);
  // Categories on several threads: each writes only its own cells of precision and recall.
  const int threads = std::clamp(UsableCores(), 1, 16);
  ParallelFor(acc.K, threads, [&](size_t k) {
    auto it = by_category.find(category_ids[k]);
    if (it == by_category.end()) return;
    std::vector<const CocoImageEval*>& images = it->second;
    std::stable_sort(images.begin(), images.end(),
                     [](const CocoImageEval* x, const CocoImageEval* y) { return x->image_id < y->image_id; });
    // COCOeval sorts each (area range, maxDets) cell's detections by score, stably; every cell's
    // detections are the same images' first max_det, so one stable sort of all of them, filtered
    // by rank, gives each cell's order (a stable sort's order restricted to a subset is the
    // subset's stable order).
    const CategoryCurves curves = OrderDetections(images, acc.A, acc.T);
    for (size_t a = 0; a < acc.A; ++a) {
      int64_t positives = 0;
      for (const CocoImageEval* e : images) positives += e->positives[a];
      if (positives == 0) continue;
      for (size_t m = 0; m < acc.M; ++m) {
        AccumulateOne(curves, static_cast<size_t>(p.max_dets[m]), positives, k, a, m, p, &acc);
      }
    }
  });
  return acc;
}

std::array<double, 12> SummarizeCoco(const CocoAccumulated& acc, const CocoParams& p) {
  const size_t T = acc.T, R = acc.R, K = acc.K, M = acc.M;
  const size_t last = M - 1;
  // t: a threshold index, or T for all of them.
  auto ap = [&](size_t t, size_t a) {
    const size_t t0 = t == T ? 0 : t, nt = t == T ? T : 1;
    return MeanDefined(nt * R * K, [&](size_t i) {
      return acc.Precision(t0 + i / (R * K), (i / K) % R, i % K, a, last);
    });
  };
  auto ar = [&](size_t a, size_t m) {
    return MeanDefined(T * K, [&](size_t i) { return acc.Recall(i / K, i % K, a, m); });
  };
  auto threshold = [&](double v) {
    return static_cast<size_t>(std::find(p.iou_thresholds.begin(), p.iou_thresholds.end(), v) -
                               p.iou_thresholds.begin());
  };
  return {ap(T, 0), ap(threshold(.5), 0), ap(threshold(.75), 0), ap(T, 1), ap(T, 2), ap(T, 3),
          ar(0, 0), ar(0, 1), ar(0, last), ar(1, last), ar(2, last), ar(3, last)};
}

double CocoCategoryAp(const CocoAccumulated& acc, size_t k) {
  return MeanDefined(acc.T * acc.R, [&](size_t i) { return acc.Precision(i / acc.R, i % acc.R, k, 0, acc.M - 1); });
}

}  // namespace tally
