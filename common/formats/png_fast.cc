#include "common/formats/png_fast.h"

#include <libdeflate.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/formats/image_formats.h"

namespace tally {
namespace {

constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct Header {
  uint32_t width = 0;
  uint32_t height = 0;
  uint8_t depth = 0;
  uint8_t color = 0;
  uint8_t interlace = 0;
};

struct DecompressorDeleter {
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};

libdeflate_decompressor* ThreadDecompressor() {
  thread_local std::unique_ptr<libdeflate_decompressor, DecompressorDeleter> d(libdeflate_alloc_decompressor());
  return d.get();
}

// Walks the chunks, checks CRCs of IHDR and IDAT, gathers the IDAT payload.
PngFastResult Parse(const std::string& bytes, Header* h, std::vector<uint8_t>* idat, std::string* error) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  if (n < 8 || std::memcmp(p, kSignature, 8) != 0) {
    *error = "not a PNG file";
    return PngFastResult::kError;
  }
  idat->clear();
  bool ihdr = false, iend = false;
  size_t off = 8;
  while (off + 12 <= n) {
    const uint32_t len = Be32(p + off);
    const uint8_t* type = p + off + 4;
    if (len > n - off - 12) {
      *error = "file is truncated";
      return PngFastResult::kError;
    }
    const uint8_t* data = type + 4;
    const bool is_ihdr = std::memcmp(type, "IHDR", 4) == 0;
    const bool is_idat = std::memcmp(type, "IDAT", 4) == 0;
    if (is_ihdr || is_idat) {
      if (libdeflate_crc32(0, type, len + 4) != Be32(data + len)) {
#ifndef TALLY_FUZZING  // The fuzz targets (tests/fuzz) let mutated chunks reach the decoder.
        *error = absl::StrCat("CRC error in the ", is_ihdr ? "IHDR" : "IDAT", " chunk (corrupt file)");
        return PngFastResult::kError;
#endif
      }
    }
    if (is_ihdr) {
      if (len != 13) {
        *error = "bad IHDR chunk";
        return PngFastResult::kError;
      }
      h->width = Be32(data);
      h->height = Be32(data + 4);
      h->depth = data[8];
      h->color = data[9];
      h->interlace = data[12];
      if (data[10] != 0 || data[11] != 0 || h->width == 0 || h->height == 0 || h->width > (1u << 24) ||
          h->height > (1u << 24)) {
        *error = "bad IHDR chunk";
        return PngFastResult::kError;
      }
      ihdr = true;
    } else if (is_idat) {
      idat->insert(idat->end(), data, data + len);
    } else if (std::memcmp(type, "IEND", 4) == 0) {
      iend = true;
      break;
    }
    off += 12 + size_t{len};
  }
  if (!ihdr) {
    *error = "no IHDR chunk";
    return PngFastResult::kError;
  }
  if (!iend) {
    *error = "file is truncated";
    return PngFastResult::kError;
  }
  return PngFastResult::kOk;
}

// Branch-free Paeth predictor (|p - a| = |b - c|, |p - b| = |a - c|, |p - c| = |a + b - 2c|).
inline uint8_t Paeth(int a, int b, int c) {
  const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
  const int bc = pb <= pc ? b : c;
  return static_cast<uint8_t>(pa <= pb && pa <= pc ? a : bc);
}

// One row's filter reversed, for pixels of kBpp bytes: `in` (the filtered bytes) into `out`, which
// may be `in` itself; `prev` is the row above, already reversed. Sub, Average and Paeth read the byte
// kBpp to the left, which was just written: the previous pixel's bytes (a) and the row above's (c)
// are carried in registers instead of read back from memory, which would chain every byte through
// a store and a load (most of a mask's decode time went there). The channels are independent chains.
template <int kBpp>
void UnfilterRow(uint8_t filter, const uint8_t* in, uint8_t* out, const uint8_t* prev, size_t rowbytes) {
  uint8_t a[kBpp], c[kBpp];
  switch (filter) {
    case 0:
      if (in != out) std::memcpy(out, in, rowbytes);
      break;
    case 1:
      for (int k = 0; k < kBpp; ++k) out[k] = a[k] = in[k];
      for (size_t i = kBpp; i < rowbytes; i += kBpp) {
        for (int k = 0; k < kBpp; ++k) out[i + k] = a[k] = static_cast<uint8_t>(in[i + k] + a[k]);
      }
      break;
    case 2:
      for (size_t i = 0; i < rowbytes; ++i) out[i] = static_cast<uint8_t>(in[i] + prev[i]);
      break;
    case 3:
      for (int k = 0; k < kBpp; ++k) out[k] = a[k] = static_cast<uint8_t>(in[k] + (prev[k] >> 1));
      for (size_t i = kBpp; i < rowbytes; i += kBpp) {
        for (int k = 0; k < kBpp; ++k) out[i + k] = a[k] = static_cast<uint8_t>(in[i + k] + ((a[k] + prev[i + k]) >> 1));
      }
      break;
    case 4:
      for (int k = 0; k < kBpp; ++k) {
        out[k] = a[k] = static_cast<uint8_t>(in[k] + prev[k]);
        c[k] = prev[k];
      }
      for (size_t i = kBpp; i < rowbytes; i += kBpp) {
        for (int k = 0; k < kBpp; ++k) {
          const uint8_t b = prev[i + k];
          out[i + k] = a[k] = static_cast<uint8_t>(in[i + k] + Paeth(a[k], b, c[k]));
          c[k] = b;
        }
      }
      break;
    default:
      break;
  }
}

// Reverses the per-row filters. `raw` holds height rows of (1 filter byte + rowbytes), and rowbytes
// is a whole number of bpp-byte pixels. The rows go to `dst` (height x rowbytes, no filter bytes)
// when given, which saves a copy of the image; else they stay in `raw`, after their filter bytes.
bool Unfilter(uint8_t* raw, uint32_t height, size_t rowbytes, int bpp, uint8_t* dst) {
  if (bpp < 1 || bpp > 4 || rowbytes % static_cast<size_t>(bpp) != 0) return false;
  std::vector<uint8_t> zero_row;
  const uint8_t* prev = nullptr;
  for (uint32_t y = 0; y < height; ++y) {
    uint8_t* row = raw + y * (rowbytes + 1);
    const uint8_t f = row[0];
    if (f > 4) return false;
    const uint8_t* in = row + 1;
    uint8_t* out = dst != nullptr ? dst + y * rowbytes : row + 1;
    if (prev == nullptr && f >= 2) {
      zero_row.assign(rowbytes, 0);
      prev = zero_row.data();
    }
    switch (bpp) {
      case 1: UnfilterRow<1>(f, in, out, prev, rowbytes); break;
      case 2: UnfilterRow<2>(f, in, out, prev, rowbytes); break;
      case 3: UnfilterRow<3>(f, in, out, prev, rowbytes); break;
      default: UnfilterRow<4>(f, in, out, prev, rowbytes); break;
    }
    prev = out;
  }
  return true;
}

// Inflates and unfilters into `raw` (each row after its filter byte), or into `dst` when given
// (Unfilter).
PngFastResult Inflate(const std::vector<uint8_t>& idat, const Header& h, size_t rowbytes, int bpp,
                      std::vector<uint8_t>* raw, uint8_t* dst, std::string* error) {
  const size_t expected = static_cast<size_t>(h.height) * (rowbytes + 1);
  raw->resize(expected);
  size_t actual = 0;
  const libdeflate_result r =
      libdeflate_zlib_decompress(ThreadDecompressor(), idat.data(), idat.size(), raw->data(), expected, &actual);
  if (r == LIBDEFLATE_SHORT_OUTPUT || (r == LIBDEFLATE_SUCCESS && actual != expected)) {
    *error = "image data is truncated";
    return PngFastResult::kError;
  }
  if (r == LIBDEFLATE_INSUFFICIENT_SPACE) {
    // More data than the header implies; libpng tolerates trailing data, so let it decide.
    return PngFastResult::kUnsupported;
  }
  if (r != LIBDEFLATE_SUCCESS) {
    *error = "corrupt image data (inflate failed)";
    return PngFastResult::kError;
  }
  if (!Unfilter(raw->data(), h.height, rowbytes, bpp, dst)) {
    *error = "bad row filter type (corrupt file)";
    return PngFastResult::kError;
  }
  return PngFastResult::kOk;
}

// The header's size against the caller's bound, before anything of that size is allocated.
bool TooLarge(const Header& h, int64_t max_pixels, int* height, int* width) {
  if (static_cast<int64_t>(h.width) * h.height <= max_pixels) return false;
  *height = static_cast<int>(h.height);
  *width = static_cast<int>(h.width);
  return true;
}

// Gives the thread's scratch buffers back to the allocator when an outlier image grew them.
void ReleaseScratch(std::vector<uint8_t>* idat, std::vector<uint8_t>* raw) {
  ShrinkIfLarger(idat, kKeepBufferBytes);
  ShrinkIfLarger(raw, kKeepBufferBytes);
}

}  // namespace

