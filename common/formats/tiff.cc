// TIFF through libtiff (common/formats/tiff.h): one page, read strip by strip or tile by tile
// straight into the output, so no full-size intermediate is ever held.
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/tiff.h"

namespace tally {
namespace {

// libtiff reads the bytes in memory through these (mapped: strips are read in place).
struct MemFile {
  const std::string* bytes = nullptr;
  uint64_t pos = 0;
};
tmsize_t ReadProc(thandle_t h, void* buf, tmsize_t n) {
  auto* f = static_cast<MemFile*>(h);
  const uint64_t size = f->bytes->size();
  if (n <= 0 || f->pos >= size) return 0;
  const uint64_t take = std::min<uint64_t>(static_cast<uint64_t>(n), size - f->pos);
  std::memcpy(buf, f->bytes->data() + f->pos, take);
  f->pos += take;
  return static_cast<tmsize_t>(take);
}
tmsize_t WriteProc(thandle_t, void*, tmsize_t) { return 0; }
toff_t SeekProc(thandle_t h, toff_t off, int whence) {
  auto* f = static_cast<MemFile*>(h);
  const uint64_t size = f->bytes->size();
  uint64_t base = whence == SEEK_CUR ? f->pos : whence == SEEK_END ? size : 0;
  if (off > UINT64_MAX - base) return static_cast<toff_t>(-1);
  f->pos = base + off;
  return f->pos;
}
int CloseProc(thandle_t) { return 0; }
toff_t SizeProc(thandle_t h) { return static_cast<MemFile*>(h)->bytes->size(); }
int MapProc(thandle_t h, void** base, toff_t* size) {
  auto* f = static_cast<MemFile*>(h);
  *base = const_cast<char*>(f->bytes->data());
  *size = f->bytes->size();
  return 1;
}
void UnmapProc(thandle_t, void*, toff_t) {}

// The first error libtiff reports for this file (warnings are ignored: the pixels decide).
int OnError(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* first = static_cast<std::string*>(user);
  if (first->empty()) {
    char text[512];
    std::vsnprintf(text, sizeof(text), fmt, ap);
    *first = module != nullptr && *module ? absl::StrCat(module, ": ", text) : std::string(text);
  }
  return 1;
}
int OnWarning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// One page's layout, as read from its tags.
struct Page {
  uint32_t width = 0, height = 0;
  uint16_t spp = 1, bps = 1, format = SAMPLEFORMAT_UINT, photometric = PHOTOMETRIC_MINISBLACK;
  uint16_t planar = PLANARCONFIG_CONTIG, compression = COMPRESSION_NONE;
  bool tiled = false;
  uint32_t tile_width = 0, tile_height = 0, rows_per_strip = 0;
  uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;  // Palette.
};

class Tiff {
 public:
  Tiff(const std::string& bytes, std::string name) : name_(std::move(name)) { file_.bytes = &bytes; }
  ~Tiff() {
    if (tif_ != nullptr) TIFFClose(tif_);
  }
  // `single_page_any`: a file of one page gives it for any `page` (a mask beside a paged image).
  absl::Status Open(int page, const char* what, bool single_page_any = false);
  const Page& page() const { return page_; }
  TIFF* get() { return tif_; }
  absl::Status Error(const std::string& what, const std::string& text) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name_, "' ", text, error_.empty() ? "" : ": " + error_));
  }
  absl::Status CheckSize(const char* what, int64_t max_pixels) const;
  // Calls `fn(plane, y0, x0, rows, cols, data, row_bytes)` for every strip or tile in order.
  using BlockFn = std::function<void(int, uint32_t, uint32_t, uint32_t, uint32_t, const uint8_t*, size_t)>;
  absl::Status ForEachBlock(const char* what, const BlockFn& fn);

 private:
  std::string name_;
  MemFile file_;
  std::string error_;
  TIFF* tif_ = nullptr;
  Page page_;
};

