// tally-make-coco: a deterministic COCO-val2017-sized synthetic instance set for benchmarks
// (docs/instances.md "Instances", BENCHMARKS.md): instance annotations and a results file of detections, both
// with compressed RLE masks.
//
//   tally-make-coco --out /data/coco-bench --images 5000 --detections 100
//
// Image i (640x480 or 480x640) holds 1-14 instances (7.3 on average, ~36 000 over 5000 images) of
// 80 categories with COCO's ids (1..90 with its gaps): ellipses and rectangles whose areas span
// COCO's small/medium/large ranges, 1% of them crowd regions. The results hold `--detections` per
// image: for most references a few detections near it (shifted, grown or shrunk, some duplicates),
// the rest false positives of random categories and places, scores uniform in (0, 1). Image i
// depends only on (--seed, i). No image files are written: a results job reads none.
//
// --shapes realistic: objects as COCO has them instead of convex ellipses and
// rectangles. References are polygons (as COCO's annotations are; 2-decimal vertices, 12-40 of
// them) of irregular star-shaped outlines (a few harmonics of the radius: concave, several runs a
// column), 15% in two parts (an occluded object), crowd regions as uncompressed RLE; detections are
// such outlines perturbed (moved, scaled, other harmonics: the mask a model draws around the object),
// 30% with 1-3 small fragments near their edge, as masks thresholded from a probability map have.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "absl/flags/flag.h"
#include "base/flag_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "metrics/coco_rle.h"

ABSL_FLAG(std::string, out, "", "Output folder (created): gt.json, results.json");
ABSL_FLAG(int, images, 5000, "Number of images");
ABSL_FLAG(int, detections, 100, "Detections per image");
ABSL_FLAG(int, seed, 1, "Seed");
ABSL_FLAG(std::string, shapes, "simple",
          "simple (convex ellipses and rectangles, compressed RLE) or realistic (polygon references of irregular "
          "outlines, some in parts; detections with fragments)");

