// tally-coco-eval: COCO mask AP of a results file against instance annotations, in one process
// (metrics/coco_eval.h: COCOeval's segm numbers to the bit). The tests cross-check it against an
// independent numpy COCOeval; benchmarks time it.
//
//   tally-coco-eval --gt instances.json --results results.json [--threads 8] [--out stats.json]
//
// Prints the 12 numbers as COCOeval.summarize does, and writes them (with AP per category and the
// times of each step) as JSON, values in full precision. Exit status 1 on a file or annotation error.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "base/flag_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/coco/coco_json.h"
#include "metrics/coco_eval.h"
#include "metrics/coco_rle.h"

ABSL_FLAG(std::string, gt, "", "COCO instance annotations (ground truth)");
ABSL_FLAG(std::string, results, "", "COCO results (detections with segmentation and score)");
ABSL_FLAG(int, threads, 1, "Threads for the per-image evaluation");
ABSL_FLAG(std::string, out, "", "Write the numbers here as JSON");

namespace tally {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Instance {
  const CocoAnnotation* ann;
  Rle mask;
};
// One image's instances, per category.
using ImageInstances = std::map<int64_t, std::pair<std::vector<Instance>, std::vector<Instance>>>;

int Fail(const std::string& message) {
  std::fprintf(stderr, "tally-coco-eval: %s\n", message.c_str());
  return 1;
}

// Every annotation's (or result's) mask, decoded on `threads` threads; an error names the first bad one.
absl::StatusOr<std::vector<Rle>> DecodeAll(const std::vector<CocoAnnotation>& anns,
                                           const std::map<int64_t, const CocoImageInfo*>& images,
                                           const std::map<int64_t, bool>& categories, bool result, int threads) {
  std::vector<Rle> masks(anns.size());
  std::vector<std::string> errors(anns.size());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < anns.size(); i += threads) {
        const CocoAnnotation& a = anns[i];
        const char* what = result ? "result " : "annotation ";
        auto it = images.find(a.image_id);
        if (!a.error.empty()) {
          errors[i] = a.error;
        } else if (it == images.end()) {
          errors[i] = absl::StrCat(what, a.id, ": image ", a.image_id, " is not in the ground truth");
        } else if (categories.count(a.category_id)) {
          absl::StatusOr<Rle> mask = SegmentationRle(a.segmentation, it->second->height, it->second->width);
          if (mask.ok()) {
            masks[i] = *std::move(mask);
          } else {
            errors[i] = absl::StrCat(what, a.id, ": ", mask.status().message());
          }
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (const std::string& e : errors) {
    if (!e.empty()) return absl::InvalidArgumentError(e);
  }
  return masks;
}

// Masks for every annotation and result, grouped by image and category. Results whose category
// the ground truth does not list are left out, as COCOeval leaves them out.
absl::StatusOr<std::map<int64_t, ImageInstances>> Group(const CocoDataset& gt, const std::vector<CocoAnnotation>& dts,
                                                        int threads) {
  std::map<int64_t, const CocoImageInfo*> images;
  for (const CocoImageInfo& im : gt.images) images[im.id] = &im;
  std::map<int64_t, bool> categories;
  for (const CocoCategoryInfo& c : gt.categories) categories[c.id] = true;
  std::map<int64_t, ImageInstances> out;
  for (const CocoImageInfo& im : gt.images) out[im.id];
  for (bool result : {false, true}) {
    const std::vector<CocoAnnotation>& anns = result ? dts : gt.annotations;
    absl::StatusOr<std::vector<Rle>> masks = DecodeAll(anns, images, categories, result, threads);
    if (!masks.ok()) return masks.status();
    for (size_t i = 0; i < anns.size(); ++i) {
      if (!categories.count(anns[i].category_id)) continue;
      auto& slot = out[anns[i].image_id][anns[i].category_id];
      (result ? slot.second : slot.first).push_back({&anns[i], std::move((*masks)[i])});
    }
  }
  return out;
}

std::vector<CocoImageEval> EvaluateAll(const std::map<int64_t, ImageInstances>& images, int threads) {
  std::vector<std::pair<int64_t, const ImageInstances::value_type*>> work;
  for (const auto& [image_id, cats] : images) {
    for (const auto& entry : cats) work.push_back({image_id, &entry});
  }
  std::vector<CocoImageEval> evals(work.size());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < work.size(); i += threads) {
        const auto& [category, insts] = *work[i].second;
        const auto& [refs, dets] = insts;
        std::vector<CocoReference> r;
        for (const Instance& g : refs) r.push_back({g.ann->id, g.ann->area, g.ann->iscrowd});
        std::vector<CocoDetection> d;
        for (const Instance& x : dets) d.push_back({x.ann->id, x.ann->score, static_cast<double>(RleArea(x.mask))});
        evals[i] = EvaluateCocoImage(work[i].first, category, r, d, [&](size_t di, size_t gi) {
          return RleIou(dets[di].mask, refs[gi].mask, refs[gi].ann->iscrowd);
        });
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return evals;
}

int Run() {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<CocoDataset> gt = LoadCocoDataset(absl::GetFlag(FLAGS_gt));
  if (!gt.ok()) return Fail(std::string(gt.status().message()));
  absl::StatusOr<std::vector<CocoAnnotation>> dts = LoadCocoResults(absl::GetFlag(FLAGS_results));
  if (!dts.ok()) return Fail(std::string(dts.status().message()));
  const double load = Since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  absl::StatusOr<std::map<int64_t, ImageInstances>> images = Group(*gt, *dts, threads);
  if (!images.ok()) return Fail(std::string(images.status().message()));
  const std::vector<CocoImageEval> evals = EvaluateAll(*images, threads);
  const double evaluate = Since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  std::vector<const CocoImageEval*> ptrs;
  for (const CocoImageEval& e : evals) ptrs.push_back(&e);
  std::vector<int64_t> categories;
  for (const CocoCategoryInfo& c : gt->categories) categories.push_back(c.id);
  const CocoAccumulated acc = AccumulateCoco(ptrs, categories);
  const std::array<double, 12> stats = SummarizeCoco(acc);
  const double accumulate = Since(t2);
  std::string json = "{\"stats\": [";
  for (int i = 0; i < 12; ++i) {
    std::printf(" %-5s = %.3f\n", kCocoStatNames[i], stats[i]);
    absl::StrAppend(&json, i ? ", " : "", absl::StrFormat("%.17g", stats[i]));
  }
  absl::StrAppend(&json, "], \"category_ap\": {");
  for (size_t k = 0; k < acc.K; ++k) {
    absl::StrAppend(&json, k ? ", " : "", "\"", acc.category_ids[k], "\": ",
                    absl::StrFormat("%.17g", CocoCategoryAp(acc, k)));
  }
  absl::StrAppend(&json, absl::StrFormat("}, \"seconds\": {\"load\": %.4f, \"evaluate\": %.4f, \"accumulate\": %.4f}}\n",
                                         load, evaluate, accumulate));
  std::printf("load %.3f s, evaluate %.3f s, accumulate+summarize %.3f s\n", load, evaluate, accumulate);
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_out)) << json;
  }
  return 0;
}

}  // namespace
}  // namespace tally

constexpr char kUsage[] =
    "tally-coco-eval: COCO mask AP of a results file against instance annotations, in one process.\n"
    "\n"
    "  tally-coco-eval --gt instances.json --results results.json [--threads 8] [--out stats.json]";

int main(int argc, char** argv) {
  if (!tally::ParseToolFlags(argc, argv, kUsage, "bench/coco_eval.cc")) {
    return 0;
  }
  return tally::Run();
}