absl::Status Tiff::Open(int page, const char* what, bool single_page_any) {
  TIFFOpenOptions* opts = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetErrorHandlerExtR(opts, OnError, &error_);
  TIFFOpenOptionsSetWarningHandlerExtR(opts, OnWarning, nullptr);
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts, tmsize_t{1} << 30);  // Our own checks come first; a backstop.
  tif_ = TIFFClientOpenExt(name_.c_str(), "r", &file_, ReadProc, WriteProc, SeekProc, CloseProc, SizeProc, MapProc,
                           UnmapProc, opts);
  TIFFOpenOptionsFree(opts);
  if (tif_ == nullptr) return Error(what, "is not a valid TIFF");
  if (page > 0 && single_page_any && TIFFNumberOfDirectories(tif_) == 1) page = 0;
  if (page < 0 || (page > 0 && !TIFFSetDirectory(tif_, static_cast<tdir_t>(page)))) {
    error_.clear();
    return Error(what, absl::StrCat("has no page ", page, " (pages count from 0; the 'page' column)"));
  }
  Page& p = page_;
  if (!TIFFGetField(tif_, TIFFTAG_IMAGEWIDTH, &p.width) || !TIFFGetField(tif_, TIFFTAG_IMAGELENGTH, &p.height)) {
    return Error(what, "has no image size");
  }
  TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &p.spp);
  TIFFGetFieldDefaulted(tif_, TIFFTAG_BITSPERSAMPLE, &p.bps);
  TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLEFORMAT, &p.format);
  TIFFGetFieldDefaulted(tif_, TIFFTAG_PLANARCONFIG, &p.planar);
  TIFFGetFieldDefaulted(tif_, TIFFTAG_COMPRESSION, &p.compression);
  if (!TIFFGetField(tif_, TIFFTAG_PHOTOMETRIC, &p.photometric)) {
    p.photometric = p.spp >= 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK;
  }
  p.tiled = TIFFIsTiled(tif_) != 0;
  if (p.tiled) {
    TIFFGetField(tif_, TIFFTAG_TILEWIDTH, &p.tile_width);
    TIFFGetField(tif_, TIFFTAG_TILELENGTH, &p.tile_height);
  } else {
    TIFFGetFieldDefaulted(tif_, TIFFTAG_ROWSPERSTRIP, &p.rows_per_strip);
  }
  if (p.photometric == PHOTOMETRIC_PALETTE && !TIFFGetField(tif_, TIFFTAG_COLORMAP, &p.red, &p.green, &p.blue)) {
    return Error(what, "is a palette TIFF without a colour map");
  }
  if (p.format != SAMPLEFORMAT_UINT && p.format != SAMPLEFORMAT_VOID) {
    const char* kind = p.format == SAMPLEFORMAT_INT ? "signed integer" : p.format == SAMPLEFORMAT_IEEEFP ? "floating point"
                                                                                                    : "complex";
    return Error(what, absl::StrCat("has ", p.bps, "-bit ", kind, " samples: Tally reads 1-, 8- and 16-bit unsigned "
                                    "integer TIFF"));
  }
  if ((p.bps != 1 && p.bps != 8 && p.bps != 16) || (p.bps == 1 && p.spp != 1) || p.spp < 1 || p.spp > 4) {
    return Error(what, absl::StrCat("has ", p.spp, " samples of ", p.bps, " bits a pixel: Tally reads 1, 2, 3 or 4 "
                                    "samples of 8 or 16 bits (or one of 1 bit)"));
  }
  if (p.tiled && (p.tile_width == 0 || p.tile_height == 0)) return Error(what, "has tiles of size 0");
  return absl::OkStatus();
}

absl::Status Tiff::CheckSize(const char* what, int64_t max_pixels) const {
  const Page& p = page_;
  if (p.width == 0 || p.height == 0 || p.width > (1u << 30) || p.height > (1u << 30)) {
    return Error(what, absl::StrCat("has a size of ", p.height, "x", p.width));
  }
  if (static_cast<int64_t>(p.width) * p.height > max_pixels) {
    return absl::InvalidArgumentError(TooManyPixels(what, name_, p.height, p.width, max_pixels));
  }
  // A tile may hold at most 4x the image's pixels (or 4x 256x256): a larger one is a memory bomb.
  const int64_t bound = 4 * std::max<int64_t>(int64_t{p.width} * p.height, 256 * 256);
  if (p.tiled && int64_t{p.tile_width} * p.tile_height > bound) {
    return Error(what, absl::StrCat("has tiles of ", p.tile_height, "x", p.tile_width, ", larger than the image (",
                                    p.height, "x", p.width, ") can need"));
  }
  return absl::OkStatus();
}

