#include "common/formats/decode.h"

#include <sys/stat.h>
#include <webp/encode.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/sources/row_files.h"
#include "common/formats/png.h"
#include "common/formats/jpeg.h"

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

// A colour WebP mask large enough that its decode buffer (2400 x 2400 x 3 bytes, past the 16 MiB a
// buffer keeps) is released on the way out: the error still names the first colour pixel and its
// values (the message once read them from the released buffer: a fuzz finding under ASan).
TEST(ImageIoTest, LargeColourWebpMaskNamesItsFirstColourPixel) {
  const int h = 2400, w = 2400;
  std::vector<uint8_t> rgb(static_cast<size_t>(3) * h * w, 7);  // Grey: class 7.
  const size_t at = 3 * (static_cast<size_t>(1000) * w + 5);
  rgb[at] = 10, rgb[at + 1] = 20, rgb[at + 2] = 30;
  uint8_t* encoded = nullptr;
  const size_t n = WebPEncodeLosslessRGB(rgb.data(), w, h, 3 * w, &encoded);
  ASSERT_GT(n, 0u);
  const std::string bytes(reinterpret_cast<const char*>(encoded), n);
  WebPFree(encoded);
  LabelMap mask;
  const absl::Status s = DecodeMask(bytes, "big.webp", &mask);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("mask 'big.webp' is a colour WebP (pixel (y=1000, x=5) is 10,20,30)"));
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

// What a GPU decoder is handed (worker/pipeline/gpu_jpeg.h): the JPEG's declared size, or DecodeImage's own
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
  EXPECT_THAT(s.message(), HasSubstr("is not an image Tally reads (unrecognised file signature; PNG, JPEG, TIFF, WebP or DICOM)"));
  s = LoadImage(Tmp("does_not_exist.png"), &img);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("does_not_exist.png"));
  std::ofstream(Tmp("empty.png"));
  s = LoadImage(Tmp("empty.png"), &img);
  EXPECT_THAT(s.message(), HasSubstr("empty"));
}

void AppendBe32(std::string* out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<char>((v >> s) & 0xff));
}

void AppendChunk(std::string* out, const char* type, const std::string& data) {
  AppendBe32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out->append(body);
  AppendBe32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
}

std::string PngHeader(uint32_t width, uint32_t height, uint8_t depth, uint8_t color, uint8_t interlace) {
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  AppendBe32(&ihdr, width);
  AppendBe32(&ihdr, height);
  ihdr += std::string({static_cast<char>(depth), static_cast<char>(color), 0, 0, static_cast<char>(interlace)});
  AppendChunk(&png, "IHDR", ihdr);
  return png;
}

