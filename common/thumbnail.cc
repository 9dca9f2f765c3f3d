#include "common/thumbnail.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/image_io.h"

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

absl::StatusOr<std::string> RenderThumbnail(const uint8_t* rgb, const uint8_t* outcomes, int height, int width) {
  if (height <= 0 || width <= 0) return absl::InvalidArgumentError("empty image");
  // Each panel keeps the aspect ratio, the longer side kThumbnailSide (small images are enlarged).
  const double scale = static_cast<double>(kThumbnailSide) / std::max(height, width);
  const int oh = std::max(1, static_cast<int>(std::lround(height * scale)));
  const int ow = std::max(1, static_cast<int>(std::lround(width * scale)));
  const int out_w = 2 * ow + kGap;
  std::vector<uint8_t> out(static_cast<size_t>(oh) * out_w * 3, 255);
  for (int oy = 0; oy < oh; ++oy) {
    const int y0 = static_cast<int>(static_cast<int64_t>(oy) * height / oh);
    const int y1 = std::max(y0 + 1, static_cast<int>(static_cast<int64_t>(oy + 1) * height / oh));
    for (int ox = 0; ox < ow; ++ox) {
      const int x0 = static_cast<int>(static_cast<int64_t>(ox) * width / ow);
      const int x1 = std::max(x0 + 1, static_cast<int>(static_cast<int64_t>(ox + 1) * width / ow));
      int64_t sum[3] = {0, 0, 0};
      int64_t count[5] = {0, 0, 0, 0, 0};
      for (int y = y0; y < y1; ++y) {
        for (int x = x0; x < x1; ++x) {
          const size_t i = static_cast<size_t>(y) * width + x;
          if (rgb != nullptr) {
            for (int ch = 0; ch < 3; ++ch) sum[ch] += rgb[3 * i + ch];
          }
          ++count[outcomes[i] <= kOutcomeIgnored ? outcomes[i] : static_cast<uint8_t>(kOutcomeNone)];
        }
      }
      const int64_t area = static_cast<int64_t>(y1 - y0) * (x1 - x0);
      // Any error in the box shows; otherwise a hit; otherwise ignored if the box is mostly so.
      int outcome = kOutcomeNone;
      if (count[kOutcomeFp] + count[kOutcomeFn] > 0) {
        outcome = count[kOutcomeFp] > count[kOutcomeFn] ? kOutcomeFp : kOutcomeFn;
      } else if (count[kOutcomeTp] > 0) {
        outcome = kOutcomeTp;
      } else if (2 * count[kOutcomeIgnored] > area) {
        outcome = kOutcomeIgnored;
      }
      uint8_t* left = &out[(static_cast<size_t>(oy) * out_w + ox) * 3];
      uint8_t* right = &out[(static_cast<size_t>(oy) * out_w + ow + kGap + ox) * 3];
      uint8_t base[3];
      if (rgb != nullptr) {
        for (int ch = 0; ch < 3; ++ch) base[ch] = static_cast<uint8_t>((sum[ch] + area / 2) / area);
      } else {
        // No image: the reference (tp + fn) in white on black.
        const uint8_t v = count[kOutcomeTp] + count[kOutcomeFn] > 0 ? 255 : 0;
        base[0] = base[1] = base[2] = v;
      }
      for (int ch = 0; ch < 3; ++ch) left[ch] = base[ch];
      // Under the colours, the image in darkened grey, so that its own colours cannot pass for them.
      const float grey = rgb != nullptr ? 0.7f * (0.299f * base[0] + 0.587f * base[1] + 0.114f * base[2]) : 0.0f;
      if (outcome == kOutcomeNone) {
        for (int ch = 0; ch < 3; ++ch) right[ch] = static_cast<uint8_t>(std::lround(grey));
        continue;
      }
      const Rgb c = kColours[outcome];
      const uint8_t colour[3] = {c.r, c.g, c.b};
      for (int ch = 0; ch < 3; ++ch) {
        right[ch] = rgb != nullptr ? static_cast<uint8_t>(std::lround(kAlpha * colour[ch] + (1 - kAlpha) * grey))
                                   : colour[ch];
      }
    }
  }
  // 4:4:4: a few pixels of error colour must survive the encoding.
  return EncodeJpeg(out.data(), oh, out_w, kQuality, /*full_chroma=*/true);
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

bool RunningWorst::Offer(int cls, double score, int64_t index) {
  if (keep_ <= 0 || std::isnan(score)) return false;
  std::vector<std::pair<double, int64_t>>& w = worst_[cls];
  const std::pair<double, int64_t> p{score, index};
  if (static_cast<int>(w.size()) >= keep_ && !(p < w.back())) return false;
  w.insert(std::upper_bound(w.begin(), w.end(), p), p);
  if (static_cast<int>(w.size()) > keep_) w.pop_back();
  return true;
}


std::vector<int> ShardThumbnails::Enter(const v1::ImageResult& result) {
  std::vector<int> classes;
  if (!result.error().empty()) return classes;
  absl::MutexLock lock(&mu_);
  for (int c = all_foreground_ ? 0 : 1; c < result.classes_size(); ++c) {
    const v1::ClassResult& cr = result.classes(c);
    const double dice = CountMetricWithEmpty(Metric::kDice, ConfusionCounts{cr.tp(), cr.fp(), cr.fn(), cr.tn()}, empty_);
    if (worst_.Offer(c, dice, result.index())) classes.push_back(c);
  }
  return classes;
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