absl::Status Tiff::ForEachBlock(const char* what, const BlockFn& fn) {
  const Page& p = page_;
  const int planes = p.planar == PLANARCONFIG_SEPARATE ? p.spp : 1;
  std::vector<uint8_t> buf;
  if (p.tiled) {
    buf.resize(static_cast<size_t>(TIFFTileSize64(tif_)));
    const size_t row_bytes = static_cast<size_t>(TIFFTileRowSize64(tif_));
    for (int s = 0; s < planes; ++s) {
      for (uint32_t y = 0; y < p.height; y += p.tile_height) {
        for (uint32_t x = 0; x < p.width; x += p.tile_width) {
          const ttile_t tile = TIFFComputeTile(tif_, x, y, 0, static_cast<uint16_t>(s));
          if (buf.empty() || TIFFReadEncodedTile(tif_, tile, buf.data(), static_cast<tmsize_t>(buf.size())) < 0) {
            return Error(what, absl::StrCat("has a tile that cannot be decoded (at y=", y, ", x=", x, ")"));
          }
          fn(s, y, x, std::min(p.tile_height, p.height - y), std::min(p.tile_width, p.width - x), buf.data(),
             row_bytes);
        }
      }
    }
    return absl::OkStatus();
  }
  const uint32_t rps = std::max<uint32_t>(1, std::min(p.rows_per_strip, p.height));
  buf.resize(static_cast<size_t>(TIFFStripSize64(tif_)));
  const size_t row_bytes = static_cast<size_t>(TIFFScanlineSize64(tif_));
  for (int s = 0; s < planes; ++s) {
    for (uint32_t y = 0; y < p.height; y += rps) {
      const tstrip_t strip = TIFFComputeStrip(tif_, y, static_cast<uint16_t>(s));
      const uint32_t rows = std::min(rps, p.height - y);
      const tmsize_t got = buf.empty() ? -1 : TIFFReadEncodedStrip(tif_, strip, buf.data(), static_cast<tmsize_t>(buf.size()));
      if (got < static_cast<tmsize_t>(row_bytes * rows)) {
        return Error(what, absl::StrCat("has a strip that cannot be decoded (rows from y=", y, ")"));
      }
      fn(s, y, 0, rows, p.width, buf.data(), row_bytes);
    }
  }
  return absl::OkStatus();
}

// Sample k of pixel i in a row of `spp`-sample pixels of `bps` bits (16-bit: native order).
inline uint32_t Sample(const uint8_t* row, uint32_t i, int k, int spp, int bps) {
  const size_t at = static_cast<size_t>(i) * spp + k;
  if (bps == 8) return row[at];
  if (bps == 16) {
    uint16_t v;
    std::memcpy(&v, row + 2 * at, 2);
    return v;
  }
  return (row[at >> 3] >> (7 - (at & 7))) & 1u;
}

}  // namespace

absl::Status TiffDimensions(const std::string& bytes, const std::string& name, int page, int* height, int* width) {
  Tiff t(bytes, name);
  absl::Status s = t.Open(page, "image");
  if (!s.ok()) return s;
  *height = static_cast<int>(std::min<uint32_t>(t.page().height, 1u << 30));
  *width = static_cast<int>(std::min<uint32_t>(t.page().width, 1u << 30));
  return absl::OkStatus();
}

