#include "common/coco/coco_instances.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>
#include <numeric>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/formats/thumbnail.h"
#include "base/checked_math.h"
#include "base/status_macros.h"
#include "metrics/coco_eval.h"

namespace tally {
namespace {

// Decodes one annotation or result of an image of `height` x `width`.
absl::Status Decode(const CocoAnnotation& a, bool result, int64_t height, int64_t width, int64_t max_bytes,
                    CocoInstance* out) {
  const std::string name = absl::StrCat(result ? "result " : "annotation ", a.id);
  if (!a.error.empty()) return absl::InvalidArgumentError(a.error);
  absl::StatusOr<Rle> mask = SegmentationRle(a.segmentation, height, width, max_bytes);
  if (!mask.ok()) return absl::Status(mask.status().code(), absl::StrCat(name, ": ", mask.status().message()));
  out->id = a.id;
  out->category_id = a.category_id;
  out->score = a.score;
  out->area = a.area;
  out->crowd = a.iscrowd;
  out->mask = *std::move(mask);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CocoSource>> CocoSource::Load(const std::string& annotations,
                                                                   const std::string& results,
                                                                   const ClientFileLimits& limits) {
  auto source = std::shared_ptr<CocoSource>(new CocoSource());
  absl::StatusOr<CocoDataset> gt = LoadCocoDataset(annotations, limits);
  if (!gt.ok()) return gt.status();
  source->gt_ = *std::move(gt);
  if (!results.empty()) {
    absl::StatusOr<std::vector<CocoAnnotation>> r = LoadCocoResults(results, limits);
    if (!r.ok()) return r.status();
    source->results_ = *std::move(r);
  }
  for (size_t i = 0; i < source->gt_.images.size(); ++i) source->image_index_.emplace(source->gt_.images[i].id, i);
  for (const CocoCategoryInfo& c : source->gt_.categories) source->categories_[c.id] = true;
  for (size_t i = 0; i < source->gt_.annotations.size(); ++i) {
    const CocoAnnotation& a = source->gt_.annotations[i];
    source->annotation_index_.emplace(a.id, i);
    source->gt_by_image_[a.image_id].push_back(i);
  }
  for (size_t i = 0; i < source->results_.size(); ++i) source->results_by_image_[source->results_[i].image_id].push_back(i);
  return std::shared_ptr<const CocoSource>(std::move(source));
}

bool CocoSource::HasCategory(int64_t id) const { return categories_.count(id) > 0; }

const CocoImageInfo* CocoSource::Image(int64_t id) const {
  auto it = image_index_.find(id);
  return it == image_index_.end() ? nullptr : &gt_.images[it->second];
}

absl::Status CocoSource::Instances(int64_t image_id, CocoImageInstances* out, int64_t max_bytes,
                                  const std::string& row_detections) const {
  const CocoImageInfo* image = Image(image_id);
  if (image == nullptr) return absl::InvalidArgumentError(absl::StrCat("COCO image ", image_id, " is not in the annotation file"));
  if (image->height <= 0 || image->width <= 0 || !ProductWithin({image->height, image->width}, 0xffffffffll)) {
    return absl::InvalidArgumentError(absl::StrCat("COCO image ", image_id, " is ", image->height, "x", image->width,
                                                   " (HxW) in the annotation file: not a size a mask can have (1 to "
                                                   "2^32 - 1 pixels)"));
  }
  out->image_id = image_id;
  out->height = image->height;
  out->width = image->width;
  out->references.clear();
  out->detections.clear();
  std::vector<CocoAnnotation> sent;
  if (!row_detections.empty()) {
    ASSIGN_OR_RETURN(sent, DecodeCocoDetections(row_detections));
  }
  std::vector<const CocoAnnotation*> anns[2];
  if (auto it = gt_by_image_.find(image_id); it != gt_by_image_.end()) {
    for (size_t i : it->second) anns[0].push_back(&gt_.annotations[i]);
  }
  if (auto it = results_by_image_.find(image_id); it != results_by_image_.end()) {
    for (size_t i : it->second) anns[1].push_back(&results_[i]);
  }
  for (const CocoAnnotation& a : sent) anns[1].push_back(&a);
  for (bool result : {false, true}) {
    for (const CocoAnnotation* a : anns[result]) {
      if (!a->error.empty()) return absl::InvalidArgumentError(a->error);  // Before its category is looked up.
      if (!HasCategory(a->category_id)) {
        return absl::InvalidArgumentError(absl::StrCat(result ? "result " : "annotation ", a->id, ": category ",
                                                       a->category_id, " is not in the annotation file's categories"));
      }
      CocoInstance inst;
      if (absl::Status s = Decode(*a, result, image->height, image->width, max_bytes, &inst); !s.ok()) return s;
      (result ? out->detections : out->references).push_back(std::move(inst));
    }
  }
  return absl::OkStatus();
}

namespace {

using google::protobuf::io::CodedOutputStream;
using WireFormat = google::protobuf::internal::WireFormatLite;

// v1::CocoDetection's wire format written field by field, as the generated serializer writes it
// (proto3: fields at their defaults left out, +0.0 too but not -0.0; repeated numbers packed;
// fields in number order), without building the message: tallyd encodes each of a results file's
// detections once at submission (500 000 for COCO val2017), and the message's copy of each RLE
// string, its size pass and its clearing cost as much as the parse. Every field number is below 16:
// a tag is one byte. coco_source_test checks the bytes against the generated serializer's.
size_t VarintField(uint64_t v) { return v == 0 ? 0 : 1 + CodedOutputStream::VarintSize64(v); }
bool NonZero(double v) {
  uint64_t raw;
  std::memcpy(&raw, &v, sizeof(raw));
  return raw != 0;
}
size_t LengthField(size_t n) { return n == 0 ? 0 : 1 + CodedOutputStream::VarintSize64(n) + n; }

uint8_t* WriteVarintField(int field, uint64_t v, uint8_t* p) {
  if (v == 0) return p;
  *p++ = static_cast<uint8_t>(WireFormat::MakeTag(field, WireFormat::WIRETYPE_VARINT));
  return CodedOutputStream::WriteVarint64ToArray(v, p);
}
uint8_t* WriteDoubleField(int field, double v, uint8_t* p) {
  return NonZero(v) ? WireFormat::WriteDoubleToArray(field, v, p) : p;
}
uint8_t* WriteLengthHead(int field, size_t n, uint8_t* p) {
  *p++ = static_cast<uint8_t>(WireFormat::MakeTag(field, WireFormat::WIRETYPE_LENGTH_DELIMITED));
  return CodedOutputStream::WriteVarint64ToArray(n, p);
}
uint8_t* WriteBytesField(int field, const std::string& bytes, uint8_t* p) {
  if (bytes.empty()) return p;
  p = WriteLengthHead(field, bytes.size(), p);
  std::memcpy(p, bytes.data(), bytes.size());
  return p + bytes.size();
}

}  // namespace

void AppendCocoDetection(const CocoAnnotation& a, std::string* out) {
  const CocoSegmentation& s = a.segmentation;
  size_t points = 0, sizes_bytes = 0, counts_bytes = 0;
  for (const std::vector<double>& poly : s.polygons) {
    points += poly.size();
    sizes_bytes += CodedOutputStream::VarintSize64(static_cast<uint64_t>(poly.size()));
  }
  for (int64_t c : s.counts) counts_bytes += CodedOutputStream::VarintSize64(static_cast<uint64_t>(c));
  // int32 segmentation_kind goes out sign-extended to 64 bits, as int64s do.
  const uint64_t kind = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(s.kind)));
  const size_t body = VarintField(static_cast<uint64_t>(a.id)) + VarintField(static_cast<uint64_t>(a.image_id)) +
                      VarintField(static_cast<uint64_t>(a.category_id)) + (NonZero(a.score) ? 9 : 0) +
                      (NonZero(a.area) ? 9 : 0) + (a.has_area ? 2 : 0) + (a.iscrowd ? 2 : 0) +
                      LengthField(a.error.size()) + VarintField(kind) + LengthField(points * 8) +
                      LengthField(sizes_bytes) + LengthField(counts_bytes) + LengthField(s.counts_string.size()) +
                      VarintField(static_cast<uint64_t>(s.height)) + VarintField(static_cast<uint64_t>(s.width));
  // CocoDetections' field 1 (length-delimited): one element of its `detections`, so that appended
  // elements are the serialized list. Written in place after one resize.
  const size_t at = out->size();
  out->resize(at + 1 + CodedOutputStream::VarintSize64(body) + body);
  uint8_t* const begin = reinterpret_cast<uint8_t*>(&(*out)[at]);
  uint8_t* p = WriteLengthHead(v1::CocoDetections::kDetectionsFieldNumber, body, begin);
  uint8_t* const body_begin = p;
  p = WriteVarintField(1, static_cast<uint64_t>(a.id), p);
  p = WriteVarintField(2, static_cast<uint64_t>(a.image_id), p);
  p = WriteVarintField(3, static_cast<uint64_t>(a.category_id), p);
  p = WriteDoubleField(4, a.score, p);
  p = WriteDoubleField(5, a.area, p);
  p = WriteVarintField(6, a.has_area ? 1 : 0, p);
  p = WriteVarintField(7, a.iscrowd ? 1 : 0, p);
  p = WriteBytesField(8, a.error, p);
  p = WriteVarintField(9, kind, p);
  if (points > 0) {
    p = WriteLengthHead(10, points * 8, p);
    for (const std::vector<double>& poly : s.polygons) {
      for (double v : poly) p = WireFormat::WriteDoubleNoTagToArray(v, p);
    }
  }
  if (sizes_bytes > 0) {
    p = WriteLengthHead(11, sizes_bytes, p);
    for (const std::vector<double>& poly : s.polygons) {
      p = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(poly.size()), p);
    }
  }
  if (counts_bytes > 0) {
    p = WriteLengthHead(12, counts_bytes, p);
    for (int64_t c : s.counts) p = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(c), p);
  }
  p = WriteBytesField(13, s.counts_string, p);
  p = WriteVarintField(14, static_cast<uint64_t>(s.height), p);
  p = WriteVarintField(15, static_cast<uint64_t>(s.width), p);
  assert(static_cast<size_t>(p - body_begin) == body);
  (void)body_begin;
}

