#include "server/report/report_instances.h"

#include "common/coco/coco_instances.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <tuple>

namespace tally {

void InstanceAccumulator::Add(const v1::ImageResult& r) {
  ++images_;
  int64_t tp = 0, fp = 0, fn = 0;
  for (const v1::CocoImageRecord& rec : r.instances()) {
    CocoImageEval e;
    e.image_id = r.coco_image_id();
    e.category_id = rec.category_id();
    e.scores.assign(rec.scores().begin(), rec.scores().end());
    e.outcome.resize(rec.outcomes().size());
    for (size_t i = 0; i < e.outcome.size(); ++i) e.outcome[i] = static_cast<CocoOutcome>(rec.outcomes()[i]);
    e.positives.assign(rec.positives().begin(), rec.positives().end());
    e.references = rec.references();
    e.detections = rec.detections();
    evals_.push_back(std::move(e));
    tp += rec.tp50();
    fp += rec.fp50();
    fn += rec.fn50();
    std::array<int64_t, 5>& c = counts_[rec.category_id()];
    c[0] += rec.references();
    c[1] += rec.detections();
    c[2] += rec.tp50();
    c[3] += rec.fp50();
    c[4] += rec.fn50();
  }
  const double f1 = InstanceF1(tp, fp, fn);  // The row's counts, summed above.
  if (std::isnan(f1)) return;
  worst_.push_back({f1, r.index(), tp, fp, fn});
  // Keep the lowest (f1, index): trim now and then so memory stays bounded.
  auto less = [](const InstanceReport::Worst& a, const InstanceReport::Worst& b) {
    return a.f1 != b.f1 ? a.f1 < b.f1 : a.index < b.index;
  };
  if (worst_.size() >= 4 * kWorstInstanceImages) {
    std::sort(worst_.begin(), worst_.end(), less);
    worst_.resize(kWorstInstanceImages);
  }
}

void InstanceAccumulator::Merge(InstanceAccumulator* other) {
  images_ += other->images_;
  evals_.insert(evals_.end(), std::make_move_iterator(other->evals_.begin()),
                std::make_move_iterator(other->evals_.end()));
  worst_.insert(worst_.end(), other->worst_.begin(), other->worst_.end());
  for (const auto& [id, c] : other->counts_) {
    std::array<int64_t, 5>& mine = counts_[id];
    for (size_t i = 0; i < c.size(); ++i) mine[i] += c[i];
  }
  other->images_ = 0;
  other->evals_.clear();
  other->worst_.clear();
  other->counts_.clear();
}

InstanceReport InstanceAccumulator::Finish() {
  InstanceReport out;
  out.present = true;
  out.images = images_;
  std::vector<const CocoImageEval*> ptrs;
  ptrs.reserve(evals_.size());
  for (const CocoImageEval& e : evals_) ptrs.push_back(&e);
  std::vector<int64_t> ids;
  for (const JobConfig::CocoCategory& c : config_.coco_categories) ids.push_back(c.id);
  const CocoAccumulated acc = AccumulateCoco(ptrs, ids);
  out.stats = SummarizeCoco(acc);
  std::map<int64_t, size_t> slot;
  for (const JobConfig::CocoCategory& c : config_.coco_categories) {
    slot[c.id] = out.categories.size();
    InstanceCategory k;
    k.id = c.id;
    k.name = c.name;
    out.categories.push_back(std::move(k));
  }
  for (const auto& [id, c] : counts_) {
    auto it = slot.find(id);
    if (it == slot.end()) continue;
    InstanceCategory& k = out.categories[it->second];
    k.references = c[0];
    k.detections = c[1];
    k.tp50 = c[2];
    k.fp50 = c[3];
    k.fn50 = c[4];
  }
  const CocoParams& p = CocoDefaultParams();
  auto threshold = [&](double v) {
    return static_cast<size_t>(std::find(p.iou_thresholds.begin(), p.iou_thresholds.end(), v) - p.iou_thresholds.begin());
  };
  const size_t t50 = threshold(.5), t75 = threshold(.75);
  for (size_t k = 0; k < acc.K && k < out.categories.size(); ++k) {
    InstanceCategory& c = out.categories[k];
    c.ap = CocoCategoryAp(acc, k);
    for (auto [t, curve, ap] : {std::tuple<size_t, std::vector<double>*, double*>{t50, &c.precision50, &c.ap50},
                                {t75, &c.precision75, &c.ap75}}) {
      std::vector<double> defined;
      for (size_t r = 0; r < acc.R; ++r) {
        const double v = acc.Precision(t, r, k, 0, acc.M - 1);
        curve->push_back(v);
        if (v > -1) defined.push_back(v);
      }
      *ap = defined.empty() ? -1 : NumpyMean(defined);
    }
  }
  std::sort(worst_.begin(), worst_.end(), [](const InstanceReport::Worst& a, const InstanceReport::Worst& b) {
    return a.f1 != b.f1 ? a.f1 < b.f1 : a.index < b.index;
  });
  if (worst_.size() > kWorstInstanceImages) worst_.resize(kWorstInstanceImages);
  out.worst = worst_;
  return out;
}

void PanopticAccumulator::Add(const v1::ImageResult& r) {
  PanopticImageStats stats;
  for (const v1::PanopticMatch& m : r.panoptic_matches()) stats.matches.emplace_back(m.category_id(), m.iou());
  for (const v1::PanopticCount& c : r.panoptic_fp()) stats.fp[c.category_id()] += c.count();
  for (const v1::PanopticCount& c : r.panoptic_fn()) stats.fn[c.category_id()] += c.count();
  images_.push_back(std::move(stats));
}

PanopticReport PanopticAccumulator::Finish() const {
  PanopticReport out;
  out.present = true;
  out.images = static_cast<int64_t>(images_.size());
  out.categories = config_.coco_categories;
  std::vector<PanopticCategory> categories;
  for (const JobConfig::CocoCategory& c : config_.coco_categories) categories.push_back({c.id, c.isthing});
  std::vector<const PanopticImageStats*> ptrs;
  for (const PanopticImageStats& s : images_) ptrs.push_back(&s);
  out.summary = SummarizePanoptic(ptrs, categories);
  return out;
}

}  // namespace tally
