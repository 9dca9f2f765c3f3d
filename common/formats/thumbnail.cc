#include "common/formats/thumbnail.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/formats/image_formats.h"
#include "common/formats/jpeg.h"

namespace tally {
namespace {

constexpr int kGap = 4;          // White columns between the panels.
constexpr int kQuality = 90;
constexpr float kAlpha = 0.7f;  // Weight of the outcome colour over the image.

struct Rgb {
  uint8_t r, g, b;
};
constexpr Rgb kColours[] = {{0, 0, 0}, {0, 200, 0}, {235, 30, 30}, {30, 110, 255}, {128, 128, 128}};

}  // namespace

void ClassOutcomes(const uint16_t* prediction, const uint16_t* reference, int64_t n, int cls, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    if (reference[i] == kIgnoredPixel) {
      out[i] = kOutcomeIgnored;
      continue;
    }
    const bool p = prediction[i] == cls, r = reference[i] == cls;
    out[i] = p ? (r ? kOutcomeTp : kOutcomeFp) : (r ? kOutcomeFn : kOutcomeNone);
  }
}

void RegionOutcomes(const uint16_t* prediction, const uint16_t* reference, int64_t n, const uint8_t* member,
                    uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    if (reference[i] == kIgnoredPixel) {
      out[i] = kOutcomeIgnored;
      continue;
    }
    const bool p = member[prediction[i]] != 0, r = member[reference[i]] != 0;
    out[i] = p ? (r ? kOutcomeTp : kOutcomeFp) : (r ? kOutcomeFn : kOutcomeNone);
  }
}

int BusiestSlice(const uint8_t* outcomes, int depth, int height, int width) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  int best = 0;
  int64_t best_count = -1;
  for (int z = 0; z < depth; ++z) {
    int64_t count = 0;
    const uint8_t* o = outcomes + z * plane;
    for (int64_t i = 0; i < plane; ++i) count += o[i] >= kOutcomeTp && o[i] <= kOutcomeFn;
    if (count > best_count) {
      best_count = count;
      best = z;
    }
  }
  return best;
}

ThumbnailGrid::ThumbnailGrid(int height, int width) {
  // Each panel keeps the aspect ratio, the longer side kThumbnailSide (small images are enlarged).
  const double scale = static_cast<double>(kThumbnailSide) / std::max(height, width);
  oh = std::max(1, static_cast<int>(std::lround(height * scale)));
  ow = std::max(1, static_cast<int>(std::lround(width * scale)));
  // Box of output column ox: source columns [x0[ox], x1[ox]); rows likewise.
  x0.resize(ow);
  x1.resize(ow);
  for (int ox = 0; ox < ow; ++ox) {
    x0[ox] = static_cast<int>(static_cast<int64_t>(ox) * width / ow);
    x1[ox] = std::max(x0[ox] + 1, static_cast<int>(static_cast<int64_t>(ox + 1) * width / ow));
  }
  y0.resize(oh);
  y1.resize(oh);
  for (int oy = 0; oy < oh; ++oy) {
    y0[oy] = static_cast<int>(static_cast<int64_t>(oy) * height / oh);
    y1[oy] = std::max(y0[oy] + 1, static_cast<int>(static_cast<int64_t>(oy + 1) * height / oh));
  }
}

ThumbnailCells::ThumbnailCells(const ThumbnailGrid& grid, bool with_image)
    : count(static_cast<size_t>(grid.oh) * grid.ow * 5, 0),
      sum(with_image ? static_cast<size_t>(grid.oh) * grid.ow * 3 : 0, 0) {}