std::string EncodeCocoDetections(const std::vector<const CocoAnnotation*>& detections) {
  std::string out;
  for (const CocoAnnotation* a : detections) AppendCocoDetection(*a, &out);
  return out;
}

absl::StatusOr<std::vector<CocoAnnotation>> DecodeCocoDetections(const std::string& bytes) {
  v1::CocoDetections in;
  if (!in.ParseFromString(bytes)) return absl::DataLossError("the row's COCO detections are unreadable");
  std::vector<CocoAnnotation> out(static_cast<size_t>(in.detections_size()));
  for (int i = 0; i < in.detections_size(); ++i) {
    const v1::CocoDetection& d = in.detections(i);
    CocoAnnotation& a = out[static_cast<size_t>(i)];
    a.id = d.id();
    a.image_id = d.image_id();
    a.category_id = d.category_id();
    a.score = d.score();
    a.area = d.area();
    a.has_area = d.has_area();
    a.iscrowd = d.iscrowd();
    a.error = d.error();
    CocoSegmentation& s = a.segmentation;
    if (d.segmentation_kind() < 0 || d.segmentation_kind() > static_cast<int32_t>(CocoSegmentation::Kind::kString)) {
      return absl::DataLossError("the row's COCO detections name an unknown segmentation kind");
    }
    s.kind = static_cast<CocoSegmentation::Kind>(d.segmentation_kind());
    int64_t at = 0;
    for (int64_t n : d.polygon_sizes()) {
      if (n < 0 || n > d.polygon_points_size() - at) return absl::DataLossError("the row's COCO polygons are inconsistent");
      s.polygons.emplace_back(d.polygon_points().begin() + at, d.polygon_points().begin() + at + n);
      at += n;
    }
    s.counts.assign(d.counts().begin(), d.counts().end());
    s.counts_string = d.counts_string();
    s.height = d.height();
    s.width = d.width();
  }
  return out;
}

