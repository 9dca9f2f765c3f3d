// COCO's instance masks: run-length encoding, polygons, area and mask IoU, with the semantics of
// pycocotools' maskApi (the reference every COCO number is computed with).
//
// Definitions:
//   A mask of height h and width w is read column by column (x-major: index = x * h + y, as
//   pycocotools' Fortran-ordered arrays). Its RLE is the lengths of alternating runs of 0s and 1s,
//   starting with 0s (a mask starting with a 1 has a first run of length 0); the runs sum to h * w.
//   The compressed string form (`counts` as a string in COCO JSON) writes each run, from the fourth
//   on as the difference to the run two before, in 5-bit groups, least significant first, each a
//   character 48 + (group | 0x20 when more groups follow); a group's bit 0x10 is the sign of the
//   last one.
//   A polygon (x1, y1, x2, y2, ...; pixel (x, y) covers [x - 0.5, x + 0.5) x [y - 0.5, y + 0.5))
//   rasterises as pycocotools' rleFrPoly: the boundary is walked on a 5x finer grid with points
//   rounded half up, and a pixel is inside where the column's boundary crossings say so; an
//   annotation's polygons are united.
//   area = the number of 1s; bbox = [x, y, width, height] of the 1s.
//   IoU(detection, reference) = |D n R| / |D u R|, 0 where they do not intersect; against a crowd
//   reference |D n R| / |D| (COCOeval: a crowd region may absorb any number of detections).
#ifndef TALLY_METRICS_COCO_RLE_H_
#define TALLY_METRICS_COCO_RLE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

struct Rle {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint32_t> counts;  // Runs of 0s and 1s alternately, 0s first; they sum to height * width.
};

// From a row-major mask (any nonzero byte is 1).
Rle RleFromMask(const uint8_t* mask, int64_t height, int64_t width);
// To a row-major mask of height * width bytes (0 or 1).
void RleToMask(const Rle& rle, uint8_t* mask);

// The compressed string form. Errors: characters outside '0'..'o', a truncated group, a run that
// is negative or does not fit 32 bits, runs that do not sum to height * width.
absl::StatusOr<Rle> RleFromString(absl::string_view counts, int64_t height, int64_t width);
std::string RleToString(const Rle& rle);
// Uncompressed `counts` (a list of run lengths). Errors: a negative run, runs not summing to h * w.
absl::StatusOr<Rle> RleFromCounts(const std::vector<int64_t>& counts, int64_t height, int64_t width);

// One polygon (x1, y1, x2, y2, ...), and an annotation's polygons united. Errors: an odd number of
// coordinates, fewer than 3 points, a point not finite or farther outside the image than its size.
absl::StatusOr<Rle> RleFromPolygon(const std::vector<double>& xy, int64_t height, int64_t width);
// With `max_bytes` >= 0, a polygon whose walk (PolygonWalkBytes) and the polygons before it would
// need more is refused before it is walked (RESOURCE_EXHAUSTED, naming the cost).
absl::StatusOr<Rle> RleFromPolygons(const std::vector<std::vector<double>>& polygons, int64_t height,
                                    int64_t width, int64_t max_bytes = -1);

// What rasterising a polygon costs, known before the work: rleFrPoly walks every point of every edge
// on the 5x grid, and each point takes kPolygonBytesPerPoint bytes while the mask is built (its two
// grid coordinates, a crossing and a run). 0 for a polygon RleFromPolygon refuses.
inline constexpr int64_t kPolygonBytesPerPoint = 16;
int64_t PolygonWalkBytes(const std::vector<double>& xy, int64_t height, int64_t width);

// The union of masks of one size (empty: an all-0 mask of that size), in canonical runs (none empty
// but a leading run of 0s). Pairwise: n masks of R runs in all cost O(R log n).
Rle RleUnion(const std::vector<const Rle*>& masks, int64_t height, int64_t width);

// Calls on_span(start, length, in_a, in_b) for every stretch, in the masks' order (column by column),
// where neither of two masks of one size changes; stretches of length 0 are skipped.
void RleSpans(const Rle& a, const Rle& b, const std::function<void(uint64_t, uint64_t, bool, bool)>& on_span);

uint64_t RleArea(const Rle& rle);
std::array<double, 4> RleBbox(const Rle& rle);  // x, y, width, height; all 0 for an empty mask.

// IoU of a detection with a reference of the same size (see the definitions above).
double RleIou(const Rle& detection, const Rle& reference, bool reference_is_crowd);

}  // namespace tally

#endif  // TALLY_METRICS_COCO_RLE_H_