void CountOutcomesAndPixels(const ThumbnailGrid& grid, const uint8_t* rgb, const uint8_t* outcomes, int width,
                            ThumbnailCells* cells) {
  // Source rows are read in order, each once per output row whose box holds it.
  for (int oy = 0; oy < grid.oh; ++oy) {
    for (int y = grid.y0[oy]; y < grid.y1[oy]; ++y) {
      const uint8_t* orow = outcomes != nullptr ? outcomes + static_cast<size_t>(y) * width : nullptr;
      const uint8_t* prow = rgb != nullptr ? rgb + static_cast<size_t>(y) * width * 3 : nullptr;
      for (int ox = 0; ox < grid.ow; ++ox) {
        const size_t cell = static_cast<size_t>(oy) * grid.ow + ox;
        if (orow != nullptr) {
          uint32_t* c = &cells->count[cell * 5];
          for (int x = grid.x0[ox]; x < grid.x1[ox]; ++x) ++c[orow[x] <= kOutcomeIgnored ? orow[x] : 0];
        }
        if (prow != nullptr) {
          uint32_t r = 0, g = 0, b = 0;
          for (int x = grid.x0[ox]; x < grid.x1[ox]; ++x) {
            r += prow[3 * x];
            g += prow[3 * x + 1];
            b += prow[3 * x + 2];
          }
          cells->sum[cell * 3] += r;
          cells->sum[cell * 3 + 1] += g;
          cells->sum[cell * 3 + 2] += b;
        }
      }
    }
  }
}

absl::StatusOr<std::string> ComposeThumbnail(const ThumbnailGrid& grid, const ThumbnailCells& cells) {
  const bool with_image = !cells.sum.empty();
  const int oh = grid.oh, ow = grid.ow;
  const int out_w = 2 * ow + kGap;
  std::vector<uint8_t> out(static_cast<size_t>(oh) * out_w * 3, 255);
  for (int oy = 0; oy < oh; ++oy) {
    for (int ox = 0; ox < ow; ++ox) {
      const size_t cell = static_cast<size_t>(oy) * ow + ox;
      const uint32_t* c = &cells.count[cell * 5];
      const uint32_t area =
          static_cast<uint32_t>(grid.y1[oy] - grid.y0[oy]) * static_cast<uint32_t>(grid.x1[ox] - grid.x0[ox]);
      // Any error in the box shows; otherwise a hit; otherwise ignored if the box is mostly so.
      int outcome = kOutcomeNone;
      if (c[kOutcomeFp] + c[kOutcomeFn] > 0) {
        outcome = c[kOutcomeFp] > c[kOutcomeFn] ? kOutcomeFp : kOutcomeFn;
      } else if (c[kOutcomeTp] > 0) {
        outcome = kOutcomeTp;
      } else if (2 * c[kOutcomeIgnored] > area) {
        outcome = kOutcomeIgnored;
      }
      uint8_t* left = &out[(static_cast<size_t>(oy) * out_w + ox) * 3];
      uint8_t* right = &out[(static_cast<size_t>(oy) * out_w + ow + kGap + ox) * 3];
      uint8_t base[3];
      if (with_image) {
        for (int ch = 0; ch < 3; ++ch) base[ch] = static_cast<uint8_t>((cells.sum[cell * 3 + ch] + area / 2) / area);
      } else {
        // No image: the reference (tp + fn) in white on black.
        const uint8_t v = c[kOutcomeTp] + c[kOutcomeFn] > 0 ? 255 : 0;
        base[0] = base[1] = base[2] = v;
      }
      for (int ch = 0; ch < 3; ++ch) left[ch] = base[ch];
      // Under the colours, the image in darkened grey, so that its own colours cannot pass for them.
      const float grey = with_image ? 0.7f * (0.299f * base[0] + 0.587f * base[1] + 0.114f * base[2]) : 0.0f;
      if (outcome == kOutcomeNone) {
        for (int ch = 0; ch < 3; ++ch) right[ch] = static_cast<uint8_t>(std::lround(grey));
        continue;
      }
      const Rgb col = kColours[outcome];
      const uint8_t colour[3] = {col.r, col.g, col.b};
      for (int ch = 0; ch < 3; ++ch) {
        right[ch] = with_image ? static_cast<uint8_t>(std::lround(kAlpha * colour[ch] + (1 - kAlpha) * grey))
                               : colour[ch];
      }
    }
  }
  // 4:4:4: a few pixels of error colour must survive the encoding.
  return EncodeJpeg(out.data(), oh, out_w, kQuality, /*full_chroma=*/true);
}