absl::StatusOr<Rle> CocoSource::AnnotationUnion(const std::vector<int64_t>& ids, int64_t height, int64_t width,
                                                int64_t max_bytes) const {
  std::vector<CocoInstance> parts;
  int64_t image_id = 0;
  for (int64_t id : ids) {
    auto it = annotation_index_.find(id);
    if (it == annotation_index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("annotation ", id, " is not in the annotation file"));
    }
    const CocoAnnotation& a = gt_.annotations[it->second];
    const CocoImageInfo* image = Image(a.image_id);
    if (image == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("annotation ", id, " is for image ", a.image_id,
                                                     ", which the annotation file does not list"));
    }
    if (!parts.empty() && a.image_id != image_id) {
      return absl::InvalidArgumentError(absl::StrCat("annotations ", parts.front().id, " and ", id,
                                                     " are of different images (", image_id, " and ", a.image_id, ")"));
    }
    image_id = a.image_id;
    if (image->height != height || image->width != width) {
      return absl::InvalidArgumentError(absl::StrCat("annotation ", id, " is of image ", a.image_id, ", ", image->height,
                                                     "x", image->width, " (HxW) in the annotation file, but the row's image is ",
                                                     height, "x", width));
    }
    CocoInstance inst;
    if (absl::Status s = Decode(a, false, height, width, max_bytes, &inst); !s.ok()) return s;
    parts.push_back(std::move(inst));
  }
  std::vector<const Rle*> masks;
  for (const CocoInstance& p : parts) masks.push_back(&p.mask);
  return RleUnion(masks, height, width);
}

