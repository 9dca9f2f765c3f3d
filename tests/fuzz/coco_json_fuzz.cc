// COCO JSON files on arbitrary bytes (as a dataset, a results list and a panoptic file): no crash, no
// unbounded allocation; every annotation that parsed rasterises (or is refused) on a small image
// within a budget, its mask sums to the image's pixels, and its compressed string decodes to the
// same runs; image file names and category names hold no control character.
#include "common/coco/coco_json.h"
#include "common/sources/manifest.h"
#include "fuzz_util.h"
#include "metrics/coco_rle.h"
#include "base/text.h"

namespace {

void CheckMasks(const std::vector<tally::CocoAnnotation>& annotations) {
  for (const tally::CocoAnnotation& a : annotations) {
    const int64_t h = a.segmentation.height > 0 && a.segmentation.height <= 64 ? a.segmentation.height : 16;
    const int64_t w = a.segmentation.width > 0 && a.segmentation.width <= 64 ? a.segmentation.width : 16;
    // With a rasterisation budget: refused or within it, never past it.
    absl::StatusOr<tally::Rle> r = tally::SegmentationRle(a.segmentation, h, w, int64_t{1} << 20);
    if (!r.ok()) continue;
    uint64_t total = 0;
    for (uint32_t c : r->counts) total += c;
    FUZZ_CHECK(total == static_cast<uint64_t>(h * w));
    FUZZ_CHECK(tally::RleArea(*r) <= static_cast<uint64_t>(h * w));
    absl::StatusOr<tally::Rle> back = tally::RleFromString(tally::RleToString(*r), h, w);
    FUZZ_CHECK(back.ok() && back->counts == r->counts);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = FuzzInput(data, size);
  absl::StatusOr<tally::CocoDataset> d = tally::ParseCocoDataset(text, "fuzz.json");
  if (d.ok()) {
    CheckMasks(d->annotations);
    // Names reach reports and paths: no control character gets through.
    for (const tally::CocoImageInfo& im : d->images) FUZZ_CHECK(tally::FirstControlCharacter(im.file_name, false) < 0);
    for (const tally::CocoCategoryInfo& c : d->categories) FUZZ_CHECK(tally::FirstControlCharacter(c.name, false) < 0);
  }
  absl::StatusOr<std::vector<tally::CocoAnnotation>> r = tally::ParseCocoResults(text, "fuzz.json");
  if (r.ok()) CheckMasks(*r);
  // tallyd's parse on several threads (a part per detection here) accepts what the single pass
  // accepts, and yields the same detections in the same order.
  std::vector<std::vector<tally::CocoAnnotation>> parts(3);
  absl::StatusOr<int> split = tally::ParseCocoResultsInParts(
      text, "fuzz.json", 3, [&](int k, tally::CocoAnnotation&& a) { parts[k].push_back(std::move(a)); }, 1);
  FUZZ_CHECK(split.ok() == r.ok());
  if (split.ok()) {
    size_t i = 0;
    for (const auto& part : parts) {
      for (const tally::CocoAnnotation& a : part) {
        FUZZ_CHECK(i < r->size() && a.id == (*r)[i].id && a.image_id == (*r)[i].image_id && a.error == (*r)[i].error);
        ++i;
      }
    }
    FUZZ_CHECK(i == r->size());
  }
  absl::StatusOr<tally::CocoDataset> p = tally::ParseCocoPanoptic(text, "fuzz.json");
  if (p.ok()) {
    for (const tally::CocoPanopticAnnotation& a : p->panoptic) {
      FUZZ_CHECK(!a.error.empty() || a.segments.empty() || a.segments[0].id > 0);
    }
  }
  return 0;
}
