#include "common/image_io.h"

#include <sys/stat.h>
#include <zlib.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

std::string Tmp(const std::string& name) { return ::testing::TempDir() + "/image_io_test_" + name; }

TEST(ImageIoTest, RgbPngRoundTrip) {
  std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90};
  ASSERT_TRUE(WritePng(Tmp("rgb.png"), 2, 3, 3, 8, rgb.data()).ok());
  RgbImage img;
  ASSERT_TRUE(LoadImage(Tmp("rgb.png"), &img).ok());
  EXPECT_EQ(img.height, 2);
  EXPECT_EQ(img.width, 3);
  EXPECT_EQ(img.pixels, rgb);
}

TEST(ImageIoTest, GrayAndRgbaBecomeRgb) {
  std::vector<uint8_t> gray = {0, 100, 200, 255};
  ASSERT_TRUE(WritePng(Tmp("gray.png"), 2, 2, 1, 8, gray.data()).ok());
  RgbImage img;
  ASSERT_TRUE(LoadImage(Tmp("gray.png"), &img).ok());
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{0, 0, 0, 100, 100, 100, 200, 200, 200, 255, 255, 255}));
  std::vector<uint8_t> rgba = {1, 2, 3, 0, 4, 5, 6, 128};  // Alpha is dropped, not composited.
  ASSERT_TRUE(WritePng(Tmp("rgba.png"), 1, 2, 4, 8, rgba.data()).ok());
  ASSERT_TRUE(LoadImage(Tmp("rgba.png"), &img).ok());
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(ImageIoTest, Masks8And16Bit) {
  std::vector<uint8_t> m8 = {0, 1, 2, 255, 3, 0};
  ASSERT_TRUE(WritePng(Tmp("m8.png"), 2, 3, 1, 8, m8.data()).ok());
  LabelMap mask;
  ASSERT_TRUE(LoadMask(Tmp("m8.png"), &mask).ok());
  EXPECT_EQ(mask.labels, (std::vector<uint16_t>{0, 1, 2, 255, 3, 0}));
  EXPECT_EQ(mask.max_label, 3);  // 255 (ignore) does not count.
  std::vector<uint16_t> m16 = {0, 300, 1000, 255};
  ASSERT_TRUE(WritePng(Tmp("m16.png"), 2, 2, 1, 16, m16.data()).ok());
  ASSERT_TRUE(LoadMask(Tmp("m16.png"), &mask).ok());
  EXPECT_EQ(mask.labels, m16);
  EXPECT_EQ(mask.max_label, 1000);
  EXPECT_THAT(DescribeLabelOutOfRange(mask, 3), HasSubstr("mask value 300 at (y=0, x=1) >= number of classes 3"));
  EXPECT_EQ(DescribeLabelOutOfRange(mask, 1001), "");
}

TEST(ImageIoTest, RgbMaskIsRejected) {
  std::vector<uint8_t> rgb(12, 1);
  ASSERT_TRUE(WritePng(Tmp("rgbmask.png"), 2, 2, 3, 8, rgb.data()).ok());
  LabelMap mask;
  absl::Status s = LoadMask(Tmp("rgbmask.png"), &mask);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("single-channel"));
  EXPECT_THAT(s.message(), HasSubstr("rgbmask.png"));
}

TEST(ImageIoTest, JpegDecodesAndIsRejectedAsMask) {
  std::vector<uint8_t> rgb(16 * 16 * 3);
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = 200;
    rgb[i + 1] = 100;
    rgb[i + 2] = 50;
  }
  ASSERT_TRUE(WriteJpeg(Tmp("flat.jpg"), 16, 16, rgb.data(), 95).ok());
  RgbImage img;
  ASSERT_TRUE(LoadImage(Tmp("flat.jpg"), &img).ok());
  EXPECT_EQ(img.height, 16);
  EXPECT_EQ(img.width, 16);
  for (size_t i = 0; i < img.pixels.size(); ++i) EXPECT_NEAR(img.pixels[i], rgb[i], 3) << i;
  LabelMap mask;
  absl::Status s = LoadMask(Tmp("flat.jpg"), &mask);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("JPEG"));
}