absl::Status DecodeTiffImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                             int64_t max_pixels, RgbImage* out) {
  Tiff t(bytes, name);
  absl::Status s = t.Open(options.page, "image");
  if (s.ok()) s = t.CheckSize("image", max_pixels);
  if (!s.ok()) return s;
  const Page& p = t.page();
  const uint16_t photo = p.photometric;
  if (photo == PHOTOMETRIC_YCBCR && (p.compression == COMPRESSION_JPEG || p.compression == COMPRESSION_OJPEG)) {
    TIFFSetField(t.get(), TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);  // libjpeg converts to RGB.
  } else if (photo != PHOTOMETRIC_MINISBLACK && photo != PHOTOMETRIC_MINISWHITE && photo != PHOTOMETRIC_RGB &&
             photo != PHOTOMETRIC_PALETTE) {
    return t.Error("image", absl::StrCat("has photometric interpretation ", photo,
                                         ": Tally reads grey, RGB, palette and JPEG-compressed YCbCr TIFF"));
  }
  const bool colour = photo == PHOTOMETRIC_RGB || photo == PHOTOMETRIC_YCBCR;
  if (colour && p.spp < 3) return t.Error("image", absl::StrCat("is RGB with ", p.spp, " samples a pixel"));
  const int bps = p.bps;
  const bool invert = photo == PHOTOMETRIC_MINISWHITE;
  const Window window = options.window;
  // One sample to a byte: 16-bit by the window or its high byte; 1-bit to 0 or 255.
  auto byte = [bps, invert, window](uint32_t v) -> uint8_t {
    if (bps == 1) return (v != 0) != invert ? 255 : 0;
    if (bps == 8) return static_cast<uint8_t>(invert ? 255 - v : v);
    const uint32_t w = invert ? 65535 - v : v;
    return window.given() ? ApplyWindow(w, window) : static_cast<uint8_t>(w >> 8);
  };
  out->height = static_cast<int>(p.height);
  out->width = static_cast<int>(p.width);
  out->windowed = bps == 16 && window.given();
  out->pixels.assign(static_cast<size_t>(p.height) * p.width * 3, 0);
  uint8_t* dst = out->pixels.data();
  const uint32_t width = p.width;
  const bool planar = p.planar == PLANARCONFIG_SEPARATE && p.spp > 1;
  return t.ForEachBlock("image", [&](int plane, uint32_t y0, uint32_t x0, uint32_t rows, uint32_t cols,
                                     const uint8_t* data, size_t row_bytes) {
    const int spp = planar ? 1 : p.spp;
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* row = data + r * row_bytes;
      uint8_t* o = dst + (static_cast<size_t>(y0 + r) * width + x0) * 3;
      for (uint32_t i = 0; i < cols; ++i, o += 3) {
        if (planar) {  // One sample a plane: RGB's first three go to their channel, grey's first to all.
          if (colour && plane < 3) o[plane] = byte(Sample(row, i, 0, 1, bps));
          if (!colour && plane == 0) o[0] = o[1] = o[2] = byte(Sample(row, i, 0, 1, bps));
        } else if (photo == PHOTOMETRIC_PALETTE) {
          const uint32_t v = Sample(row, i, 0, spp, bps);
          o[0] = static_cast<uint8_t>(p.red[v] >> 8);
          o[1] = static_cast<uint8_t>(p.green[v] >> 8);
          o[2] = static_cast<uint8_t>(p.blue[v] >> 8);
        } else if (colour) {
          for (int k = 0; k < 3; ++k) o[k] = byte(Sample(row, i, k, spp, bps));
        } else {
          o[0] = o[1] = o[2] = byte(Sample(row, i, 0, spp, bps));
        }
      }
    }
  });
}

