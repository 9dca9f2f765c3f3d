// Thumbnails of the worst images (report.html), rendered by the worker that evaluated them.
//
// A thumbnail shows one class of one image (or of one slice of a volume) as two panels side by
// side, each at most kThumbnailSide pixels on its longer side: the image as it is, and the image in
// darkened grey with the class's pixels coloured by outcome: both reference and prediction (true positive)
// green, prediction only (false positive) red, reference only (false negative) blue. A panel pixel
// covers a box of source pixels; any error in the box colours it (the larger of fp and fn), so that
// small misses stay visible at thumbnail size. Without an image (prediction jobs), the left panel
// shows the reference in white on black. JPEG, quality 90, no chroma subsampling.
//
// Which images get one: every worker keeps, per shard and class, the `keep` lowest (Dice, index)
// pairs seen so far (RunningWorst) and renders a thumbnail whenever a row enters them. A pair among
// the `keep` lowest of a whole set is among the `keep` lowest of every subset that holds it, so each
// of a shard's final worst rows got a thumbnail whatever the order of evaluation; the coordinator
// keeps the job's `keep` lowest of those (server/store/job_store.h), which are then exactly the job's
// worst rows, whichever workers evaluated which shards. The model pipeline also keeps one
// RunningWorst over all of its job's rows and renders only rows inside both (the same argument
// over a larger subset; worker/pipeline/pipeline.cc AmongWorkersWorst): far fewer renders, same report.
#ifndef TALLY_COMMON_IO_THUMBNAIL_H_
#define TALLY_COMMON_IO_THUMBNAIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "metrics/overlap.h"
#include "proto/tally.pb.h"

namespace tally {

inline constexpr int kThumbnailSide = 128;
// What a job keeps unless it says otherwise (--thumbnails), per class.
inline constexpr int kDefaultThumbnails = 5;
inline constexpr int kMaxThumbnails = 10;  // The worst-images tables list 10 rows.
// A thumbnail larger than this is not kept (a JPEG of 260 x 128 pixels is far smaller).
inline constexpr size_t kMaxThumbnailBytes = 128 << 10;
// Thumbnail bytes a worker sends with one shard's results at most; past it, rows of the shard get
// none (logged). Bounds the report message whatever the order of the rows' scores.
inline constexpr size_t kMaxShardThumbnailBytes = 8 << 20;

// Per pixel of the class being shown.
enum PixelOutcome : uint8_t {
  kOutcomeNone = 0,      // Neither reference nor prediction.
  kOutcomeTp = 1,
  kOutcomeFp = 2,
  kOutcomeFn = 3,
  kOutcomeIgnored = 4,   // The reference's ignore value.
};

// Outcomes of class `cls` over `n` labels (kIgnoredPixel in the reference: ignored).
void ClassOutcomes(const uint16_t* prediction, const uint16_t* reference, int64_t n, int cls, uint8_t* out);
// The same for a region: labels with member[label] != 0 (65536 entries) belong to it.
void RegionOutcomes(const uint16_t* prediction, const uint16_t* reference, int64_t n, const uint8_t* member,
                    uint8_t* out);
// The slice of a depth x height x width volume with the most tp + fp + fn pixels (the first of
// equals); 0 for a 2D image.
int BusiestSlice(const uint8_t* outcomes, int depth, int height, int width);

// `rgb` (height x width x 3, or null) and the class outcomes of the same size, as JPEG bytes.
absl::StatusOr<std::string> RenderThumbnail(const uint8_t* rgb, const uint8_t* outcomes, int height, int width);

// RenderThumbnail in its steps, for callers that count outcomes without a full-size picture of them
// (COCO instances, from their runs: common/coco/coco_instances.cc). The panels' size and the source box
// of each panel pixel: columns [x0[ox], x1[ox]), rows [y0[oy], y1[oy]) (boxes overlap where a small
// image is enlarged).
struct ThumbnailGrid {
  ThumbnailGrid(int height, int width);  // Both > 0.
  int oh = 0, ow = 0;
  std::vector<int> x0, x1, y0, y1;
};
// Per panel pixel (row-major): how many source pixels of each PixelOutcome its box holds, and with
// an image the sums of their red, green and blue.
struct ThumbnailCells {
  ThumbnailCells(const ThumbnailGrid& grid, bool with_image);
  std::vector<uint32_t> count;  // 5 a pixel, indexed by PixelOutcome.
  std::vector<uint32_t> sum;    // 3 a pixel; empty without an image.
};
// Adds the boxes' outcomes (row-major, height x width; null: none) and pixels (rgb, or null).
void CountOutcomesAndPixels(const ThumbnailGrid& grid, const uint8_t* rgb, const uint8_t* outcomes, int width,
                            ThumbnailCells* cells);
absl::StatusOr<std::string> ComposeThumbnail(const ThumbnailGrid& grid, const ThumbnailCells& cells);

// Class `cls` (or, with `member` non-null, the region it describes) of a 2D image (depth 1) or a
// volume, rendered on the slice with most tp + fp + fn (`*slice`; 0 for 2D). `rgb` may be null.
absl::StatusOr<std::string> RenderClassThumbnail(const uint8_t* rgb, const uint16_t* prediction,
                                                 const uint16_t* reference, int depth, int height, int width,
                                                 int cls, const uint8_t* member, int* slice);

// The Dice of one class of a result under the job's empty-score convention: what orders the worst
// rows, on workers and on the coordinator alike (the aggregator's per-image Dice).
double RowDice(const v1::ClassResult& c, EmptyScore empty);

// The `keep` lowest (score, index) pairs offered so far, per class; NaN scores never enter.
class RunningWorst {
 public:
  explicit RunningWorst(int keep) : keep_(keep) {}
  // True when (score, index) is now among the `keep` lowest of its class.
  bool Offer(int cls, double score, int64_t index);
  // True while it still is (a later, lower pair may push it out for good).
  bool Contains(int cls, double score, int64_t index) const;

 private:
  int keep_;
  std::map<int, std::vector<std::pair<double, int64_t>>> worst_;  // Sorted, at most keep_ each.
};

// One shard's thumbnails on a worker: which rows get one (RunningWorst by the job's Dice, over
// the classes the report shows) and the shard's byte budget. Thread-safe.
class ShardThumbnails {
 public:
  ShardThumbnails(int keep, EmptyScore empty, bool all_foreground)
      : worst_(keep), empty_(empty), all_foreground_(all_foreground) {}
  // The classes of `result` (its counts filled) to render now.
  std::vector<int> Enter(const v1::ImageResult& result) ABSL_LOCKS_EXCLUDED(mu_);
  // Of `classes` (what Enter returned for `result`), those where the row is still among the worst.
  std::vector<int> StillAmongWorst(const v1::ImageResult& result, const std::vector<int>& classes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // COCO instance jobs: the row's instance F1 offered as class `cls`'s score (docs/instances.md "Instances":
  // the instance thumbnails ride on class 0, which is no category); true when it is to be rendered.
  bool EnterScore(int cls, double score, int64_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // Attaches a rendered thumbnail to `result` unless the shard's budget is spent (then false).
  bool Attach(v1::ImageResult* result, int cls, int slice, std::string jpeg) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  RunningWorst worst_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  const EmptyScore empty_;
  const bool all_foreground_;  // Class 0 too (include_background, regions).
};

}  // namespace tally

#endif  // TALLY_COMMON_IO_THUMBNAIL_H_