// What a GPU decoder is handed (worker/gpu_jpeg.h): the JPEG's declared size, or DecodeImage's own
// error for a stream it would refuse, before any pixel is decoded.
TEST(ImageIoTest, InspectJpegChecksTheHeaderAsDecodeImageDoes) {
  std::vector<uint8_t> rgb(30 * 50 * 3, 77);
  absl::StatusOr<std::string> jpeg = EncodeJpeg(rgb.data(), 30, 50, 90);
  ASSERT_TRUE(jpeg.ok());
  EXPECT_TRUE(LooksLikeJpeg(*jpeg));
  EXPECT_FALSE(LooksLikeJpeg(std::string("\x89PNG\r\n\x1a\n")));
  int h = 0, w = 0;
  ASSERT_TRUE(InspectJpeg(*jpeg, "a.jpg", kDefaultMaxImagePixels, &h, &w).ok());
  EXPECT_EQ(h, 30);
  EXPECT_EQ(w, 50);
  // Over the pixel limit: the same message as DecodeImage's.
  absl::Status inspect = InspectJpeg(*jpeg, "a.jpg", 30 * 50 - 1, &h, &w);
  RgbImage img;
  absl::Status decode = DecodeImage(*jpeg, "a.jpg", &img, 30 * 50 - 1);
  ASSERT_FALSE(inspect.ok());
  EXPECT_EQ(inspect, decode);
  EXPECT_THAT(inspect.message(), HasSubstr("30x50"));
  // A header cut short: refused, by name, as DecodeImage refuses it.
  inspect = InspectJpeg(jpeg->substr(0, 12), "b.jpg", kDefaultMaxImagePixels, &h, &w);
  ASSERT_FALSE(inspect.ok());
  EXPECT_THAT(inspect.message(), HasSubstr("image 'b.jpg' is"));
  EXPECT_EQ(inspect, DecodeImage(jpeg->substr(0, 12), "b.jpg", &img));
  // And the decoder still works afterwards on this thread.
  EXPECT_TRUE(InspectJpeg(*jpeg, "a.jpg", kDefaultMaxImagePixels, &h, &w).ok());
}

TEST(ImageIoTest, CorruptAndMissingFilesNameTheFile) {
  std::vector<uint8_t> rgb(64 * 64 * 3, 7);
  ASSERT_TRUE(WritePng(Tmp("whole.png"), 64, 64, 3, 8, rgb.data(), 0).ok());
  std::string bytes;
  ASSERT_TRUE(ReadFileBytes(Tmp("whole.png"), &bytes).ok());
  std::ofstream(Tmp("truncated.png"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  RgbImage img;
  absl::Status s = LoadImage(Tmp("truncated.png"), &img);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("truncated.png"));
  // A failed JPEG decode must not break the next one on the same thread.
  std::vector<uint8_t> flat(16 * 16 * 3, 90);
  ASSERT_TRUE(WriteJpeg(Tmp("ok.jpg"), 16, 16, flat.data(), 90).ok());
  std::string jpeg;
  ASSERT_TRUE(ReadFileBytes(Tmp("ok.jpg"), &jpeg).ok());
  std::ofstream(Tmp("truncated.jpg"), std::ios::binary) << jpeg.substr(0, jpeg.size() / 2);
  EXPECT_FALSE(LoadImage(Tmp("truncated.jpg"), &img).ok());
  ASSERT_TRUE(LoadImage(Tmp("ok.jpg"), &img).ok());
  EXPECT_EQ(img.height, 16);
  EXPECT_EQ(img.width, 16);
  std::ofstream(Tmp("text.png")) << "this is not an image";
  s = LoadImage(Tmp("text.png"), &img);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("neither PNG nor JPEG"));
  s = LoadImage(Tmp("does_not_exist.png"), &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("does_not_exist.png"));
  std::ofstream(Tmp("empty.png"));
  s = LoadImage(Tmp("empty.png"), &img);
  EXPECT_THAT(s.message(), HasSubstr("empty"));
}

// A PNG that declares width x height but carries (almost) no data: a decompression bomb's header.
std::string BombPng(uint32_t width, uint32_t height, uint8_t color, uint8_t interlace) {
  auto be32 = [](std::string* out, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<char>((v >> s) & 0xff));
  };
  auto chunk = [&](std::string* out, const char* type, const std::string& data) {
    be32(out, static_cast<uint32_t>(data.size()));
    std::string body = std::string(type, 4) + data;
    out->append(body);
    be32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
  };
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  be32(&ihdr, width);
  be32(&ihdr, height);
  ihdr += std::string({8, static_cast<char>(color), 0, 0, static_cast<char>(interlace)});
  chunk(&png, "IHDR", ihdr);
  chunk(&png, "IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8));
  chunk(&png, "IEND", "");
  return png;
}