// A PNG that declares width x height but carries (almost) no data: a decompression bomb's header.
std::string BombPng(uint32_t width, uint32_t height, uint8_t color, uint8_t interlace) {
  std::string png = PngHeader(width, height, 8, color, interlace);
  AppendChunk(&png, "IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8));
  AppendChunk(&png, "IEND", "");
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

// PNG's forward filter of one byte (ISO 15948 9.2): x is the byte, a the one bpp to the left, b
// the one above, c the one above a. The Paeth predictor as the standard writes it.
uint8_t FilterByte(int type, int x, int a, int b, int c) {
  switch (type) {
    case 1: return static_cast<uint8_t>(x - a);
    case 2: return static_cast<uint8_t>(x - b);
    case 3: return static_cast<uint8_t>(x - (a + b) / 2);
    case 4: {
      const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
      const int pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      return static_cast<uint8_t>(x - pred);
    }
    default: return static_cast<uint8_t>(x);
  }
}

// A PNG of `pixels` (height rows of width * bpp bytes) with row filter (y * 7 + seed) % 5 on row y,
// so that every filter type follows every other; a 256-entry palette for colour type 3.
std::string FilteredPng(uint32_t width, uint32_t height, uint8_t depth, uint8_t color, int bpp,
                        const std::vector<uint8_t>& pixels, int seed) {
  const size_t rowbytes = static_cast<size_t>(width) * bpp;
  std::string filtered;
  for (uint32_t y = 0; y < height; ++y) {
    const int type = static_cast<int>((y * 7 + static_cast<uint32_t>(seed)) % 5);
    filtered.push_back(static_cast<char>(type));
    const uint8_t* row = pixels.data() + y * rowbytes;
    const uint8_t* up = y > 0 ? row - rowbytes : nullptr;
    for (size_t i = 0; i < rowbytes; ++i) {
      const int a = i >= static_cast<size_t>(bpp) ? row[i - bpp] : 0;
      const int b = up ? up[i] : 0;
      const int c = up && i >= static_cast<size_t>(bpp) ? up[i - bpp] : 0;
      filtered.push_back(static_cast<char>(FilterByte(type, row[i], a, b, c)));
    }
  }
  uLongf size = compressBound(filtered.size());
  std::string z(size, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(filtered.data()),
                      filtered.size(), 6),
            Z_OK);
  z.resize(size);
  std::string png = PngHeader(width, height, depth, color, 0);
  if (color == 3) {
    std::string palette;
    for (int i = 0; i < 256; ++i) palette += std::string({static_cast<char>(i), static_cast<char>(255 - i), 0});
    AppendChunk(&png, "PLTE", palette);
  }
  AppendChunk(&png, "IDAT", z);
  AppendChunk(&png, "IEND", "");
  return png;
}

// The fast PNG path (common/formats/png_fast.cc) reverses every row filter for every pixel size it takes
// (1 to 4 bytes): random pixels written with all five filters, in every order, come back exactly.
// Smooth pixels too, where the filters' predictions are right and the residuals small.
TEST(ImageIoTest, FastPngPathReversesEveryFilterExactly) {
  std::mt19937 rng(7);
  struct Kind {
    uint8_t depth, color;
    int bpp;
    bool labels;
  };
  const Kind kinds[] = {{8, 0, 1, false}, {8, 4, 2, false}, {8, 2, 3, false}, {8, 6, 4, false},
                        {8, 0, 1, true},  {16, 0, 2, true}, {8, 3, 1, true}};
  for (const Kind& kind : kinds) {
    for (const auto& [width, height] : std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 9}, {7, 5}, {64, 33}, {131, 20}}) {
      for (int smooth = 0; smooth < 2; ++smooth) {
        std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * kind.bpp);
        for (size_t i = 0; i < pixels.size(); ++i) {
          pixels[i] = smooth ? static_cast<uint8_t>((i / kind.bpp) % width + (i / kind.bpp) / width + 3 * (i % kind.bpp))
                             : static_cast<uint8_t>(rng());
        }
        for (int seed = 0; seed < 5; ++seed) {
          const std::string png = FilteredPng(width, height, kind.depth, kind.color, kind.bpp, pixels, seed);
          const std::string what = absl::StrCat("depth ", kind.depth, " colour ", kind.color, " ", width, "x", height,
                                                smooth ? " smooth" : " random", " seed ", seed);
          if (kind.labels) {
            LabelMap mask;
            ASSERT_TRUE(DecodeMask(png, "m.png", &mask, kDefaultMaxImagePixels).ok()) << what;
            ASSERT_EQ(mask.labels.size(), static_cast<size_t>(width) * height) << what;
            int expected_max = -1;
            for (size_t p = 0; p < mask.labels.size(); ++p) {
              const uint16_t v = kind.bpp == 2 ? static_cast<uint16_t>(pixels[2 * p] << 8 | pixels[2 * p + 1]) : pixels[p];
              ASSERT_EQ(mask.labels[p], v) << what << " pixel " << p;
              if (v != kIgnoreLabel) expected_max = std::max<int>(expected_max, v);
            }
            EXPECT_EQ(mask.max_label, expected_max) << what;
          } else {
            RgbImage img;
            ASSERT_TRUE(DecodeImage(png, "i.png", &img, kDefaultMaxImagePixels).ok()) << what;
            ASSERT_EQ(img.pixels.size(), static_cast<size_t>(width) * height * 3) << what;
            for (size_t p = 0; p < static_cast<size_t>(width) * height; ++p) {
              const uint8_t* src = pixels.data() + p * kind.bpp;
              for (int ch = 0; ch < 3; ++ch) {
                ASSERT_EQ(img.pixels[3 * p + ch], kind.bpp >= 3 ? src[ch] : src[0]) << what << " pixel " << p;
              }
            }
          }
        }
      }
    }
  }
}

