#include "metrics/panoptic.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace tally {
namespace {

constexpr uint32_t kVoid = 0;

// Segments by id; an id listed twice is refused.
absl::StatusOr<std::map<uint32_t, const PanopticSegment*>> ById(const std::vector<PanopticSegment>& segments,
                                                                const char* side) {
  std::map<uint32_t, const PanopticSegment*> out;
  for (const PanopticSegment& s : segments) {
    if (!out.emplace(s.id, &s).second) {
      return absl::InvalidArgumentError(absl::StrCat(side, " segment ", s.id, " is listed twice in segments_info"));
    }
  }
  return out;
}

// Pixels per (reference id, predicted id), in that order, and per predicted id.
void CountPairs(const uint32_t* reference, const uint32_t* prediction, size_t pixels,
                std::map<std::pair<uint32_t, uint32_t>, int64_t>* pairs, std::map<uint32_t, int64_t>* predicted_area) {
  std::pair<uint32_t, uint32_t> run_key{0, 0};
  int64_t run = 0;
  auto flush = [&] {
    if (run == 0) return;
    (*pairs)[run_key] += run;
    (*predicted_area)[run_key.second] += run;
  };
  for (size_t i = 0; i < pixels; ++i) {
    const std::pair<uint32_t, uint32_t> key{reference[i], prediction[i]};
    if (run > 0 && key == run_key) {
      ++run;
      continue;
    }
    flush();
    run_key = key;
    run = 1;
  }
  flush();
}

}  // namespace

absl::StatusOr<PanopticImageStats> EvaluatePanopticImage(const uint32_t* reference, const uint32_t* prediction,
                                                         size_t pixels,
                                                         const std::vector<PanopticSegment>& reference_segments,
                                                         const std::vector<PanopticSegment>& predicted_segments,
                                                         const std::vector<PanopticCategory>& categories) {
  absl::StatusOr<std::map<uint32_t, const PanopticSegment*>> gt = ById(reference_segments, "reference");
  if (!gt.ok()) return gt.status();
  absl::StatusOr<std::map<uint32_t, const PanopticSegment*>> pred = ById(predicted_segments, "predicted");
  if (!pred.ok()) return pred.status();
  std::set<int64_t> known;
  for (const PanopticCategory& c : categories) known.insert(c.id);
  std::map<std::pair<uint32_t, uint32_t>, int64_t> pairs;
  std::map<uint32_t, int64_t> area;
  CountPairs(reference, prediction, pixels, &pairs, &area);
  for (const auto& [id, n] : area) {
    if (id == kVoid) continue;
    auto it = pred->find(id);
    if (it == pred->end()) {
      return absl::InvalidArgumentError(absl::StrCat("predicted segment ", id, " is in the map but not in segments_info"));
    }
    if (!known.count(it->second->category_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("predicted segment ", id, " has category ", it->second->category_id, ", not in the categories"));
    }
  }
  for (const PanopticSegment& s : predicted_segments) {
    if (s.id == kVoid || !area.count(s.id)) {
      return absl::InvalidArgumentError(absl::StrCat("predicted segment ", s.id, " is in segments_info but not in the map"));
    }
  }
  auto void_overlap = [&](uint32_t p) {
    auto it = pairs.find({kVoid, p});
    return it == pairs.end() ? int64_t{0} : it->second;
  };
  PanopticImageStats out;
  std::set<uint32_t> gt_matched, pred_matched;
  for (const auto& [key, inter] : pairs) {
    auto g = gt->find(key.first);
    auto p = pred->find(key.second);
    if (g == gt->end() || p == pred->end() || g->second->iscrowd) continue;
    if (g->second->category_id != p->second->category_id) continue;
    const double uni = static_cast<double>(area[key.second]) + g->second->area - static_cast<double>(inter) -
                       static_cast<double>(void_overlap(key.second));
    const double iou = static_cast<double>(inter) / uni;
    if (iou > 0.5) {
      out.matches.emplace_back(g->second->category_id, iou);
      gt_matched.insert(key.first);
      pred_matched.insert(key.second);
    }
  }
  std::map<int64_t, uint32_t> crowd;  // Category -> its (last listed) crowd segment.
  for (const PanopticSegment& s : reference_segments) {
    if (gt_matched.count(s.id)) continue;
    if (s.iscrowd) {
      crowd[s.category_id] = s.id;
      continue;
    }
    ++out.fn[s.category_id];
  }
  for (const PanopticSegment& s : predicted_segments) {
    if (pred_matched.count(s.id)) continue;
    int64_t ignored = void_overlap(s.id);
    if (auto c = crowd.find(s.category_id); c != crowd.end()) {
      auto it = pairs.find({c->second, s.id});
      if (it != pairs.end()) ignored += it->second;
    }
    if (static_cast<double>(ignored) / static_cast<double>(area[s.id]) > 0.5) continue;
    ++out.fp[s.category_id];
  }
  return out;
}

PanopticSummary SummarizePanoptic(const std::vector<const PanopticImageStats*>& images,
                                  const std::vector<PanopticCategory>& categories) {
  std::map<int64_t, PanopticCategoryResult> sums;
  for (const PanopticImageStats* im : images) {
    for (const auto& [cat, iou] : im->matches) {
      sums[cat].iou_sum += iou;
      ++sums[cat].tp;
    }
    for (const auto& [cat, n] : im->fp) sums[cat].fp += n;
    for (const auto& [cat, n] : im->fn) sums[cat].fn += n;
  }
  PanopticSummary out;
  PqValues* groups[3] = {&out.all, &out.things, &out.stuff};
  for (const PanopticCategory& c : categories) {
    PanopticCategoryResult r = sums[c.id];
    r.category_id = c.id;
    if (r.tp + r.fp + r.fn > 0) {
      const double denominator = (static_cast<double>(r.tp) + 0.5 * static_cast<double>(r.fp)) +
                                 0.5 * static_cast<double>(r.fn);
      r.pq = r.iou_sum / denominator;
      r.sq = r.tp != 0 ? r.iou_sum / static_cast<double>(r.tp) : 0;
      r.rq = static_cast<double>(r.tp) / denominator;
      for (PqValues* g : groups) {
        if ((g == &out.things && !c.isthing) || (g == &out.stuff && c.isthing)) continue;
        g->pq += r.pq;
        g->sq += r.sq;
        g->rq += r.rq;
        ++g->n;
      }
    }
    out.per_category.push_back(r);
  }
  for (PqValues* g : groups) {
    if (g->n == 0) {
      g->pq = g->sq = g->rq = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    g->pq /= g->n;
    g->sq /= g->n;
    g->rq /= g->n;
  }
  return out;
}

}  // namespace tally
