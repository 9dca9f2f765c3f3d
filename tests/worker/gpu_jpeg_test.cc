// nvJPEG (worker/pipeline/gpu_jpeg.h) against libjpeg-turbo (common/formats/jpeg.h) on the same files: the
// images come out with the right sizes and nearly the same pixels (the two decoders round their
// inverse DCT and chroma upsampling differently: the test prints how far apart they are, which
// BENCHMARKS.md records), corrupt streams fail alone, and many images in one call land at their own
// addresses. Built with nvJPEG only; skipped when no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/formats/decode.h"
#include "gtest/gtest.h"
#include "worker/pipeline/gpu_jpeg.h"
#include "common/formats/jpeg.h"

namespace tally {
namespace {

// A photograph-like image: smooth gradients, a few shapes with sharp edges, sensor noise.
std::vector<uint8_t> Picture(uint64_t seed, int h, int w) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 12);
  std::uniform_real_distribution<double> u(0, 1);
  const double cy = u(rng) * h, cx = u(rng) * w, r = (0.1 + 0.3 * u(rng)) * std::min(h, w);
  std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool inside = (y - cy) * (y - cy) + (x - cx) * (x - cx) < r * r;
      for (int c = 0; c < 3; ++c) {
        double v = 40 + 150.0 * (c == 0 ? y : c == 1 ? x : (x + y) / 2.0) / std::max(h, w) + (inside ? 60 * (c - 1) : 0);
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v + noise(rng), 0.0, 255.0));
      }
    }
  }
  return rgb;
}

struct Diff {
  int max = 0;
  double mean = 0;
  double equal = 0;  // Share of equal values.
};

Diff Compare(const std::vector<uint8_t>& a, const uint8_t* b) {
  Diff d;
  double sum = 0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int e = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    d.max = std::max(d.max, e);
    sum += e;
    same += e == 0;
  }
  d.mean = sum / a.size();
  d.equal = static_cast<double>(same) / a.size();
  return d;
}

class GpuJpegTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = GpuJpegDecoder::Create(0);
    if (!d.ok()) GTEST_SKIP() << d.status().message();
    decoder_ = std::move(*d);
  }
  std::unique_ptr<GpuJpegDecoder> decoder_;
};

TEST_F(GpuJpegTest, PixelsCloseToLibjpegTurboAtTheirOwnAddresses) {
  struct Case {
    int h, w, quality;
    bool full_chroma;
  };
  const std::vector<Case> cases = {{512, 512, 90, false}, {512, 512, 95, true}, {333, 517, 75, false},
                                   {17, 9, 90, false},    {1, 64, 90, true},    {720, 1280, 85, false}};
  std::vector<std::string> files;
  std::vector<RgbImage> cpu(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto jpeg = EncodeJpeg(Picture(i, c.h, c.w).data(), c.h, c.w, c.quality, c.full_chroma);
    ASSERT_TRUE(jpeg.ok()) << jpeg.status();
    files.push_back(*jpeg);
    ASSERT_TRUE(DecodeImage(files.back(), "cpu", &cpu[i]).ok());
  }
  // Twice: the first call sets the decoder up for this many images, the second reuses it.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<uint8_t>> out(cases.size());
    std::vector<GpuJpegImage> jobs(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      out[i].assign(static_cast<size_t>(cases[i].h) * cases[i].w * 3, 7);
      jobs[i].bytes = &files[i];
      jobs[i].name = "case" + std::to_string(i);
      jobs[i].height = cases[i].h;
      jobs[i].width = cases[i].w;
      jobs[i].out = out[i].data();
    }
    decoder_->Decode(&jobs);
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_TRUE(jobs[i].status.ok()) << jobs[i].status;
      const Diff d = Compare(cpu[i].pixels, out[i].data());
      if (round == 0) {
        std::printf("nvJPEG (%s) vs libjpeg-turbo, %dx%d q%d %s: max |diff| %d, mean %.4f, equal %.4f\n",
                    decoder_->backend().c_str(), cases[i].h, cases[i].w, cases[i].quality,
                    cases[i].full_chroma ? "4:4:4" : "4:2:0", d.max, d.mean, d.equal);
      }
      // Two decoders of one standard: the same picture to within rounding, nowhere far off.
      EXPECT_LE(d.max, 24) << i;
      EXPECT_LT(d.mean, 1.0) << i;
      EXPECT_GT(d.equal, 0.5) << i;
    }
  }
}

TEST_F(GpuJpegTest, ACorruptStreamFailsAloneAndDecodingIsRepeatable) {
  auto a = EncodeJpeg(Picture(1, 64, 48).data(), 64, 48, 90);
  auto b = EncodeJpeg(Picture(2, 64, 48).data(), 64, 48, 90);
  ASSERT_TRUE(a.ok() && b.ok());
  std::string broken = a->substr(0, a->size() / 3);  // Truncated after the header.
  std::vector<uint8_t> o1(64 * 48 * 3), o2(64 * 48 * 3), o3(64 * 48 * 3), again(64 * 48 * 3);
  std::vector<GpuJpegImage> jobs(3);
  const std::string* inputs[] = {&*a, &broken, &*b};
  uint8_t* outs[] = {o1.data(), o2.data(), o3.data()};
  for (int i = 0; i < 3; ++i) {
    jobs[i].bytes = inputs[i];
    jobs[i].name = "img" + std::to_string(i);
    jobs[i].height = 64;
    jobs[i].width = 48;
    jobs[i].out = outs[i];
  }
  decoder_->Decode(&jobs);
  EXPECT_TRUE(jobs[0].status.ok()) << jobs[0].status;
  EXPECT_TRUE(jobs[2].status.ok()) << jobs[2].status;
  if (!jobs[1].status.ok()) EXPECT_NE(std::string(jobs[1].status.message()).find("img1"), std::string::npos);
  // The same stream decodes to the same pixels every time (results must not depend on the batch).
  std::vector<GpuJpegImage> one(1);
  one[0] = jobs[2];
  one[0].status = absl::OkStatus();
  one[0].out = again.data();
  decoder_->Decode(&one);
  ASSERT_TRUE(one[0].status.ok());
  EXPECT_EQ(again, o3);
}

}  // namespace
}  // namespace tally
