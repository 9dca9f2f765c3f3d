#include "metrics/aggregator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "metrics/lesion.h"
#include "metrics/parallel_for.h"
#include "metrics/statistics.h"
#include "metrics/surface_distance.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Ratio(double num, double den) { return den > 0 ? num / den : kNaN; }

// A lesion metric from lesion counts and sums (metrics/lesion.h; hd95_sum holds the false
// positives' maximum): per image, or pooled over images.
double LesionValue(Metric m, int64_t tp, int64_t fn, int64_t fp, double dice_sum, double hd95_sum) {
  switch (m) {
    case Metric::kLesionDice: return LesionDice(tp + fn, fp, dice_sum);
    case Metric::kLesionHd95: return LesionHd95(tp + fn, fp, hd95_sum);
    case Metric::kLesionSensitivity: return Ratio(static_cast<double>(tp), static_cast<double>(tp + fn));
    case Metric::kLesionPrecision: return Ratio(static_cast<double>(tp), static_cast<double>(tp + fp));
    case Metric::kLesionF1: return Ratio(2.0 * static_cast<double>(tp), static_cast<double>(2 * tp + fp + fn));
    case Metric::kLesionTp: return static_cast<double>(tp);
    case Metric::kLesionFp: return static_cast<double>(fp);
    case Metric::kLesionFn: return static_cast<double>(fn);
    default: return kNaN;
  }
}

}  // namespace

Aggregator::Aggregator(AggregateOptions options) : options_(std::move(options)) {
  classes_.assign(std::max(0, options_.num_classes), PerClass());
  // Row keys are hashes (a fraction of them by the job's rows); positions count from 0.
  const IntervalSample interval(options_.interval == IntervalKind::kRows
                                    ? IntervalSample::HashKeyLimit(options_.population_rows)
                                    : static_cast<uint64_t>(kMaxIntervalRows));
  for (PerClass& pc : classes_) {
    pc.dice_interval = interval;
    pc.iou_ge.assign(options_.iou_thresholds.size(), 0);
    pc.sum.resize(options_.metrics.size());
  }
  thresholds_.resize(options_.thresholds.size());
}

double Aggregator::ImageMetric(const v1::ImageResult& result, int c, Metric m, EmptyScore empty) {
  if (c < 0 || c >= result.classes_size()) return kNaN;
  const v1::ClassResult& cr = result.classes(c);
  if (IsCountMetric(m)) return CountMetricWithEmpty(m, ConfusionCounts{cr.tp(), cr.fp(), cr.fn(), cr.tn()}, empty);
  if (IsLesionMetric(m)) {
    if (!cr.lesion()) return kNaN;
    return LesionValue(m, cr.lesion_tp(), cr.lesion_fn(), cr.lesion_fp(), cr.lesion_dice_sum(), cr.lesion_hd95_sum());
  }
  return SurfaceMetric(m, SurfaceValues{cr.hd(), cr.hd95(), cr.assd(), cr.nsd()});
}

namespace {
constexpr size_t kWorstRows = 10;

// Per-image values in [0, 1], binned over it (distances and counts over [0, their largest]).
bool UnitRange(Metric m) {
  return IsCountMetric(m) || m == Metric::kLesionDice || m == Metric::kLesionSensitivity ||
         m == Metric::kLesionPrecision || m == Metric::kLesionF1;
}

// `entry` into a max-heap of the kWorstRows lowest (dice, index) pairs.
void KeepWorst(const std::pair<double, int64_t>& entry, std::vector<std::pair<double, int64_t>>* heap) {
  if (heap->size() >= kWorstRows && !(entry < heap->front())) return;
  heap->push_back(entry);
  std::push_heap(heap->begin(), heap->end());
  if (heap->size() > kWorstRows) {
    std::pop_heap(heap->begin(), heap->end());
    heap->pop_back();
  }
}
}  // namespace

void Aggregator::AddValue(PerClass* pc, size_t slot, Metric m, double v, int64_t index, uint64_t order_key) {
  const int k = static_cast<int>(m);
  if (m == Metric::kIou && !std::isnan(v)) {
    ++pc->iou_defined;
    for (size_t t = 0; t < options_.iou_thresholds.size(); ++t) pc->iou_ge[t] += v >= options_.iou_thresholds[t];
  }
  if (std::isnan(v)) return;
  if (std::isinf(v)) {
    ++pc->inf_count[k];
  } else {
    pc->sum[slot].Add(v);
    ++pc->count[k];
    if (UnitRange(m)) pc->unit_bins[k][std::clamp(static_cast<int>(v * kHistogramBins), 0, kHistogramBins - 1)]++;
  }
  if (m == Metric::kDice) {
    if (options_.interval != IntervalKind::kNone) pc->dice_interval.Add(order_key, v);
    pc->dice_zero += v == 0.0;
    KeepWorst({v, index}, &pc->worst);
  } else if (!UnitRange(m)) {
    pc->values[k].push_back(v);
  }
}