absl::StatusOr<bool> DecodeTiffRaw(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                                   RawImage* out) {
  Tiff t(bytes, name);
  absl::Status s = t.Open(page, "image");
  if (s.ok()) s = t.CheckSize("image", max_pixels);
  if (!s.ok()) return s;
  const Page& p = t.page();
  const uint16_t photo = p.photometric;
  if (p.bps != 16 || (photo != PHOTOMETRIC_MINISBLACK && photo != PHOTOMETRIC_MINISWHITE && photo != PHOTOMETRIC_RGB)) {
    return false;
  }
  const bool colour = photo == PHOTOMETRIC_RGB;
  if (colour && p.spp < 3) return t.Error("image", absl::StrCat("is RGB with ", p.spp, " samples a pixel"));
  const int channels = colour ? 3 : 1;
  out->dtype = "uint16";
  out->height = static_cast<int>(p.height);
  out->width = static_cast<int>(p.width);
  out->channels = channels;
  out->header = {{"photometric", colour ? "rgb" : photo == PHOTOMETRIC_MINISWHITE ? "min-is-white" : "min-is-black"},
                 {"bits_per_sample", "16"}};
  out->data.assign(static_cast<size_t>(p.height) * p.width * channels * 2, 0);
  auto* dst = reinterpret_cast<uint16_t*>(out->data.data());
  const uint32_t width = p.width;
  const bool planar = p.planar == PLANARCONFIG_SEPARATE && p.spp > 1;
  s = t.ForEachBlock("image", [&](int plane, uint32_t y0, uint32_t x0, uint32_t rows, uint32_t cols,
                                  const uint8_t* data, size_t row_bytes) {
    const int spp = planar ? 1 : p.spp;
    if (planar && plane >= channels) return;
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* row = data + r * row_bytes;
      uint16_t* o = dst + (static_cast<size_t>(y0 + r) * width + x0) * channels;
      for (uint32_t i = 0; i < cols; ++i, o += channels) {
        if (planar) {
          o[plane] = static_cast<uint16_t>(Sample(row, i, 0, 1, 16));
        } else {
          for (int k = 0; k < channels; ++k) o[k] = static_cast<uint16_t>(Sample(row, i, k, spp, 16));
        }
      }
    }
  });
  if (!s.ok()) return s;
  return true;
}

absl::Status DecodeTiffMask(const std::string& bytes, const std::string& name, int page, int64_t max_pixels,
                            LabelMap* out) {
  Tiff t(bytes, name);
  absl::Status s = t.Open(page, "mask", /*single_page_any=*/true);
  if (s.ok()) s = t.CheckSize("mask", max_pixels);
  if (!s.ok()) return s;
  const Page& p = t.page();
  switch (p.compression) {
    case COMPRESSION_NONE: case COMPRESSION_LZW: case COMPRESSION_ADOBE_DEFLATE: case COMPRESSION_DEFLATE:
    case COMPRESSION_PACKBITS: case COMPRESSION_ZSTD: case COMPRESSION_LZMA: case COMPRESSION_CCITTRLE:
    case COMPRESSION_CCITTFAX3: case COMPRESSION_CCITTFAX4:
      break;
    default:
      return t.Error("mask", absl::StrCat("is compressed with ",
                                          p.compression == COMPRESSION_JPEG || p.compression == COMPRESSION_OJPEG
                                              ? std::string("JPEG, which is lossy and would corrupt class indices")
                                              : absl::StrCat("scheme ", p.compression, ", not a lossless one Tally knows"),
                                          "; masks must be losslessly compressed"));
  }
  if (p.spp != 1 || (p.photometric != PHOTOMETRIC_MINISBLACK && p.photometric != PHOTOMETRIC_PALETTE)) {
    return t.Error("mask", absl::StrCat("has ", p.spp, " samples a pixel (photometric ", p.photometric,
                                        "); masks must be single-channel min-is-black or palette TIFFs of class indices"));
  }
  out->height = static_cast<int>(p.height);
  out->width = static_cast<int>(p.width);
  out->depth = 1;
  out->labels.assign(static_cast<size_t>(p.height) * p.width, 0);
  uint16_t* dst = out->labels.data();
  const uint32_t width = p.width;
  const int bps = p.bps;
  return t.ForEachBlock("mask", [&](int, uint32_t y0, uint32_t x0, uint32_t rows, uint32_t cols, const uint8_t* data,
                                    size_t row_bytes) {
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* row = data + r * row_bytes;
      uint16_t* o = dst + static_cast<size_t>(y0 + r) * width + x0;
      for (uint32_t i = 0; i < cols; ++i) o[i] = static_cast<uint16_t>(Sample(row, i, 0, 1, bps));
    }
  });
}

const ImageDecoder& TiffDecoder() {
  static const ImageDecoder decoder{ImageFormat::kTiff, TiffDimensions, DecodeTiffImage, DecodeTiffMask, "",
                                    DecodeTiffRaw};
  return decoder;
}

}  // namespace tally