PngFastResult DecodePngRgbFast(const std::string& bytes, int64_t max_pixels, int* height, int* width,
                               std::vector<uint8_t>* rgb, std::string* error) {
  Header h;
  thread_local std::vector<uint8_t> idat, raw;
  absl::Cleanup release = [] { ReleaseScratch(&idat, &raw); };
  PngFastResult r = Parse(bytes, &h, &idat, error);
  if (r != PngFastResult::kOk) return r;
  if (TooLarge(h, max_pixels, height, width)) return PngFastResult::kTooLarge;
  int channels = 0;
  switch (h.color) {
    case 0: channels = 1; break;
    case 2: channels = 3; break;
    case 4: channels = 2; break;
    case 6: channels = 4; break;
    default: return PngFastResult::kUnsupported;  // Palette: libpng.
  }
  if (h.depth != 8 || h.interlace != 0) return PngFastResult::kUnsupported;
  const size_t rowbytes = static_cast<size_t>(h.width) * channels;
  rgb->resize(static_cast<size_t>(h.height) * h.width * 3);
  // RGB rows are unfiltered straight into the image; the other layouts are converted after.
  r = Inflate(idat, h, rowbytes, channels, &raw, channels == 3 ? rgb->data() : nullptr, error);
  if (r != PngFastResult::kOk) return r;
  *height = static_cast<int>(h.height);
  *width = static_cast<int>(h.width);
  for (uint32_t y = 0; y < h.height && channels != 3; ++y) {
    const uint8_t* src = raw.data() + y * (rowbytes + 1) + 1;
    uint8_t* dst = rgb->data() + static_cast<size_t>(y) * h.width * 3;
    for (uint32_t x = 0; x < h.width; ++x) {
      if (channels == 4) {
        dst[3 * x] = src[4 * x];
        dst[3 * x + 1] = src[4 * x + 1];
        dst[3 * x + 2] = src[4 * x + 2];
      } else {
        const uint8_t g = src[channels * x];
        dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = g;
      }
    }
  }
  return PngFastResult::kOk;
}

