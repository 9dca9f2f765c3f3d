#include "common/security/sha256.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/file_util.h"
#include "common/security/data_roots.h"

namespace tally {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Compress(uint32_t h[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) | (uint32_t{block[4 * i + 2]} << 8) |
           uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = k + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

// The same compression of `blocks` consecutive 64-byte blocks with the x86 SHA extensions
// (_mm_sha256rnds2_epu32 does two rounds; sha256msg1/msg2 the message schedule): the state is
// kept as the instructions want it, ABEF and CDGH.
__attribute__((target("sha,sse4.1"))) void CompressShaNi(uint32_t h[8], const uint8_t* data, size_t blocks) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i cdab = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);
  __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; blocks > 0; --blocks, data += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[16];
    for (int i = 0; i < 16; ++i) {
      if (i < 4) {
        w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), byte_swap);
      } else {  // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16], four at a time.
        const __m128i x = _mm_add_epi32(_mm_sha256msg1_epu32(w[i - 4], w[i - 3]), _mm_alignr_epi8(w[i - 1], w[i - 2], 4));
        w[i] = _mm_sha256msg2_epu32(x, w[i - 1]);
      }
      __m128i msg = _mm_add_epi32(w[i], _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK + 4 * i)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}

// Whether this CPU has the SHA extensions (and TALLY_SHA256_PORTABLE, tests only, is unset).
bool UseShaNi() {
  static const bool use = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1)) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 29))) return false;  // CPUID.7.0:EBX.SHA
    return std::getenv("TALLY_SHA256_PORTABLE") == nullptr;
  }();
  return use;
}

thread_local bool force_portable = false;  // Sha256Portable's.

void CompressBlocks(uint32_t h[8], const uint8_t* data, size_t blocks) {
  if (!force_portable && UseShaNi()) {
    CompressShaNi(h, data, blocks);
    return;
  }
  for (size_t i = 0; i < blocks; ++i) Compress(h, data + 64 * i);
}

// Incremental SHA-256: Update with any number of pieces, then Finish.
class Hasher {
 public:
  void Update(absl::string_view data) {
    total_ += data.size();
    const auto* p = reinterpret_cast<const uint8_t*>(data.data());
    size_t n = data.size();
    if (fill_ > 0) {
      const size_t take = std::min(n, size_t{64} - fill_);
      std::memcpy(block_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ < 64) return;
      CompressBlocks(h_, block_, 1);
      fill_ = 0;
    }
    CompressBlocks(h_, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    std::memcpy(block_, p, n);
    fill_ = n;
  }
  std::array<uint8_t, 32> Finish() {
    // Padding: 0x80, zeros, then the message length in bits as a 64-bit big-endian number.
    uint8_t tail[128] = {0};
    std::memcpy(tail, block_, fill_);
    tail[fill_] = 0x80;
    const size_t tail_size = fill_ + 9 <= 64 ? 64 : 128;
    const uint64_t bits = total_ * 8;
    for (int i = 0; i < 8; ++i) tail[tail_size - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
    CompressBlocks(h_, tail, tail_size / 64);
    std::array<uint8_t, 32> out;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    }
    return out;
  }

 private:
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64] = {0};
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

std::string Hex(const std::array<uint8_t, 32>& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  Hasher h;
  h.Update(data);
  return h.Finish();
}

std::array<uint8_t, 32> Sha256Portable(absl::string_view data) {
  force_portable = true;
  const std::array<uint8_t, 32> digest = Sha256(data);
  force_portable = false;
  return digest;
}

std::string Sha256FileHex(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);  // Never blocks on a FIFO.
  if (!file.ok()) return "";
  Hasher h;
  std::string buf(1 << 20, '\0');
  while (true) {
    const ssize_t n = read(file->fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(file->fd);
      return "";
    }
    if (n == 0) break;
    h.Update(absl::string_view(buf.data(), static_cast<size_t>(n)));
  }
  close(file->fd);
  return Hex(h.Finish());
}

std::string Sha256Hex(absl::string_view data) { return Hex(Sha256(data)); }

}  // namespace tally