void Aggregator::Add(const v1::ImageResult& result, std::optional<uint64_t> order_key) {
  ++images_;
  uint64_t key = 0;
  if (order_key.has_value()) {
    key = *order_key;
  } else if (options_.interval == IntervalKind::kSample) {
    key = static_cast<uint64_t>(result.index());
  } else {
    key = RowKey(absl::StrCat("#", result.index()));
  }
  for (int c = 0; c < static_cast<int>(classes_.size()) && c < result.classes_size(); ++c) {
    PerClass& pc = classes_[c];
    const v1::ClassResult& cr = result.classes(c);
    pc.counts += ConfusionCounts{cr.tp(), cr.fp(), cr.fn(), cr.tn()};
    pc.reference_images += cr.tp() + cr.fn() > 0;
    pc.predicted_images += cr.tp() + cr.fp() > 0;
    if (cr.lesion()) {
      ++pc.lesion_rows;
      pc.lesion_tp += cr.lesion_tp();
      pc.lesion_fn += cr.lesion_fn();
      pc.lesion_fp += cr.lesion_fp();
      pc.lesion_dice_sum.Add(cr.lesion_dice_sum());
      pc.lesion_hd95_sum.Add(cr.lesion_hd95_sum());
    }
    for (size_t slot = 0; slot < options_.metrics.size(); ++slot) {
      const Metric m = options_.metrics[slot];
      AddValue(&pc, slot, m, ImageMetric(result, c, m, options_.empty_score), result.index(), key);
    }
  }
  for (size_t t = 0; t < thresholds_.size() && t < static_cast<size_t>(result.thresholds_size()); ++t) {
    const v1::ThresholdCounts& tc = result.thresholds(static_cast<int>(t));
    const ConfusionCounts counts{tc.tp(), tc.fp(), tc.fn(), tc.tn()};
    PerThreshold& pt = thresholds_[t];
    pt.counts += counts;
    const double dice = CountMetricWithEmpty(Metric::kDice, counts, options_.empty_score);
    const double iou = CountMetricWithEmpty(Metric::kIou, counts, options_.empty_score);
    if (!std::isnan(dice)) {
      pt.dice_sum.Add(dice);
      ++pt.dice_n;
    }
    if (!std::isnan(iou)) {
      pt.iou_sum.Add(iou);
      ++pt.iou_n;
    }
  }
}

void Aggregator::Merge(const Aggregator& other) {
  images_ += other.images_;
  for (size_t c = 0; c < classes_.size() && c < other.classes_.size(); ++c) {
    PerClass& pc = classes_[c];
    const PerClass& o = other.classes_[c];
    pc.counts += o.counts;
    for (size_t slot = 0; slot < pc.sum.size() && slot < o.sum.size(); ++slot) pc.sum[slot].Merge(o.sum[slot]);
    for (int k = 0; k < kNumMetrics; ++k) {
      pc.count[k] += o.count[k];
      pc.inf_count[k] += o.inf_count[k];
      pc.values[k].insert(pc.values[k].end(), o.values[k].begin(), o.values[k].end());
      for (int b = 0; b < kHistogramBins; ++b) pc.unit_bins[k][b] += o.unit_bins[k][b];
    }
    pc.dice_interval.Merge(o.dice_interval);
    pc.dice_zero += o.dice_zero;
    for (const auto& entry : o.worst) KeepWorst(entry, &pc.worst);
    pc.iou_defined += o.iou_defined;
    for (size_t t = 0; t < pc.iou_ge.size() && t < o.iou_ge.size(); ++t) pc.iou_ge[t] += o.iou_ge[t];
    pc.reference_images += o.reference_images;
    pc.predicted_images += o.predicted_images;
    pc.lesion_rows += o.lesion_rows;
    pc.lesion_tp += o.lesion_tp;
    pc.lesion_fn += o.lesion_fn;
    pc.lesion_fp += o.lesion_fp;
    pc.lesion_dice_sum.Merge(o.lesion_dice_sum);
    pc.lesion_hd95_sum.Merge(o.lesion_hd95_sum);
  }
  for (size_t t = 0; t < thresholds_.size() && t < other.thresholds_.size(); ++t) {
    thresholds_[t].counts += other.thresholds_[t].counts;
    thresholds_[t].dice_sum.Merge(other.thresholds_[t].dice_sum);
    thresholds_[t].iou_sum.Merge(other.thresholds_[t].iou_sum);
    thresholds_[t].dice_n += other.thresholds_[t].dice_n;
    thresholds_[t].iou_n += other.thresholds_[t].iou_n;
  }
}

