#include "worker/scoring/lesion_scoring.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "metrics/label_counts.h"

namespace tally {

absl::Status ScoreLesions(const uint16_t* pred, const uint16_t* ref, int depth, int height, int width,
                          const std::vector<std::vector<int>>& regions, bool include_background,
                          const LesionOptions& options, v1::ImageResult* result) {
  const int64_t n = static_cast<int64_t>(depth) * height * width;
  std::vector<uint8_t> pm(static_cast<size_t>(n)), rm(static_cast<size_t>(n));
  std::vector<uint8_t> in(65536, 0);  // Labels of the current class or region.
  std::vector<LesionRecord> records;
  for (int c = 0; c < result->classes_size(); ++c) {
    if (regions.empty() && c == 0 && !include_background) continue;
    std::fill(in.begin(), in.end(), 0);
    if (regions.empty()) {
      in[static_cast<size_t>(c)] = 1;
    } else {
      for (int label : regions[static_cast<size_t>(c)]) in[static_cast<size_t>(label)] = 1;
    }
    in[kIgnoredPixel] = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool ignored = ref[i] == kIgnoredPixel;
      pm[i] = !ignored && in[pred[i]];
      rm[i] = in[ref[i]];
    }
    LesionSummary s;
    if (absl::Status st = ComputeLesions(pm.data(), rm.data(), depth, height, width, options, &s, &records); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("lesion metrics: ", st.message()));
    }
    v1::ClassResult* cr = result->mutable_classes(c);
    cr->set_lesion(true);
    cr->set_lesion_tp(s.tp);
    cr->set_lesion_fn(s.fn);
    cr->set_lesion_fp(s.fp);
    cr->set_lesion_small(s.small);
    cr->set_lesion_dice_sum(s.dice_sum);
    cr->set_lesion_hd95_sum(s.hd95_sum);
    for (const LesionRecord& r : records) {
      v1::LesionRow* row = result->add_lesions();
      row->set_class_index(c);
      row->set_kind(LesionKindName(r.kind));
      row->set_lesion(r.lesion);
      row->set_component(r.component);
      row->set_voxels(r.voxels);
      row->set_volume(r.volume);
      row->set_matched(r.matched);
      row->set_matched_voxels(r.matched_voxels);
      row->set_dice(r.dice);
      row->set_hd95(r.hd95);
    }
  }
  return absl::OkStatus();
}

}  // namespace tally