namespace tally {
namespace {

const int kCategoryIds[80] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                              22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
                              46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65,
                              67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90};

struct Shape {
  double cy, cx, ry, rx;
  bool ellipse;
};

// The shape's mask as COCO's RLE, built column by column (each column of a convex shape is one run
// of 1s): no h x w mask is ever drawn.
Rle Draw(const Shape& s, int h, int w) {
  Rle r;
  r.height = h;
  r.width = w;
  int value = 0;  // Of the run being counted: 0s first.
  uint32_t length = 0;
  auto emit = [&](int v, int n) {
    if (n <= 0) return;
    if (v != value) {
      r.counts.push_back(length);
      value = v;
      length = 0;
    }
    length += static_cast<uint32_t>(n);
  };
  for (int x = 0; x < w; ++x) {
    int lo = h, hi = -1;
    const double dx = (x - s.cx) / s.rx;
    if (std::fabs(dx) <= 1.0) {
      const double half = s.ellipse ? s.ry * std::sqrt(1.0 - dx * dx) : s.ry;
      lo = std::max(0, static_cast<int>(std::ceil(s.cy - half)));
      hi = std::min(h - 1, static_cast<int>(std::floor(s.cy + half)));
    }
    if (hi < lo) {
      emit(0, h);
      continue;
    }
    emit(0, lo);
    emit(1, hi - lo + 1);
    emit(0, h - 1 - hi);
  }
  r.counts.push_back(length);
  return r;
}

Shape RandomShape(std::mt19937_64& rng, int h, int w) {
  std::uniform_real_distribution<double> u(0, 1);
  // Radii from 2 to ~200 pixels, log-uniform: small, medium and large areas all common.
  const double r = std::exp(std::log(2.0) + u(rng) * (std::log(200.0) - std::log(2.0)));
  const double aspect = 0.5 + u(rng);
  return Shape{u(rng) * h, u(rng) * w, std::max(1.0, r * aspect), std::max(1.0, r / aspect), u(rng) < 0.6};
}

std::string Segmentation(const Rle& m, int h, int w) {
  // Compressed RLE uses '0'..'o', which holds '\\' (92): escaped for JSON.
  return absl::StrCat("{\"size\": [", h, ", ", w, "], \"counts\": \"",
                      absl::StrReplaceAll(RleToString(m), {{"\\", "\\\\"}}), "\"}");
}

// An irregular outline: the shape's ellipse with its radius modulated by harmonics 2-5.
struct Outline {
  Shape s;
  double amp[4], phase[4];
};

Outline RandomOutline(std::mt19937_64& rng, const Shape& s) {
  std::uniform_real_distribution<double> u(0, 1);
  Outline o{s, {}, {}};
  for (int k = 0; k < 4; ++k) {
    o.amp[k] = u(rng) * 0.3 / (k + 1);
    o.phase[k] = u(rng) * 6.283185307179586;
  }
  return o;
}

// The outline as a polygon of 12-40 vertices (x, y), inside the image, to 2 decimals as COCO's.
std::vector<double> OutlinePolygon(std::mt19937_64& rng, const Outline& o, int h, int w) {
  std::uniform_real_distribution<double> u(0, 1);
  const int n = 12 + static_cast<int>(u(rng) * 29);
  std::vector<double> xy;
  for (int i = 0; i < n; ++i) {
    const double t = 6.283185307179586 * (i + 0.4 * (u(rng) - 0.5)) / n;
    double f = 1;
    for (int k = 0; k < 4; ++k) f += o.amp[k] * std::cos((k + 2) * t + o.phase[k]);
    f = std::max(0.3, f);
    const double x = std::clamp(o.s.cx + o.s.rx * f * std::cos(t), 0.0, static_cast<double>(w));
    const double y = std::clamp(o.s.cy + o.s.ry * f * std::sin(t), 0.0, static_cast<double>(h));
    xy.push_back(std::round(x * 100) / 100);
    xy.push_back(std::round(y * 100) / 100);
  }
  return xy;
}

std::string PolygonJson(const std::vector<std::vector<double>>& parts) {
  std::string out = "[";
  for (size_t p = 0; p < parts.size(); ++p) {
    absl::StrAppend(&out, p ? ", [" : "[");
    for (size_t i = 0; i < parts[p].size(); ++i) absl::StrAppend(&out, i ? ", " : "", absl::StrFormat("%.2f", parts[p][i]));
    absl::StrAppend(&out, "]");
  }
  return out + "]";
}

std::string UncompressedJson(const Rle& m, int h, int w) {
  std::string out = absl::StrCat("{\"size\": [", h, ", ", w, "], \"counts\": [");
  for (size_t i = 0; i < m.counts.size(); ++i) absl::StrAppend(&out, i ? ", " : "", m.counts[i]);
  return out + "]}";
}

// A reference of --shapes realistic: its polygons (one, or two for an occluded object) and mask.
struct RealisticReference {
  std::vector<std::vector<double>> parts;
  Rle mask;
};

RealisticReference RealisticObject(std::mt19937_64& rng, const Shape& s, int h, int w) {
  std::uniform_real_distribution<double> u(0, 1);
  RealisticReference r;
  r.parts.push_back(OutlinePolygon(rng, RandomOutline(rng, s), h, w));
  if (u(rng) < 0.15) {  // Occluded: a second, smaller part beside the first.
    Shape t = s;
    t.cx += (u(rng) < 0.5 ? -1 : 1) * s.rx * (1.1 + 0.5 * u(rng));
    t.ry *= 0.3 + 0.4 * u(rng);
    t.rx *= 0.3 + 0.4 * u(rng);
    t.cx = std::clamp(t.cx, 0.0, static_cast<double>(w));
    r.parts.push_back(OutlinePolygon(rng, RandomOutline(rng, t), h, w));
  }
  r.mask = RleFromPolygons(r.parts, h, w).value();  // In the image, 3 or more points: valid.
  return r;
}

// A detection of --shapes realistic around `s`: an outline's mask, sometimes with fragments.
Rle RealisticDetection(std::mt19937_64& rng, const Shape& s, int h, int w) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<Rle> pieces;
  pieces.push_back(RleFromPolygon(OutlinePolygon(rng, RandomOutline(rng, s), h, w), h, w).value());
  if (u(rng) < 0.3) {
    const int fragments = 1 + static_cast<int>(u(rng) * 3);
    for (int f = 0; f < fragments; ++f) {
      const double t = u(rng) * 6.283185307179586, r = 1 + u(rng) * 3;
      Shape b{std::clamp(s.cy + s.ry * 1.1 * std::sin(t), 0.0, h - 1.0),
              std::clamp(s.cx + s.rx * 1.1 * std::cos(t), 0.0, w - 1.0), r, r, true};
      pieces.push_back(Draw(b, h, w));
    }
  }
  std::vector<const Rle*> parts;
  for (const Rle& p : pieces) parts.push_back(&p);
  return RleUnion(parts, h, w);
}