namespace {

// out[0, n) = value. A mask's runs are short (a column of an object: tens to hundreds of labels) and
// many (a COCO image's detections hold thousands): std::fill's set-up per call cost more than the
// stores. 16-bit labels: 8 at a time, the last 8 overlapping the ones before (runs of 8 or more).
template <typename T>
inline void FillRun(T* out, int64_t n, T value) {
#if defined(__SSE2__)
  if constexpr (sizeof(T) == 2) {
    if (n >= 8) {
      const __m128i v = _mm_set1_epi16(static_cast<int16_t>(value));
      int64_t k = 0;
      for (; k + 8 <= n; k += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), v);
      if (k < n) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + n - 8), v);
      return;
    }
  }
#endif
  for (int64_t k = 0; k < n; ++k) out[k] = value;
}

// `value` where `mask` is set, into `out` of the mask's size: row-major, or column by column (as
// the runs go: one fill per run).
template <typename T>
void PaintRuns(const Rle& mask, T value, T* out, bool column_major = false) {
  const int64_t h = mask.height, w = mask.width;
  int64_t p = 0;
  for (size_t i = 0; i < mask.counts.size(); ++i) {
    const int64_t end = p + mask.counts[i];
    if (i % 2 == 1 && column_major) {
      FillRun(out + p, end - p, value);
    } else if (i % 2 == 1) {
      for (int64_t q = p; q < end; ++q) out[(q % h) * w + q / h] = value;
    }
    p = end;
  }
}

