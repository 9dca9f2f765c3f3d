// tally-make-dataset: a deterministic synthetic segmentation dataset for benchmarks.
//
//   tally-make-dataset --out /data/bench --count 1600 --size 512 --format png
//   tally-make-dataset --out /data/bench-jpg --count 1600 --size 512 --format jpeg --quality 90
//
// Each image is a smooth shaded background with low- and mid-frequency texture, 2-6 filled shapes
// (ellipses and rotated rectangles) of their own colour and texture, and mild per-pixel noise: it
// compresses like a photograph (a 512x512 PNG is a few hundred KB), not like random noise. The
// mask labels each shape with a class in 1..classes-1 (0 = background). Image i depends only on
// (--seed, i), so any subset can be regenerated identically, on any number of threads.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "base/flag_util.h"
#include "common/formats/decode.h"
#include "common/formats/png.h"
#include "common/formats/jpeg.h"

ABSL_FLAG(std::string, out, "", "Output folder (created): manifest.csv, images/, masks/");
ABSL_FLAG(int, count, 100, "Number of image/mask pairs");
ABSL_FLAG(int, size, 512, "Height and width in pixels");
ABSL_FLAG(std::string, format, "png", "png or jpeg");
ABSL_FLAG(int, quality, 90, "JPEG quality");
ABSL_FLAG(int, classes, 2, "Classes including background");
ABSL_FLAG(double, noise, 3.0, "Standard deviation of the per-pixel noise (0-255 scale)");
ABSL_FLAG(uint64_t, seed, 1, "Seed");
ABSL_FLAG(int, threads, 0, "Threads (0 = all cores)");

namespace {

struct Wave {
  double fx, fy, phase, amp;
};

std::vector<Wave> Waves(std::mt19937_64& rng, int n, double fmin, double fmax, double amp) {
  std::uniform_real_distribution<double> f(fmin, fmax), p(0, 2 * M_PI), a(0.3 * amp, amp);
  std::vector<Wave> w(n);
  for (Wave& x : w) x = {f(rng) * (rng() % 2 ? 1 : -1), f(rng), p(rng), a(rng)};
  return w;
}

double Eval(const std::vector<Wave>& ws, double x, double y) {
  double v = 0;
  for (const Wave& w : ws) v += w.amp * std::sin(w.fx * x + w.fy * y + w.phase);
  return v;
}

void MakeOne(int index, int size, int classes, double noise, uint64_t seed, std::vector<uint8_t>* rgb,
             std::vector<uint8_t>* mask) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(index));
  std::uniform_real_distribution<double> u(0, 1);
  const int n = size * size;
  rgb->assign(static_cast<size_t>(n) * 3, 0);
  mask->assign(n, 0);
  std::vector<float> base(static_cast<size_t>(n) * 3);
  double bg[3];
  for (double& c : bg) c = 60 + 120 * u(rng);
  auto low = Waves(rng, 3, 0.002, 0.01, 25);
  auto mid = Waves(rng, 4, 0.03, 0.12, 8);
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      const double shade = Eval(low, x, y) + Eval(mid, x, y);
      for (int c = 0; c < 3; ++c) base[(static_cast<size_t>(y) * size + x) * 3 + c] = bg[c] + shade * (0.8 + 0.1 * c);
    }
  }
  const int shapes = 2 + static_cast<int>(rng() % 5);
  for (int s = 0; s < shapes; ++s) {
    const int cls = 1 + static_cast<int>(rng() % std::max(1, classes - 1));
    const double cy = size * (0.1 + 0.8 * u(rng)), cx = size * (0.1 + 0.8 * u(rng));
    const double ry = size * (0.05 + 0.15 * u(rng)), rx = size * (0.05 + 0.15 * u(rng));
    const double angle = u(rng) * M_PI, ca = std::cos(angle), sa = std::sin(angle);
    const bool ellipse = rng() % 2;
    double col[3];
    for (double& c : col) c = 30 + 200 * u(rng);
    auto tex = Waves(rng, 3, 0.05, 0.3, 10);
    const int y0 = std::max(0, static_cast<int>(cy - std::max(rx, ry) - 1));
    const int y1 = std::min(size - 1, static_cast<int>(cy + std::max(rx, ry) + 1));
    const int x0 = std::max(0, static_cast<int>(cx - std::max(rx, ry) - 1));
    const int x1 = std::min(size - 1, static_cast<int>(cx + std::max(rx, ry) + 1));
    for (int y = y0; y <= y1; ++y) {
      for (int x = x0; x <= x1; ++x) {
        const double dy = y - cy, dx = x - cx;
        const double a = (dx * ca + dy * sa) / rx, b = (-dx * sa + dy * ca) / ry;
        const bool inside = ellipse ? a * a + b * b <= 1.0 : std::fabs(a) <= 1.0 && std::fabs(b) <= 1.0;
        if (!inside) continue;
        const size_t i = static_cast<size_t>(y) * size + x;
        (*mask)[i] = static_cast<uint8_t>(cls);
        const double t = Eval(tex, x, y);
        for (int c = 0; c < 3; ++c) base[i * 3 + c] = col[c] + t;
      }
    }
  }
  std::normal_distribution<double> g(0, noise);
  for (size_t i = 0; i < base.size(); ++i) {
    (*rgb)[i] = static_cast<uint8_t>(std::clamp(std::lround(base[i] + (noise > 0 ? g(rng) : 0)), 0L, 255L));
  }
}

}  // namespace

