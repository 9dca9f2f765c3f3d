// tally-bench-cpu: CPU costs of the worker's host-side stages.
//
//   tally-bench-cpu --mode metrics [--size 512] [--iters 50]
//       per-image cost of each metric stage on one core, for a realistic prediction (the
//       reference shifted by a few pixels, ragged boundary) and a noisy one (random-weight model)
//   tally-bench-cpu --mode decode --manifest DIR/manifest.csv [--threads 16] [--seconds 10]
//       images/s of image + mask decoding (the worker's decoder) on N threads: the decode bound
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "base/flag_util.h"
#include "common/formats/volume.h"
#if TALLY_CUDA_KERNELS
#include "metrics/gpu/surface3d_kernel.h"
#endif
#include "common/formats/decode.h"
#include "common/sources/manifest.h"
#include "metrics/label_counts.h"
#include "metrics/overlap.h"
#include "metrics/surface_distance.h"
#include "common/sources/row_files.h"

ABSL_FLAG(std::string, mode, "metrics", "metrics, decode or surface3d");
ABSL_FLAG(std::string, pred, "", "surface3d: predicted label volume (NIfTI)");
ABSL_FLAG(std::string, ref, "", "surface3d: reference label volume (NIfTI)");
ABSL_FLAG(int, device, -1, "surface3d: CUDA device for the GPU path (-1: the CPU)");
ABSL_FLAG(int, size, 512, "metrics: image size");
ABSL_FLAG(int, iters, 40, "metrics: images per measurement");
ABSL_FLAG(std::string, manifest, "", "decode: manifest of the images to decode");
ABSL_FLAG(int, threads, 1, "decode: threads");
ABSL_FLAG(double, seconds, 10, "decode: measurement time");
ABSL_FLAG(bool, images_only, false, "decode: the images alone (no masks): a format's own decode rate");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Reference: a few discs of classes 1..k-1. Prediction: kind 0 = shifted by (3, -2) (a good
// model); kind 1 = shifted, with 1% of pixels set to random labels (stray specks); kind 2 = 20% of
// pixels random (speckle, as a random-weight model may give).
void MakePair(int size, int k, int kind, uint64_t seed, std::vector<uint16_t>* pred, std::vector<uint16_t>* ref) {
  const bool speckle = kind == 2;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  ref->assign(static_cast<size_t>(size) * size, 0);
  for (int s = 0; s < 4; ++s) {
    const double cy = size * (0.2 + 0.6 * u(rng)), cx = size * (0.2 + 0.6 * u(rng)), r = size * (0.05 + 0.1 * u(rng));
    const uint16_t cls = static_cast<uint16_t>(1 + s % (k - 1));
    for (int y = 0; y < size; ++y)
      for (int x = 0; x < size; ++x)
        if ((y - cy) * (y - cy) + (x - cx) * (x - cx) <= r * r) (*ref)[static_cast<size_t>(y) * size + x] = cls;
  }
  pred->assign(ref->size(), 0);
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      const size_t i = static_cast<size_t>(y) * size + x;
      if (speckle) {
        (*pred)[i] = u(rng) < 0.2 ? static_cast<uint16_t>(rng() % k) : (*ref)[i];
      } else {
        const int sy = std::clamp(y - 3, 0, size - 1), sx = std::clamp(x + 2, 0, size - 1);
        (*pred)[i] = (*ref)[static_cast<size_t>(sy) * size + sx];
        if (kind == 1 && u(rng) < 0.01) (*pred)[i] = static_cast<uint16_t>(rng() % k);
      }
    }
  }
}

void Counts(const std::vector<uint16_t>& pred, const std::vector<uint16_t>& ref, int k, std::vector<int64_t>* m) {
  m->assign(static_cast<size_t>(k) * k, 0);
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] != 255) (*m)[ref[i] * k + pred[i]]++;
  }
}

int RunMetrics() {
  const int size = absl::GetFlag(FLAGS_size), iters = absl::GetFlag(FLAGS_iters);
  std::printf("metric stage cost per %dx%d image, one core (%d images per row)\n", size, size, iters);
  std::printf("| prediction | classes | confusion counts + all count metrics | surface distances (hd, hd95, assd, nsd) |\n");
  std::printf("|---|---|---|---|\n");
  const char* kinds[] = {"shifted 3 px (good model)", "shifted + 1% stray specks", "speckle (20% random)"};
  for (int kind = 0; kind < 3; ++kind) {
    for (int k : {2, 4}) {
      std::vector<std::vector<uint16_t>> preds(iters), refs(iters);
      for (int i = 0; i < iters; ++i) MakePair(size, k, kind, 1000 + i, &preds[i], &refs[i]);
      std::vector<int64_t> m;
      std::vector<tally::ConfusionCounts> per_class;
      double sink = 0;
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        Counts(preds[i], refs[i], k, &m);
        tally::ClassCountsFromMatrix(m.data(), k, &per_class);
        for (const tally::ConfusionCounts& cc : per_class) {
          for (tally::Metric metric : tally::kAllMetrics) {
            if (tally::IsCountMetric(metric)) sink += tally::CountMetric(metric, cc);
          }
        }
      }
      auto t1 = Clock::now();
      std::vector<tally::SurfaceValues> values;
      tally::SurfaceOptions options;
      for (int i = 0; i < iters; ++i) {
        tally::ClassSurfaceMetrics(preds[i].data(), refs[i].data(), size, size, k, 255, options, &values);
        sink += values[1].hd95;
      }
      auto t2 = Clock::now();
      std::printf("| %s | %d | %.3f ms | %.2f ms |\n", kinds[kind], k,
                  1e3 * Seconds(t0, t1) / iters, 1e3 * Seconds(t1, t2) / iters);
      if (sink == 12345.678) std::printf(" ");
    }
  }
  return 0;
}