// One category's matching at IoU 0.5 as masks to paint: [0] matched (detections and references),
// [1] references left unmatched (crowd aside), [2] false detections.
void CollectMatching(const CocoImageInstances& image, const std::vector<size_t>& gi, const std::vector<size_t>& di,
                     const CocoImageEval& e, std::array<std::vector<const Rle*>, 3>* layers) {
  std::vector<bool> matched(gi.size(), false);
  for (size_t k = 0; k < e.kept.size(); ++k) {
    const Rle* det = &image.detections[di[e.kept[k]]].mask;
    if (e.outcome[k] == CocoOutcome::kTruePositive) {
      matched[e.matched[k]] = true;
      (*layers)[0].push_back(det);
    } else if (e.outcome[k] == CocoOutcome::kFalsePositive) {
      (*layers)[2].push_back(det);
    }
  }
  for (size_t g = 0; g < gi.size(); ++g) {
    const CocoInstance& ref = image.references[gi[g]];
    if (ref.crowd) continue;
    (*layers)[matched[g] ? 0 : 1].push_back(&ref.mask);
  }
}

}  // namespace

namespace {

// EvaluateCocoInstances' work; with `layers`, the matching's masks to paint (CollectMatching).
void EvaluateInstances(const CocoImageInstances& image, google::protobuf::RepeatedPtrField<v1::CocoImageRecord>* records,
                       std::array<std::vector<const Rle*>, 3>* layers);

}  // namespace

void EvaluateCocoInstances(const CocoImageInstances& image,
                           google::protobuf::RepeatedPtrField<v1::CocoImageRecord>* records,
                           std::vector<uint8_t>* outcomes) {
  std::array<std::vector<const Rle*>, 3> layers;
  EvaluateInstances(image, records, outcomes != nullptr ? &layers : nullptr);
  if (outcomes == nullptr) return;
  outcomes->assign(static_cast<size_t>(image.height * image.width), kOutcomeNone);
  const uint8_t colour[3] = {kOutcomeTp, kOutcomeFn, kOutcomeFp};
  for (int layer = 0; layer < 3; ++layer) {
    for (const Rle* mask : layers[layer]) PaintRuns(*mask, colour[layer], outcomes->data());
  }
}