PngFastResult DecodePngLabelsFast(const std::string& bytes, int64_t max_pixels, int* height, int* width,
                                  std::vector<uint16_t>* labels, std::string* error) {
  Header h;
  thread_local std::vector<uint8_t> idat, raw;
  absl::Cleanup release = [] { ReleaseScratch(&idat, &raw); };
  PngFastResult r = Parse(bytes, &h, &idat, error);
  if (r != PngFastResult::kOk) return r;
  if (TooLarge(h, max_pixels, height, width)) return PngFastResult::kTooLarge;
  const bool gray = h.color == 0 && (h.depth == 8 || h.depth == 16);
  const bool palette = h.color == 3 && h.depth == 8;
  if (!(gray || palette) || h.interlace != 0) return PngFastResult::kUnsupported;
  const int bpp = h.depth / 8;
  const size_t rowbytes = static_cast<size_t>(h.width) * bpp;
  r = Inflate(idat, h, rowbytes, bpp, &raw, nullptr, error);
  if (r != PngFastResult::kOk) return r;
  *height = static_cast<int>(h.height);
  *width = static_cast<int>(h.width);
  labels->resize(static_cast<size_t>(h.height) * h.width);
  for (uint32_t y = 0; y < h.height; ++y) {
    const uint8_t* src = raw.data() + y * (rowbytes + 1) + 1;
    uint16_t* dst = labels->data() + static_cast<size_t>(y) * h.width;
    if (bpp == 1) {
      for (uint32_t x = 0; x < h.width; ++x) dst[x] = src[x];
    } else {
      for (uint32_t x = 0; x < h.width; ++x) dst[x] = static_cast<uint16_t>((src[2 * x] << 8) | src[2 * x + 1]);
    }
  }
  return PngFastResult::kOk;
}

}  // namespace tally