TEST(ImageIoTest, DecompressionBombIsRefusedBeforeAllocating) {
  const std::string bomb = BombPng(60000, 60000, 2, 0);
  EXPECT_LT(bomb.size(), 100u);
  RgbImage img;
  absl::Status s = DecodeImage(bomb, "bomb.png", &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("image 'bomb.png' declares 60000x60000 pixels (3600000000)"));
  EXPECT_THAT(s.message(), HasSubstr("--max-image-pixels"));
  EXPECT_LT(img.pixels.capacity(), 1000u);  // Nothing of that size was allocated.
  LabelMap mask;
  s = DecodeMask(BombPng(60000, 60000, 0, 0), "bomb_mask.png", &mask);
  EXPECT_THAT(s.message(), HasSubstr("mask 'bomb_mask.png' declares 60000x60000"));
  EXPECT_LT(mask.labels.capacity(), 1000u);
  // Interlaced: libpng's path checks the same bound.
  s = DecodeImage(BombPng(60000, 60000, 2, 1), "interlaced.png", &img);
  EXPECT_THAT(s.message(), HasSubstr("declares 60000x60000"));
  s = DecodeMask(BombPng(60000, 60000, 3, 1), "palette.png", &mask);
  EXPECT_THAT(s.message(), HasSubstr("declares 60000x60000"));
  // JPEG: a real 16x16 file whose frame header claims 60000x60000.
  std::vector<uint8_t> flat(16 * 16 * 3, 90);
  ASSERT_TRUE(WriteJpeg(Tmp("small.jpg"), 16, 16, flat.data(), 90).ok());
  std::string jpeg;
  ASSERT_TRUE(ReadFileBytes(Tmp("small.jpg"), &jpeg).ok());
  const size_t sof = jpeg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  jpeg[sof + 5] = jpeg[sof + 7] = static_cast<char>(0xEA);  // 0xEA60 = 60000
  jpeg[sof + 6] = jpeg[sof + 8] = static_cast<char>(0x60);
  s = DecodeImage(jpeg, "bomb.jpg", &img);
  EXPECT_THAT(s.message(), HasSubstr("image 'bomb.jpg' declares 60000x60000"));
  // The bound is the job's: a small image over a small limit fails the same way.
  s = DecodeImage(BombPng(16, 16, 2, 0), "small.png", &img, /*max_pixels=*/255);
  EXPECT_THAT(s.message(), HasSubstr("declares 16x16 pixels (256), more than the limit of 255"));
}

TEST(ImageIoTest, FifoAndDirectoryAreRefusedWithoutBlocking) {
  const std::string fifo = Tmp("fifo.png");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  RgbImage img;
  absl::Status s = LoadImage(fifo, &img);  // Would block forever in open() without O_NONBLOCK.
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is a FIFO, not a regular file"));
  s = LoadImage(::testing::TempDir(), &img);
  EXPECT_THAT(s.message(), HasSubstr("is a directory"));
}

TEST(ImageIoTest, PrepareMaskAppliesTheLabelMapThenTheIgnoreValue) {
  LabelMap m;
  m.labels = {0, 255, 255, 7, 0, 3};
  LabelMap mapped = m;
  PrepareMask(&mapped, MakeLabelLut({{255, 1}, {7, 255}}), 255);  // 7 -> 255 then ignored.
  EXPECT_EQ(mapped.labels, (std::vector<uint16_t>{0, 1, 1, kIgnoredPixel, 0, 3}));
  EXPECT_EQ(mapped.max_label, 3);
  EXPECT_EQ(mapped.ignored, 1);
  LabelMap none = m;
  PrepareMask(&none, {}, -1);  // No ignore value: 255 is a label.
  EXPECT_EQ(none.labels, m.labels);
  EXPECT_EQ(none.max_label, 255);
  EXPECT_EQ(none.ignored, 0);
  LabelMap zero = m;
  PrepareMask(&zero, {}, 0);
  EXPECT_EQ(zero.labels, (std::vector<uint16_t>{kIgnoredPixel, 255, 255, 7, kIgnoredPixel, 3}));
  EXPECT_EQ(zero.ignored, 2);
  EXPECT_EQ(zero.max_label, 255);
  EXPECT_EQ(DescribeLabelOutOfRange(zero.labels.data(), 2, 3, 8), "mask value 255 at (y=0, x=1) >= number of classes 8 "
            "(values are labels after --label-map; the ignore value is set by --ignore-index)");
}

TEST(ImageIoTest, OutlierBuffersAreReleased) {
  std::vector<uint8_t> big(100 << 20);
  ShrinkIfLarger(&big, kKeepBufferBytes);
  EXPECT_EQ(big.capacity(), 0u);
  std::vector<uint8_t> small(1 << 20);
  ShrinkIfLarger(&small, kKeepBufferBytes);
  EXPECT_EQ(small.capacity(), size_t{1} << 20);
}

}  // namespace
}  // namespace tally