namespace {

void EvaluateInstances(const CocoImageInstances& image, google::protobuf::RepeatedPtrField<v1::CocoImageRecord>* records,
                       std::array<std::vector<const Rle*>, 3>* layers) {
  std::map<int64_t, std::pair<std::vector<size_t>, std::vector<size_t>>> by_category;
  for (size_t i = 0; i < image.references.size(); ++i) by_category[image.references[i].category_id].first.push_back(i);
  for (size_t i = 0; i < image.detections.size(); ++i) by_category[image.detections[i].category_id].second.push_back(i);
  const CocoParams& params = CocoDefaultParams();
  const size_t T = params.iou_thresholds.size();
  for (const auto& [category, members] : by_category) {
    const std::vector<size_t>& gi = members.first;  // Not a structured binding: lambdas capture these.
    const std::vector<size_t>& di = members.second;
    std::vector<CocoReference> refs;
    for (size_t i : gi) {
      const CocoInstance& g = image.references[i];
      refs.push_back({g.id, g.area, g.crowd});
    }
    std::vector<CocoDetection> dets;
    for (size_t i : di) {
      const CocoInstance& d = image.detections[i];
      dets.push_back({d.id, d.score, static_cast<double>(RleArea(d.mask))});
    }
    const CocoImageEval e = EvaluateCocoImage(image.image_id, category, refs, dets, [&](size_t d, size_t g) {
      const CocoInstance& ref = image.references[gi[g]];
      return RleIou(image.detections[di[d]].mask, ref.mask, ref.crowd);
    });
    v1::CocoImageRecord* r = records->Add();
    r->set_category_id(category);
    for (double s : e.scores) r->add_scores(s);
    std::string bytes(e.outcome.size(), '\0');
    for (size_t i = 0; i < e.outcome.size(); ++i) bytes[i] = static_cast<char>(e.outcome[i]);
    r->set_outcomes(std::move(bytes));
    for (int64_t p : e.positives) r->add_positives(p);
    r->set_references(e.references);
    r->set_detections(e.detections);
    // IoU 0.5 (t = 0), all areas (a = 0).
    int64_t tp = 0, fp = 0;
    const size_t D = e.scores.size();
    for (size_t d = 0; d < D && T > 0; ++d) {
      tp += e.outcome[d] == CocoOutcome::kTruePositive;
      fp += e.outcome[d] == CocoOutcome::kFalsePositive;
    }
    r->set_tp50(tp);
    r->set_fp50(fp);
    r->set_fn50(e.positives.empty() ? 0 : e.positives[0] - tp);
    if (layers != nullptr) CollectMatching(image, gi, di, e, layers);
  }
}

// Adds `length` pixels of `outcome` from column-major position `start` of an image of `height` rows
// to the cells of the panel pixels whose boxes hold them.
void AddSpan(const ThumbnailGrid& grid, int64_t height, uint64_t start, uint64_t length, PixelOutcome outcome,
             ThumbnailCells* cells) {
  uint64_t p = start;
  const uint64_t end = start + length;
  while (p < end) {
    const int64_t x = static_cast<int64_t>(p / static_cast<uint64_t>(height));
    const int64_t y = static_cast<int64_t>(p % static_cast<uint64_t>(height));
    const int64_t y_end = std::min<int64_t>(height, y + static_cast<int64_t>(end - p));
    // The panel columns whose boxes hold column x, and the rows whose boxes meet [y, y_end).
    int ox = static_cast<int>(std::upper_bound(grid.x1.begin(), grid.x1.end(), x) - grid.x1.begin());
    for (; ox < grid.ow && grid.x0[ox] <= x; ++ox) {
      int oy = static_cast<int>(std::upper_bound(grid.y1.begin(), grid.y1.end(), y) - grid.y1.begin());
      for (; oy < grid.oh && grid.y0[oy] < y_end; ++oy) {
        const int64_t overlap = std::min<int64_t>(grid.y1[oy], y_end) - std::max<int64_t>(grid.y0[oy], y);
        if (overlap > 0) cells->count[(static_cast<size_t>(oy) * grid.ow + ox) * 5 + outcome] += overlap;
      }
    }
    p += static_cast<uint64_t>(y_end - y);
  }
}

}  // namespace

double RowInstanceF1(const v1::ImageResult& result) {
  int64_t tp = 0, fp = 0, fn = 0;
  for (const v1::CocoImageRecord& r : result.instances()) {
    tp += r.tp50();
    fp += r.fp50();
    fn += r.fn50();
  }
  return InstanceF1(tp, fp, fn);
}

double InstanceF1(int64_t tp, int64_t fp, int64_t fn) {
  const int64_t denominator = 2 * tp + fp + fn;
  return denominator == 0 ? std::numeric_limits<double>::quiet_NaN()
                          : 2.0 * static_cast<double>(tp) / static_cast<double>(denominator);
}

void PaintRle(const Rle& mask, uint16_t value, uint16_t* labels) { PaintRuns(mask, value, labels); }

void PaintCocoLabels(const std::vector<CocoInstance>& instances, bool detections, int64_t height, int64_t width,
                     uint16_t* labels, bool column_major, bool zeroed) {
  if (!zeroed) std::fill(labels, labels + height * width, uint16_t{0});
  std::vector<size_t> order(instances.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (detections) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return instances[a].score < instances[b].score; });
  }
  for (size_t i : order) {
    const CocoInstance& inst = instances[i];
    if (detections && !(inst.score >= kCocoSemanticScore)) continue;
    PaintRuns(inst.mask, static_cast<uint16_t>(inst.category_id), labels, column_major);
  }
}

