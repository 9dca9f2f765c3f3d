// COCO JSON files (cocodataset.org "Data format"): instance annotations (ground truth: `images`,
// `categories`, `annotations`) and results (detections: a list of {image_id, category_id,
// segmentation, score}). Parsed with simdjson's On-Demand API; untrusted input (a fuzz target).
//
// A file whose structure is wrong (not JSON, no `images` array, an image without an id) is refused
// naming the file and the field. An annotation whose own fields are wrong (a malformed
// segmentation, a missing category) is kept with `error` saying what, naming its id: the image it
// belongs to fails, nothing else does.
#ifndef TALLY_COMMON_IO_COCO_JSON_H_
#define TALLY_COMMON_IO_COCO_JSON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security/data_roots.h"
#include "metrics/coco_rle.h"

namespace tally {

struct CocoSegmentation {
  enum class Kind { kNone, kPolygons, kCounts, kString };
  Kind kind = Kind::kNone;
  std::vector<std::vector<double>> polygons;  // kPolygons
  std::vector<int64_t> counts;                // kCounts: uncompressed RLE
  std::string counts_string;                  // kString: compressed RLE
  int64_t height = -1, width = -1;            // An RLE's `size` ([height, width]).
};

struct CocoAnnotation {
  int64_t id = 0;  // Results: their 1-based position in the file, as pycocotools' loadRes numbers them.
  int64_t image_id = 0;
  int64_t category_id = 0;
  double area = 0;  // Ground truth: the `area` field.
  bool has_area = false;
  bool iscrowd = false;
  double score = 0;  // Results.
  CocoSegmentation segmentation;
  std::string error;  // Non-empty: what is wrong with this annotation.
};

struct CocoImageInfo {
  int64_t id = 0;
  std::string file_name;
  int64_t height = 0, width = 0;
  // Its other scalar fields (strings, numbers as written, booleans), in the file's order: the first
  // kMaxCocoImageFields, each value at most kMaxCocoFieldBytes (longer ones and others are left out).
  std::vector<std::pair<std::string, std::string>> fields;
};
inline constexpr size_t kMaxCocoImageFields = 16;
inline constexpr size_t kMaxCocoFieldBytes = 256;
// Images' fields as columns (groups): width, height, then every other field name in the order first
// met (at most 64 columns); and one image's values of them ("" where it has none).
std::vector<std::string> CocoImageColumns(const std::vector<CocoImageInfo>& images);
std::vector<std::string> CocoImageValues(const CocoImageInfo& im, const std::vector<std::string>& columns);

struct CocoCategoryInfo {
  int64_t id = 0;
  std::string name;
  bool isthing = true;  // Panoptic files: `isthing` 0 for stuff.
};

// A panoptic annotation (COCO panoptic format): one image's PNG of segment ids and its segments.
struct CocoPanopticSegment {
  int64_t id = 0;  // The PNG's R + 256 G + 256^2 B.
  int64_t category_id = 0;
  double area = 0;
  bool iscrowd = false;
};
struct CocoPanopticAnnotation {
  int64_t image_id = 0;
  std::string file_name;  // The PNG, in the panoptic folder.
  std::vector<CocoPanopticSegment> segments;
  std::string error;  // Non-empty: what is wrong with it (its image's row fails).
};

struct CocoDataset {
  std::vector<CocoImageInfo> images;
  std::vector<CocoCategoryInfo> categories;
  std::vector<CocoAnnotation> annotations;
  std::vector<CocoPanopticAnnotation> panoptic;  // ParseCocoPanoptic: `annotations` read as panoptic.
};

// `json` is the file's text; `name` (its path) goes into errors.
absl::StatusOr<CocoDataset> ParseCocoDataset(absl::string_view json, absl::string_view name);
absl::StatusOr<std::vector<CocoAnnotation>> ParseCocoResults(absl::string_view json, absl::string_view name);
// A COCO panoptic file (ground truth or predictions: `annotations` with `segments_info`; a
// predictions file may lack `images`).
absl::StatusOr<CocoDataset> ParseCocoPanoptic(absl::string_view json, absl::string_view name);
// The files at `path`, read whole through ReadClientFile (common/security/data_roots.h: regular
// files only, at most `limits.max_bytes`, before `limits.deadline`) and parsed where they were read.
// `sha256` (when given): the hex SHA-256 of the bytes parsed.
absl::StatusOr<CocoDataset> LoadCocoPanoptic(const std::string& path, const ClientFileLimits& limits = {},
                                             std::string* sha256 = nullptr);
absl::StatusOr<CocoDataset> LoadCocoDataset(const std::string& path, const ClientFileLimits& limits = {},
                                            std::string* sha256 = nullptr);
absl::StatusOr<std::vector<CocoAnnotation>> LoadCocoResults(const std::string& path,
                                                            const ClientFileLimits& limits = {},
                                                            std::string* sha256 = nullptr);
// A results file read once and parsed on up to `threads` threads, nothing kept: its detections are
// split into parts of consecutive ones (parts in the file's order) and `each(part, detection)` sees
// every detection of a part, in the file's order, on one thread (parts run at the same time).
// Returns the number of parts (at least `min_per_part` detections each, but one part at least). The
// detections are ParseCocoResults' to the bit, and so is the error (on an error, what `each` saw is
// to be discarded).
using CocoResultVisitor = std::function<void(int part, CocoAnnotation&& detection)>;
absl::StatusOr<int> LoadCocoResultsInParts(const std::string& path, const ClientFileLimits& limits, std::string* sha256,
                                           int threads, const CocoResultVisitor& each, size_t min_per_part = 4096);
absl::StatusOr<int> ParseCocoResultsInParts(absl::string_view json, absl::string_view name, int threads,
                                            const CocoResultVisitor& each, size_t min_per_part = 4096);

// The mask of a segmentation on an image of `height` x `width` (pycocotools' annToRLE). Errors: no
// segmentation, an RLE whose `size` is not the image's, a malformed RLE or polygon.
// Polygons that would need more than `max_bytes` (>= 0) to rasterise are refused unwalked
// (metrics/coco_rle.h RleFromPolygons).
absl::StatusOr<Rle> SegmentationRle(const CocoSegmentation& s, int64_t height, int64_t width,
                                    int64_t max_bytes = -1);

}  // namespace tally

#endif  // TALLY_COMMON_IO_COCO_JSON_H_