int RunDecode() {
  auto manifest = tally::ReadManifest(absl::GetFlag(FLAGS_manifest));
  if (!manifest.ok()) {
    std::fprintf(stderr, "%s\n", std::string(manifest.status().message()).c_str());
    return 1;
  }
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  const bool images_only = absl::GetFlag(FLAGS_images_only);
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      tally::RgbImage img;
      tally::LabelMap mask;
      const int64_t n = static_cast<int64_t>(manifest->rows.size());
      while (!stop) {
        const auto& row = manifest->rows[next++ % n];
        // As a decode thread does a row: the image, the mask, the job's mask conventions (defaults).
        if (images_only) {
          if (tally::LoadImage(row.image_path, &img).ok()) ++done;
        } else if (tally::LoadImage(row.image_path, &img).ok() && tally::LoadMask(row.mask_path, &mask).ok()) {
          tally::PrepareMask(&mask, {}, 255);
          ++done;
        }
        if (Seconds(start, Clock::now()) > seconds) stop = true;
      }
    });
  }
  for (auto& t : pool) t.join();
  const double elapsed = Seconds(start, Clock::now());
  std::printf("decode: %d threads, %.1f images/s (%s), %.2f ms per image per thread\n", threads,
              done / elapsed, images_only ? "images alone" : "image + mask",
              1e3 * elapsed * threads / std::max<int64_t>(1, done));
  return 0;
}

// One volume pair's surface distances (ClassSurfaceMetrics3D alone, files already read), best of
// --iters runs, with --threads.
int RunSurface3D() {
  tally::LabelMap pred, ref;
  tally::VolumeGeometry gp, gr;
  for (auto [path, map, g] : {std::tuple{absl::GetFlag(FLAGS_pred), &pred, &gp}, {absl::GetFlag(FLAGS_ref), &ref, &gr}}) {
    if (absl::Status s = tally::LoadNiftiLabels(path, int64_t{1} << 34, map, g); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  int classes = 1;
  for (const auto* m : {&pred, &ref}) {
    for (uint16_t v : m->labels) classes = std::max(classes, v + 1);
  }
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const tally::SurfaceOptions3D o{gr.spacing[0], gr.spacing[1], gr.spacing[2], 1.0};
  double best = 1e300, sink = 0;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_iters)); ++i) {
    std::vector<tally::SurfaceValues> values;
    const auto t0 = Clock::now();
    const int device = absl::GetFlag(FLAGS_device);
    if (device >= 0) {
#if TALLY_CUDA_KERNELS
      const std::string why = tally::ClassSurfaceMetrics3DOnDevice(
          pred.labels.data(), ref.labels.data(), static_cast<int>(gr.depth), static_cast<int>(gr.height),
          static_cast<int>(gr.width), classes, 0xFFFF, o, &values, device, threads);
      if (!why.empty()) {
        std::fprintf(stderr, "%s\n", why.c_str());
        return 1;
      }
#else
      std::fprintf(stderr, "this build has no CUDA kernels\n");
      return 1;
#endif
    } else {
      tally::ClassSurfaceMetrics3D(pred.labels.data(), ref.labels.data(), static_cast<int>(gr.depth),
                                   static_cast<int>(gr.height), static_cast<int>(gr.width), classes, 0xFFFF, o,
                                   &values, threads);
    }
    best = std::min(best, Seconds(t0, Clock::now()));
    sink += values.back().hd95;
  }
  std::printf("surface3d%s: %lldx%lldx%lld (z,y,x), %d classes, %d threads: %.4f s (best of %d)%s\n",
              absl::GetFlag(FLAGS_device) >= 0 ? " (gpu)" : "",
              static_cast<long long>(gr.depth), static_cast<long long>(gr.height), static_cast<long long>(gr.width),
              classes, threads, best, absl::GetFlag(FLAGS_iters), sink == 12345.678 ? " " : "");
  return 0;
}

}  // namespace

constexpr char kUsage[] =
    "tally-bench-cpu: CPU costs of the worker's host-side stages.\n"
    "\n"
    "  tally-bench-cpu --mode metrics [--size 512] [--iters 40]\n"
    "  tally-bench-cpu --mode decode --manifest DIR/manifest.csv [--threads 16] [--seconds 10]\n"
    "  tally-bench-cpu --mode surface3d --pred P.nii.gz --ref R.nii.gz [--device N]";

int main(int argc, char** argv) {
  if (!tally::ParseToolFlags(argc, argv, kUsage, "bench/cpu_bench.cc")) {
    return 0;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  return mode == "decode" ? RunDecode() : mode == "surface3d" ? RunSurface3D() : RunMetrics();
}