constexpr char kUsage[] =
    "tally-make-dataset: a deterministic synthetic segmentation dataset for benchmarks\n"
    "(photograph-like images and their masks).\n"
    "\n"
    "  tally-make-dataset --out DIR [--count 1600] [--size 512] [--format png|jpeg] [--quality 90]";

int main(int argc, char** argv) {
  if (!tally::ParseToolFlags(argc, argv, kUsage, "bench/make_dataset.cc")) {
    return 0;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  const int count = absl::GetFlag(FLAGS_count), size = absl::GetFlag(FLAGS_size);
  const bool jpeg = absl::GetFlag(FLAGS_format) == "jpeg" || absl::GetFlag(FLAGS_format) == "jpg";
  if (out.empty() || count < 1 || size < 8) {
    std::fprintf(stderr, "usage: tally-make-dataset --out DIR --count N --size S [--format png|jpeg]\n");
    return 2;
  }
  for (const std::string& d : {out, out + "/images", out + "/masks"}) mkdir(d.c_str(), 0755);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<uint8_t> rgb, mask;
      for (int i = next++; i < count; i = next++) {
        MakeOne(i, size, absl::GetFlag(FLAGS_classes), absl::GetFlag(FLAGS_noise), absl::GetFlag(FLAGS_seed), &rgb,
                &mask);
        const std::string name = absl::StrFormat("%06d", i);
        absl::Status s = jpeg ? tally::WriteJpeg(out + "/images/" + name + ".jpg", size, size, rgb.data(),
                                                 absl::GetFlag(FLAGS_quality))
                              : tally::WritePng(out + "/images/" + name + ".png", size, size, 3, 8, rgb.data());
        if (s.ok()) s = tally::WritePng(out + "/masks/" + name + ".png", size, size, 1, 8, mask.data());
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
          ++failed;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  std::ofstream m(out + "/manifest.csv");
  m << "image,mask\n";
  for (int i = 0; i < count; ++i) {
    m << absl::StrFormat("images/%06d.%s,masks/%06d.png\n", i, jpeg ? "jpg" : "png", i);
  }
  std::printf("wrote %d pairs (%dx%d %s) to %s\n", count, size, size, jpeg ? "JPEG" : "PNG", out.c_str());
  return failed > 0 ? 1 : 0;
}