int Run() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "tally-make-coco: --out is required\n");
    return 2;
  }
  const std::string shapes = absl::GetFlag(FLAGS_shapes);
  if (shapes != "simple" && shapes != "realistic") {
    std::fprintf(stderr, "tally-make-coco: --shapes %s: expected simple or realistic\n", shapes.c_str());
    return 2;
  }
  const bool realistic = shapes == "realistic";
  mkdir(out.c_str(), 0755);
  std::ofstream gt(out + "/gt.json"), res(out + "/results.json");
  gt << "{\"images\": [";
  const int n = absl::GetFlag(FLAGS_images), per_image = absl::GetFlag(FLAGS_detections);
  for (int i = 0; i < n; ++i) {
    const bool portrait = i % 4 == 3;
    gt << (i ? ", " : "") << "{\"id\": " << (i + 1) << ", \"file_name\": \"" << absl::StrFormat("%012d.jpg", i + 1)
       << "\", \"height\": " << (portrait ? 640 : 480) << ", \"width\": " << (portrait ? 480 : 640) << "}";
  }
  gt << "], \"categories\": [";
  for (int k = 0; k < 80; ++k) gt << (k ? ", " : "") << "{\"id\": " << kCategoryIds[k] << ", \"name\": \"c" << kCategoryIds[k] << "\"}";
  gt << "], \"annotations\": [";
  res << "[";
  int64_t ann_id = 0, results = 0;
  for (int i = 0; i < n; ++i) {
    std::mt19937_64 rng(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)) * 1000003 + i);
    std::uniform_real_distribution<double> u(0, 1);
    const bool portrait = i % 4 == 3;
    const int h = portrait ? 640 : 480, w = portrait ? 480 : 640;
    const int count = 1 + static_cast<int>(u(rng) * 13.6);
    int made = 0;
    auto detection = [&](int category, const Rle& m) {
      res << (results++ ? ", " : "") << "{\"image_id\": " << (i + 1) << ", \"category_id\": " << category
          << ", \"score\": " << absl::StrFormat("%.6f", u(rng)) << ", \"segmentation\": " << Segmentation(m, h, w)
          << "}";
      ++made;
    };
    for (int g = 0; g < count; ++g) {
      const Shape s = RandomShape(rng, h, w);
      RealisticReference real;
      if (realistic) real = RealisticObject(rng, s, h, w);
      const Rle m = realistic ? real.mask : Draw(s, h, w);
      const int64_t area = static_cast<int64_t>(RleArea(m));
      if (area == 0) continue;
      const int category = kCategoryIds[static_cast<int>(u(rng) * 80) % 80];
      const bool crowd = u(rng) < 0.01;
      gt << (ann_id ? ", " : "");
      ++ann_id;
      gt << "{\"id\": " << ann_id << ", \"image_id\": " << (i + 1) << ", \"category_id\": " << category
         << ", \"iscrowd\": " << (crowd ? 1 : 0) << ", \"area\": " << area << ", \"segmentation\": "
         << (!realistic ? Segmentation(m, h, w) : crowd ? UncompressedJson(m, h, w) : PolygonJson(real.parts)) << "}";
      const int near = static_cast<int>(u(rng) * 4);  // 0-3 detections near it.
      for (int d = 0; d < near && made < per_image; ++d) {
        Shape t = s;
        t.cy += (u(rng) - 0.5) * s.ry * 0.6;
        t.cx += (u(rng) - 0.5) * s.rx * 0.6;
        t.ry *= 0.8 + 0.4 * u(rng);
        t.rx *= 0.8 + 0.4 * u(rng);
        const int label = u(rng) < 0.9 ? category : kCategoryIds[static_cast<int>(u(rng) * 80) % 80];
        detection(label, realistic ? RealisticDetection(rng, t, h, w) : Draw(t, h, w));
      }
    }
    while (made < per_image) {
      const Shape t = RandomShape(rng, h, w);  // Drawn before its category, as the sets made so far were.
      const int label = kCategoryIds[static_cast<int>(u(rng) * 80) % 80];
      detection(label, realistic ? RealisticDetection(rng, t, h, w) : Draw(t, h, w));
    }
  }
  gt << "]}\n";
  res << "]\n";
  std::printf("tally-make-coco: %d images, %lld annotations, %lld detections in %s\n", n,
              static_cast<long long>(ann_id), static_cast<long long>(results), out.c_str());
  return 0;
}

}  // namespace
}  // namespace tally

constexpr char kUsage[] =
    "tally-make-coco: a deterministic COCO-val2017-sized synthetic instance set (annotations and\n"
    "results) for benchmarks.\n"
    "\n"
    "  tally-make-coco --out DIR [--images 5000] [--detections 100] [--seed 1] [--shapes simple|realistic]";

int main(int argc, char** argv) {
  if (!tally::ParseToolFlags(argc, argv, kUsage, "bench/make_coco.cc")) {
    return 0;
  }
  return tally::Run();
}