absl::Status CocoReferenceLabels(const CocoSource& source, const v1::ManifestRow& row, int height, int width,
                                 LabelMap* out, int64_t max_bytes) {
  out->height = height;
  out->width = width;
  out->depth = 1;
  out->labels.assign(static_cast<size_t>(height) * width, 0);
  if (row.has_coco_ann_ids()) {
    absl::StatusOr<Rle> u =
        source.AnnotationUnion({row.coco_ann_ids().begin(), row.coco_ann_ids().end()}, height, width, max_bytes);
    if (!u.ok()) return u.status();
    PaintRle(*u, 1, out->labels.data());
    return absl::OkStatus();
  }
  CocoImageInstances image;
  if (absl::Status s = source.Instances(row.coco_image_id(), &image, max_bytes); !s.ok()) return s;
  if (image.height != height || image.width != width) {
    return absl::InvalidArgumentError(absl::StrCat("image '", row.image_path(), "' is ", height, "x", width,
                                                   " (height x width) but the annotation file says ", image.height,
                                                   "x", image.width, " for image ", image.image_id));
  }
  PaintCocoLabels(image.references, false, height, width, out->labels.data());
  return absl::OkStatus();
}

absl::StatusOr<std::string> RenderInstanceThumbnail(const CocoImageInstances& image, const uint8_t* rgb) {
  if (image.height <= 0 || image.width <= 0) return absl::InvalidArgumentError("empty image");
  std::array<std::vector<const Rle*>, 3> layers;  // tp, fn, fp: painted in that order, each over the last.
  google::protobuf::RepeatedPtrField<v1::CocoImageRecord> records;  // Evaluated again, for the picture.
  EvaluateInstances(image, &records, &layers);
  // The picture EvaluateCocoInstances paints, counted per panel box from the masks' runs: a pixel is
  // fp where any false detection is, else fn where a missed reference is, else tp. No full-size
  // picture is made (a 16384 x 16384 image's took minutes to paint pixel by pixel).
  std::array<Rle, 3> unions;
  for (int k = 0; k < 3; ++k) unions[k] = RleUnion(layers[k], image.height, image.width);
  const Rle errors = RleUnion({&unions[1], &unions[2]}, image.height, image.width);
  const ThumbnailGrid grid(static_cast<int>(image.height), static_cast<int>(image.width));
  ThumbnailCells cells(grid, rgb != nullptr);
  RleSpans(unions[2], unions[1], [&](uint64_t start, uint64_t n, bool fp, bool fn) {
    if (fp || fn) AddSpan(grid, image.height, start, n, fp ? kOutcomeFp : kOutcomeFn, &cells);
  });
  RleSpans(errors, unions[0], [&](uint64_t start, uint64_t n, bool error, bool tp) {
    if (tp && !error) AddSpan(grid, image.height, start, n, kOutcomeTp, &cells);
  });
  CountOutcomesAndPixels(grid, rgb, nullptr, static_cast<int>(image.width), &cells);
  return ComposeThumbnail(grid, cells);
}

absl::StatusOr<std::shared_ptr<const PanopticSource>> PanopticSource::Load(const std::string& reference,
                                                                           const std::string& predictions,
                                                                           const ClientFileLimits& limits) {
  auto source = std::shared_ptr<PanopticSource>(new PanopticSource());
  absl::StatusOr<CocoDataset> r = LoadCocoPanoptic(reference, limits);
  if (!r.ok()) return r.status();
  source->reference_ = *std::move(r);
  absl::StatusOr<CocoDataset> p = LoadCocoPanoptic(predictions, limits);
  if (!p.ok()) return p.status();
  source->predictions_ = *std::move(p);
  for (const CocoPanopticAnnotation& a : source->reference_.panoptic) source->by_image_[0].emplace(a.image_id, &a);
  for (const CocoPanopticAnnotation& a : source->predictions_.panoptic) source->by_image_[1].emplace(a.image_id, &a);
  for (const CocoCategoryInfo& c : source->reference_.categories) source->categories_.push_back({c.id, c.isthing});
  return std::shared_ptr<const PanopticSource>(std::move(source));
}