absl::StatusOr<std::string> RenderThumbnail(const uint8_t* rgb, const uint8_t* outcomes, int height, int width) {
  if (height <= 0 || width <= 0) return absl::InvalidArgumentError("empty image");
  const ThumbnailGrid grid(height, width);
  ThumbnailCells cells(grid, rgb != nullptr);
  CountOutcomesAndPixels(grid, rgb, outcomes, width, &cells);
  return ComposeThumbnail(grid, cells);
}

absl::StatusOr<std::string> RenderClassThumbnail(const uint8_t* rgb, const uint16_t* prediction,
                                                 const uint16_t* reference, int depth, int height, int width,
                                                 int cls, const uint8_t* member, int* slice) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int64_t n = plane * std::max(1, depth);
  std::vector<uint8_t> outcomes(static_cast<size_t>(n));
  if (member != nullptr) {
    RegionOutcomes(prediction, reference, n, member, outcomes.data());
  } else {
    ClassOutcomes(prediction, reference, n, cls, outcomes.data());
  }
  *slice = depth > 1 ? BusiestSlice(outcomes.data(), depth, height, width) : 0;
  const uint8_t* slice_rgb = rgb != nullptr ? rgb + *slice * plane * 3 : nullptr;
  absl::StatusOr<std::string> jpeg = RenderThumbnail(slice_rgb, outcomes.data() + *slice * plane, height, width);
  if (jpeg.ok() && jpeg->size() > kMaxThumbnailBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("thumbnail of ", jpeg->size(), " bytes"));
  }
  return jpeg;
}

double RowDice(const v1::ClassResult& c, EmptyScore empty) {
  return CountMetricWithEmpty(Metric::kDice, ConfusionCounts{c.tp(), c.fp(), c.fn(), c.tn()}, empty);
}

bool RunningWorst::Offer(int cls, double score, int64_t index) {
  if (keep_ <= 0 || std::isnan(score)) return false;
  std::vector<std::pair<double, int64_t>>& w = worst_[cls];
  const std::pair<double, int64_t> p{score, index};
  if (static_cast<int>(w.size()) >= keep_ && !(p < w.back())) return false;
  w.insert(std::upper_bound(w.begin(), w.end(), p), p);
  if (static_cast<int>(w.size()) > keep_) w.pop_back();
  return true;
}


bool RunningWorst::Contains(int cls, double score, int64_t index) const {
  auto it = worst_.find(cls);
  return it != worst_.end() &&
         std::binary_search(it->second.begin(), it->second.end(), std::make_pair(score, index));
}

std::vector<int> ShardThumbnails::Enter(const v1::ImageResult& result) {
  std::vector<int> classes;
  if (!result.error().empty()) return classes;
  absl::MutexLock lock(&mu_);
  for (int c = all_foreground_ ? 0 : 1; c < result.classes_size(); ++c) {
    if (worst_.Offer(c, RowDice(result.classes(c), empty_), result.index())) classes.push_back(c);
  }
  return classes;
}

std::vector<int> ShardThumbnails::StillAmongWorst(const v1::ImageResult& result, const std::vector<int>& classes) {
  std::vector<int> still;
  absl::MutexLock lock(&mu_);
  for (int c : classes) {
    if (worst_.Contains(c, RowDice(result.classes(c), empty_), result.index())) still.push_back(c);
  }
  return still;
}

bool ShardThumbnails::EnterScore(int cls, double score, int64_t index) {
  absl::MutexLock lock(&mu_);
  return worst_.Offer(cls, score, index);
}

bool ShardThumbnails::Attach(v1::ImageResult* result, int cls, int slice, std::string jpeg) {
  {
    absl::MutexLock lock(&mu_);
    if (bytes_ + jpeg.size() > kMaxShardThumbnailBytes) return false;
    bytes_ += jpeg.size();
  }
  v1::Thumbnail* t = result->add_thumbnails();
  t->set_class_index(cls);
  t->set_slice(slice);
  t->set_jpeg(std::move(jpeg));
  return true;
}

}  // namespace tally