// max_label ignores 255 and is -1 when nothing else is there, whatever the map's length (the
// scans work in blocks of 64); PrepareMask's max_label, ignored count and rewritten pixels equal a
// plain loop's, with and without a label map and for every kind of ignore value.
TEST(ImageIoTest, MaskScansAgreeWithAPlainLoopAtEveryLength) {
  std::mt19937 rng(11);
  for (const uint32_t width : {1u, 63u, 64u, 65u, 200u}) {
    std::vector<uint8_t> pixels(width * 3, 255);
    LabelMap mask;
    ASSERT_TRUE(DecodeMask(FilteredPng(width, 3, 8, 0, 1, pixels, 0), "m.png", &mask, kDefaultMaxImagePixels).ok());
    EXPECT_EQ(mask.max_label, -1) << width;
    pixels[pixels.size() - 1] = 254;  // The last pixel: the scan's tail.
    pixels[0] = 7;
    ASSERT_TRUE(DecodeMask(FilteredPng(width, 3, 8, 0, 1, pixels, 0), "m.png", &mask, kDefaultMaxImagePixels).ok());
    EXPECT_EQ(mask.max_label, 254) << width;

    for (const int ignore_index : {-1, 0, 3, 255, 65535}) {
      for (const bool mapped : {false, true}) {
        const std::vector<uint16_t> lut = mapped ? MakeLabelLut({{3, 9}, {9, 3}, {65535, 1}}) : std::vector<uint16_t>();
        LabelMap m;
        for (uint32_t i = 0; i < width * 3; ++i) {
          const uint32_t r = rng() % 8;
          m.labels.push_back(static_cast<uint16_t>(r < 5 ? r : r == 5 ? 9 : r == 6 ? 255 : 65535));
        }
        std::vector<uint16_t> expected = m.labels;
        int expected_max = -1;
        int64_t expected_ignored = 0;
        for (uint16_t& v : expected) {
          if (!lut.empty()) v = lut[v];
          if (static_cast<int>(v) == ignore_index) {
            v = kIgnoredPixel;
            ++expected_ignored;
          } else {
            expected_max = std::max<int>(expected_max, v);
          }
        }
        PrepareMask(&m, lut, ignore_index);
        const std::string what = absl::StrCat(width, " x 3, ignore ", ignore_index, mapped ? ", mapped" : "");
        EXPECT_EQ(m.labels, expected) << what;
        EXPECT_EQ(m.max_label, expected_max) << what;
        EXPECT_EQ(m.ignored, expected_ignored) << what;
      }
    }
  }
}


// A DICOM file by hand: preamble, "DICM", the meta group's transfer syntax (explicit VR little
// endian), then `body` (elements in that syntax).
std::string DicomFile(const std::string& body) {
  std::string f(128, '\0');
  f += "DICM";
  const std::string uid = std::string("1.2.840.10008.1.2.1") + '\0';  // Even length.
  f += std::string("\x02\x00\x10\x00UI", 6);
  f.push_back(static_cast<char>(uid.size()));
  f.push_back('\0');
  f += uid;
  return f + body;
}
// An undefined-length sequence (tag 0008,1115 SQ) holding one undefined-length item, `depth` deep.
std::string NestedSequences(int depth) {
  const std::string open_sq("\x08\x00\x15\x11SQ\x00\x00\xff\xff\xff\xff", 12);
  const std::string open_item("\xfe\xff\x00\xe0\xff\xff\xff\xff", 8);
  const std::string close_item("\xfe\xff\x0d\xe0\x00\x00\x00\x00", 8);
  const std::string close_sq("\xfe\xff\xdd\xe0\x00\x00\x00\x00", 8);
  std::string out;
  for (int i = 0; i < depth; ++i) out += open_sq + open_item;
  for (int i = 0; i < depth; ++i) out += close_item + close_sq;
  return out;
}

TEST(DicomLimitsTest, DeepNestingIsRefusedBeforeDcmtkParsesIt) {
  // 10 000 nested sequences (240 KB) overflowed a worker's stack inside DCMTK; the walk refuses them.
  RgbImage image;
  absl::Status s = DecodeImage(DicomFile(NestedSequences(10000)), "deep.dcm", &image);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'deep.dcm' is a DICOM file whose sequences nest more than 64 deep"));
  // Within the limit the walk lets it through (DCMTK then finds no pixel data).
  s = DecodeImage(DicomFile(NestedSequences(20)), "shallow.dcm", &image);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("without pixel data"));
}
}  // namespace
}  // namespace tally