ClassAggregate Aggregator::FinishClass(int c) const {
  const PerClass& pc = classes_[c];
  ClassAggregate ca;
  ca.class_id = c;
  ca.counts = pc.counts;
  ca.reference_images = pc.reference_images;
  ca.predicted_images = pc.predicted_images;
  for (Metric m : options_.metrics) {
    const int k = static_cast<int>(m);
    Histogram& h = ca.histograms[k];
    if (UnitRange(m)) {
      h.bins = pc.unit_bins[k];
      continue;
    }
    h.max = 0;
    for (double v : pc.values[k]) {
      if (std::isfinite(v)) h.max = std::max(h.max, v);
    }
    for (double v : pc.values[k]) {
      if (!std::isfinite(v)) continue;
      const int b = h.max > 0 ? static_cast<int>(v / h.max * kHistogramBins) : 0;
      h.bins[std::clamp(b, 0, kHistogramBins - 1)]++;
    }
  }
  for (size_t slot = 0; slot < options_.metrics.size(); ++slot) {
    const Metric m = options_.metrics[slot];
    const int k = static_cast<int>(m);
    MetricAggregate& ma = ca.metrics[k];
    ma.count = pc.count[k];
    ma.inf_count = pc.inf_count[k];
    ma.mean = pc.count[k] > 0 ? pc.sum[slot].Value() / static_cast<double>(pc.count[k]) : kNaN;
    if (IsCountMetric(m)) {
      ma.global = CountMetric(m, pc.counts);
    } else if (IsLesionMetric(m)) {
      // A class no row scored lesion by lesion (the background, unless included) has no pooled value.
      ma.global = pc.lesion_rows == 0 ? kNaN
                                      : LesionValue(m, pc.lesion_tp, pc.lesion_fn, pc.lesion_fp,
                                                    pc.lesion_dice_sum.Value(), pc.lesion_hd95_sum.Value());
    } else {
      std::vector<double> v = pc.values[k];  // One copy: PercentileLinear is right for any order of it.
      ma.median = PercentileLinear(&v, 0.5);
      ma.p95 = PercentileLinear(&v, 0.95);
    }
  }
  FinishDice(c, &ca);
  for (size_t t = 0; t < options_.iou_thresholds.size(); ++t) {
    ca.iou_ge.push_back(pc.iou_defined > 0 ? static_cast<double>(pc.iou_ge[t]) / static_cast<double>(pc.iou_defined)
                                           : kNaN);
  }
  return ca;
}

void Aggregator::FinishDice(int c, ClassAggregate* ca) const {
  const PerClass& pc = classes_[c];
  const int dice = static_cast<int>(Metric::kDice);
  ca->dice_zero_images = pc.dice_zero;
  const int64_t n = pc.count[dice];
  size_t slot = 0;
  while (slot < options_.metrics.size() && options_.metrics[slot] != Metric::kDice) ++slot;
  // The interval's values in their order (keys, then values for equal keys: repeated ids).
  std::pair<double, double> ci{kNaN, kNaN};
  if (options_.interval != IntervalKind::kNone && n > 0 && slot < pc.sum.size()) {
    double population = 0;
    if (options_.interval == IntervalKind::kSample) {
      // The class's share of the manifest, estimated from the sample's (rows where its Dice is defined).
      population = std::ceil(options_.population_rows * static_cast<double>(n) /
                             static_cast<double>(std::max<int64_t>(1, images_)));
    }
    ci = pc.dice_interval.Ci95(population);
  }
  ca->dice_ci_low = ci.first;
  ca->dice_ci_high = ci.second;
  ca->worst = pc.worst;
  std::sort(ca->worst.begin(), ca->worst.end());
}

void Aggregator::FinishThresholds(Aggregate* out) const {
  for (size_t t = 0; t < thresholds_.size(); ++t) {
    const PerThreshold& pt = thresholds_[t];
    ThresholdAggregate ta;
    ta.threshold = options_.thresholds[t];
    ta.dice_mean = pt.dice_n > 0 ? pt.dice_sum.Value() / static_cast<double>(pt.dice_n) : kNaN;
    ta.iou_mean = pt.iou_n > 0 ? pt.iou_sum.Value() / static_cast<double>(pt.iou_n) : kNaN;
    ta.dice_global = CountMetric(Metric::kDice, pt.counts);
    ta.iou_global = CountMetric(Metric::kIou, pt.counts);
    if (!std::isnan(ta.dice_mean) &&
        (out->best_threshold < 0 || ta.dice_mean > out->thresholds[static_cast<size_t>(out->best_threshold)].dice_mean)) {
      out->best_threshold = static_cast<int>(t);
    }
    out->thresholds.push_back(ta);
  }
}

Aggregate Aggregator::Finish() const {
  Aggregate out;
  out.images = images_;
  // The classes are independent: large jobs finish them on several threads (their percentiles and
  // histograms walk every row's values).
  out.classes.resize(classes_.size());
  const int threads = images_ < 100000 ? 1 : UsableCores();
  ParallelFor(classes_.size(), threads, [&](size_t c) { out.classes[c] = FinishClass(static_cast<int>(c)); });
  for (ClassAggregate& ca : out.classes) {
    ca.in_foreground_mean = (ca.class_id != 0 || options_.include_background) && ca.reference_images > 0;
  }
  for (Metric m : options_.metrics) {
    const int k = static_cast<int>(m);
    double sum = 0;
    int n = 0;
    for (const ClassAggregate& ca : out.classes) {
      if (!ca.in_foreground_mean) continue;
      // A class whose every image is undefined for this metric (NaN) has no mean to add.
      if (std::isnan(ca.metrics[k].mean)) continue;
      sum += ca.metrics[k].mean;
      ++n;
    }
    out.foreground_mean[k] = n > 0 ? sum / n : kNaN;
  }
  FinishThresholds(&out);
  return out;
}

}  // namespace tally