namespace {

// A panoptic PNG's segment ids (R + 256 G + 256^2 B).
void SegmentIds(const RgbImage& rgb, std::vector<uint32_t>* ids) {
  ids->resize(static_cast<size_t>(rgb.height) * rgb.width);
  const uint8_t* p = rgb.pixels.data();
  for (size_t i = 0; i < ids->size(); ++i, p += 3) (*ids)[i] = p[0] + 256u * p[1] + 65536u * p[2];
}

void PaintSegments(const std::vector<uint32_t>& ids, const std::vector<PanopticSegment>& segments, LabelMap* out,
                   int height, int width) {
  std::unordered_map<uint32_t, uint16_t> category;
  for (const PanopticSegment& s : segments) category[s.id] = static_cast<uint16_t>(s.category_id);
  out->height = height;
  out->width = width;
  out->depth = 1;
  out->labels.resize(ids.size());
  uint32_t last = 0;
  uint16_t last_category = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != last) {
      last = ids[i];
      auto it = category.find(last);
      last_category = it == category.end() ? 0 : it->second;
    }
    out->labels[i] = ids[i] == 0 ? 0 : last_category;
  }
}

}  // namespace

absl::Status PanopticSource::Evaluate(const v1::ManifestRow& row, const RgbImage& reference_png,
                                      const RgbImage& prediction_png, LabelMap* reference, LabelMap* prediction,
                                      v1::ImageResult* result) const {
  const CocoPanopticAnnotation* a[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; ++k) {
    auto it = by_image_[k].find(row.coco_image_id());
    if (it == by_image_[k].end()) {
      return absl::InvalidArgumentError(absl::StrCat("no ", k ? "predicted" : "reference", " panoptic annotation for image ",
                                                     row.coco_image_id()));
    }
    a[k] = it->second;
    if (!a[k]->error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(k ? "predicted" : "reference", " annotation of image ",
                                                     row.coco_image_id(), ": ", a[k]->error));
    }
  }
  const RgbImage* rgb[2] = {&reference_png, &prediction_png};
  std::vector<uint32_t> ids[2];
  SegmentIds(reference_png, &ids[0]);
  SegmentIds(prediction_png, &ids[1]);
  if (rgb[0]->height != rgb[1]->height || rgb[0]->width != rgb[1]->width) {
    return absl::InvalidArgumentError(absl::StrCat("prediction '", row.prediction_path(), "' is ", rgb[1]->height, "x",
                                                   rgb[1]->width, " (HxW) but reference '", row.mask_path(), "' is ",
                                                   rgb[0]->height, "x", rgb[0]->width));
  }
  std::vector<PanopticSegment> segments[2];
  for (int k = 0; k < 2; ++k) {
    for (const CocoPanopticSegment& s : a[k]->segments) {
      segments[k].push_back({static_cast<uint32_t>(s.id), s.category_id, s.iscrowd, s.area});
    }
  }
  absl::StatusOr<PanopticImageStats> stats =
      EvaluatePanopticImage(ids[0].data(), ids[1].data(), ids[0].size(), segments[0], segments[1], categories_);
  if (!stats.ok()) return stats.status();
  result->set_panoptic(true);
  result->set_coco_image_id(row.coco_image_id());
  for (const auto& [category, iou] : stats->matches) {
    v1::PanopticMatch* m = result->add_panoptic_matches();
    m->set_category_id(category);
    m->set_iou(iou);
  }
  for (auto [counts, field] : {std::pair<const std::map<int64_t, int64_t>*, google::protobuf::RepeatedPtrField<v1::PanopticCount>*>{
                                   &stats->fp, result->mutable_panoptic_fp()},
                               {&stats->fn, result->mutable_panoptic_fn()}}) {
    for (const auto& [category, count] : *counts) {
      v1::PanopticCount* c = field->Add();
      c->set_category_id(category);
      c->set_count(count);
    }
  }
  PaintSegments(ids[0], segments[0], reference, rgb[0]->height, rgb[0]->width);
  PaintSegments(ids[1], segments[1], prediction, rgb[1]->height, rgb[1]->width);
  return absl::OkStatus();
}

}  // namespace tally
