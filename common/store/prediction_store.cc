#include "common/store/prediction_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/security/sha256.h"
#include "libdeflate.h"
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tally {
namespace {

constexpr char kMagic[8] = {'T', 'A', 'L', 'L', 'Y', 'P', 'S', '3'};
constexpr char kMagicV2[8] = {'T', 'A', 'L', 'L', 'Y', 'P', 'S', '2'};  // 2D, no scores: still read.
constexpr size_t kHeaderBytes = 104;
constexpr size_t kHeaderBytesV2 = 96;
// The largest label map an entry may hold: the decoders' own pixel limit's order (2^28 pixels).
constexpr int64_t kMaxPixels = int64_t{1} << 28;

void Put32(std::string* out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*out)[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void Put64(std::string* out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*out)[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint32_t Get32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[at + i]);
  return v;
}
uint64_t Get64(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[at + i]);
  return v;
}

std::string KeyDigest(const StoreKey& key) {
  const auto d = Sha256(absl::StrCat("tally-store-v1", std::string(1, '\0'), key.model, std::string(1, '\0'),
                                     key.settings, std::string(1, '\0'), key.input));
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// Bits a label: the fewest of 1, 2, 4, 8 and 16 that hold every class.
uint32_t LabelBits(int classes) {
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    if (classes <= (1 << bits)) return bits;
  }
  return 16;
}

size_t PackedBytes(size_t labels, uint32_t bits) { return (labels * bits + 7) / 8; }

// The labels as the entry's raw bytes: one stream of `bits` bits a label, row-major, least
// significant bits first within a byte (16 bits: little-endian). A two-class 512x512 map is 32 KiB
// before DEFLATE, an eighth of a byte a label: compressing and digesting it costs that much less.
std::string RawLabels(const StoredPrediction& p, uint32_t bits) {
  std::string raw(PackedBytes(p.labels.size(), bits), '\0');
  if (bits == 16) {
    for (size_t i = 0; i < p.labels.size(); ++i) {
      raw[2 * i] = static_cast<char>(p.labels[i] & 0xFF);
      raw[2 * i + 1] = static_cast<char>(p.labels[i] >> 8);
    }
    return raw;
  }
  const size_t per_byte = 8 / bits;
  for (size_t i = 0; i < p.labels.size(); i += per_byte) {
    uint32_t byte = 0;
    const size_t end = std::min(p.labels.size(), i + per_byte);
    for (size_t j = i; j < end; ++j) byte |= static_cast<uint32_t>(p.labels[j]) << ((j - i) * bits);
    raw[i / per_byte] = static_cast<char>(byte);
  }
  return raw;
}

// The labels back from RawLabels' bytes; false when one is not below `classes`.
bool UnpackLabels(const std::string& raw, uint32_t bits, int classes, std::vector<uint16_t>* labels) {
  uint32_t bad = 0;
  if (bits == 16) {
    for (size_t i = 0; i < labels->size(); ++i) {
      const uint16_t v = static_cast<uint16_t>(static_cast<uint8_t>(raw[2 * i]) | (static_cast<uint8_t>(raw[2 * i + 1]) << 8));
      bad |= v >= classes;
      (*labels)[i] = v;
    }
    return bad == 0;
  }
  const size_t per_byte = 8 / bits;
  const uint32_t mask = (1u << bits) - 1;
  for (size_t i = 0; i < labels->size(); ++i) {
    const uint32_t v = (static_cast<uint8_t>(raw[i / per_byte]) >> ((i % per_byte) * bits)) & mask;
    bad |= v >= static_cast<uint32_t>(classes);
    (*labels)[i] = static_cast<uint16_t>(v);
  }
  return bad == 0;
}

// XXH128 of `bytes`, its 16 canonical (big-endian) bytes: as common/sources/row_files.h digests inputs.
std::string Digest128(const std::string& bytes) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
}

// The header's size where `bytes` start with an entry's magic and header size (either layout), else 0.
size_t HeaderSize(const std::string& bytes) {
  if (bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0 && Get32(bytes, 8) == kHeaderBytes) {
    return kHeaderBytes;
  }
  if (bytes.size() >= kHeaderBytesV2 && std::memcmp(bytes.data(), kMagicV2, 8) == 0 &&
      Get32(bytes, 8) == kHeaderBytesV2) {
    return kHeaderBytesV2;
  }
  return 0;
}

// The scores after the labels, little-endian.
void AppendScores(const std::vector<uint16_t>& scores, std::string* raw) {
  const size_t at = raw->size();
  raw->resize(at + 2 * scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    (*raw)[at + 2 * i] = static_cast<char>(scores[i] & 0xFF);
    (*raw)[at + 2 * i + 1] = static_cast<char>(scores[i] >> 8);
  }
}

bool IsHex(const std::string& s) {
  if (s.size() < 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

uint16_t QuantizeScore(double p) {
  if (!(p > 0)) return 0;  // NaN too.
  if (p >= 1) return 65535;
  return static_cast<uint16_t>(std::lround(p * 65535.0));
}

void CountStoredThresholds(const uint16_t* scores, const uint16_t* reference, size_t pixels,
                           const std::vector<double>& thresholds, int64_t* out) {
  for (size_t t = 0; t < thresholds.size(); ++t) {
    const double cut = thresholds[t] * 65535.0;
    int64_t tp = 0, fp = 0, fn = 0, tn = 0;
    for (size_t p = 0; p < pixels; ++p) {
      const uint16_t ref = reference[p];
      if (ref > 1) continue;  // Ignored pixels (65535) and other classes.
      const bool fg = static_cast<double>(scores[p]) > cut;
      tp += fg && ref == 1;
      fp += fg && ref == 0;
      fn += !fg && ref == 1;
      tn += !fg && ref == 0;
    }
    out[4 * t] = tp;
    out[4 * t + 1] = fp;
    out[4 * t + 2] = fn;
    out[4 * t + 3] = tn;
  }
}

std::string PredictionStore::EntryPath(const StoreKey& key) const {
  return absl::StrCat(root_, "/v1/", key.model.substr(0, 16), "/", key.settings.substr(0, 16), "/",
                      key.input.substr(0, 2), "/", key.input, ".tps");
}

std::string EncodeStoreEntry(const StoreKey& key, const StoredPrediction& p) {
  const uint32_t bits = LabelBits(p.classes);
  std::string raw = RawLabels(p, bits);
  const bool scores = !p.scores.empty();
  if (scores) AppendScores(p.scores, &raw);
  // One compressor a thread: allocating one costs about as much as compressing a small entry.
  thread_local std::unique_ptr<libdeflate_compressor, void (*)(libdeflate_compressor*)> c(
      libdeflate_alloc_compressor(1), libdeflate_free_compressor);
  std::string payload(libdeflate_deflate_compress_bound(c.get(), raw.size()), '\0');
  const size_t n = libdeflate_deflate_compress(c.get(), raw.data(), raw.size(), payload.data(), payload.size());
  payload.resize(n);
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic, 8);
  Put32(&out, 8, kHeaderBytes);
  Put32(&out, 12, bits);
  Put32(&out, 16, static_cast<uint32_t>(p.height));
  Put32(&out, 20, static_cast<uint32_t>(p.width));
  Put32(&out, 24, static_cast<uint32_t>(p.classes));
  Put32(&out, 28, static_cast<uint32_t>(p.depth));
  Put32(&out, 96, scores ? 16 : 0);
  Put64(&out, 32, static_cast<uint64_t>(p.nonfinite));
  Put64(&out, 40, payload.size());
  const std::string digest = Digest128(raw);
  std::memcpy(out.data() + 48, digest.data(), 16);
  const std::string k = KeyDigest(key);
  std::memcpy(out.data() + 64, k.data(), 32);
  out += payload;
  return out;
}

absl::StatusOr<StoredPrediction> DecodeStoreEntry(const std::string& bytes, const StoreKey& key, int height,
                                                  int width, int depth) {
  const size_t header = HeaderSize(bytes);
  if (header == 0) return absl::DataLossError("not a Tally prediction store entry (its header is missing or foreign)");
  StoredPrediction p;
  const uint32_t bits = Get32(bytes, 12);
  p.height = static_cast<int>(Get32(bytes, 16));
  p.width = static_cast<int>(Get32(bytes, 20));
  p.classes = static_cast<int>(Get32(bytes, 24));
  p.depth = header == kHeaderBytes ? static_cast<int>(Get32(bytes, 28)) : 1;
  p.nonfinite = static_cast<int64_t>(Get64(bytes, 32));
  const uint64_t payload = Get64(bytes, 40);
  const uint32_t score_bits = header == kHeaderBytes ? Get32(bytes, 96) : 0;
#ifndef TALLY_FUZZING  // Digests do not stop mutated inputs.
  if (bytes.compare(64, 32, KeyDigest(key)) != 0) return absl::DataLossError("the entry is another row's (its key differs)");
#endif
  if (p.height != height || p.width != width || p.depth != depth) {
    return absl::DataLossError(absl::StrCat("the entry is ", p.depth > 1 ? absl::StrCat(p.depth, "x") : "", p.height,
                                            "x", p.width, ", the row's ", depth > 1 ? absl::StrCat(depth, "x") : "",
                                            height, "x", width));
  }
  const int64_t pixels = static_cast<int64_t>(height) * width * depth;
  if (height <= 0 || width <= 0 || depth <= 0 || pixels > kMaxPixels || p.classes < 2 || p.classes > 65535 ||
      bits != LabelBits(p.classes) || p.nonfinite < 0 || (score_bits != 0 && score_bits != 16) ||
      (header == kHeaderBytes && Get32(bytes, 100) != 0)) {
    return absl::DataLossError("the entry's header is out of range");
  }
  const size_t label_size = PackedBytes(static_cast<size_t>(pixels), bits);
  const size_t raw_size = label_size + (score_bits ? 2 * static_cast<size_t>(pixels) : 0);
  if (payload != bytes.size() - header || payload > raw_size + raw_size / 2 + 4096) {
    return absl::DataLossError(absl::StrCat("the entry holds ", bytes.size() - header, " payload bytes, its header says ",
                                            payload, " (truncated or overwritten)"));
  }
  std::string raw(raw_size, '\0');
  thread_local std::unique_ptr<libdeflate_decompressor, void (*)(libdeflate_decompressor*)> d(
      libdeflate_alloc_decompressor(), libdeflate_free_decompressor);
  size_t got = 0;
  const libdeflate_result r =
      libdeflate_deflate_decompress(d.get(), bytes.data() + header, payload, raw.data(), raw.size(), &got);
  if (r != LIBDEFLATE_SUCCESS || got != raw_size) return absl::DataLossError("the entry's labels do not inflate to the row's size");
#ifndef TALLY_FUZZING
  if (Digest128(raw).compare(0, 16, bytes, 48, 16) != 0) return absl::DataLossError("the entry's labels do not match its digest");
#endif
  p.labels.resize(static_cast<size_t>(pixels));
  if (!UnpackLabels(raw, bits, p.classes, &p.labels)) {
    return absl::DataLossError(absl::StrCat("the entry holds a label of ", p.classes, " classes or more"));
  }
  if (score_bits == 16) {
    p.scores.resize(static_cast<size_t>(pixels));
    const unsigned char* s = reinterpret_cast<const unsigned char*>(raw.data()) + label_size;
    for (size_t i = 0; i < p.scores.size(); ++i) p.scores[i] = static_cast<uint16_t>(s[2 * i] | (s[2 * i + 1] << 8));
  }
  return p;
}

absl::StatusOr<StoreEntryInfo> ReadStoreEntryHeader(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  struct stat st;
  std::string header(kHeaderBytes, '\0');
  ssize_t got = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) got = read(fd, header.data(), kHeaderBytes);
  close(fd);
  header.resize(got < 0 ? 0 : static_cast<size_t>(got));
  const size_t size = HeaderSize(header);
  if (size == 0) return absl::DataLossError(absl::StrCat(path, ": not a Tally prediction store entry"));
  StoreEntryInfo info;
  info.label_bits = static_cast<int>(Get32(header, 12));
  info.height = static_cast<int>(Get32(header, 16));
  info.width = static_cast<int>(Get32(header, 20));
  info.classes = static_cast<int>(Get32(header, 24));
  info.depth = size == kHeaderBytes ? static_cast<int>(Get32(header, 28)) : 1;
  info.score_bits = size == kHeaderBytes ? static_cast<int>(Get32(header, 96)) : 0;
  info.file_bytes = st.st_size;
  info.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return info;
}

absl::StatusOr<StoredPrediction> ReadStoreEntry(const std::string& path, const StoreKey& key, int height, int width,
                                                int depth) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::NotFoundError(path);
  const int64_t pixels = static_cast<int64_t>(height) * width * depth;
  // Held to the most a row of this size can take before it is read: 2 bytes a label and 2 a score,
  // DEFLATE's bound.
  if (!S_ISREG(st.st_mode) || pixels > kMaxPixels || height <= 0 || width <= 0 || depth <= 0 ||
      st.st_size > static_cast<int64_t>(kHeaderBytes) + 6 * pixels + 4096) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.st_size, " bytes, more than a ",
                                            depth > 1 ? absl::StrCat(depth, "x") : "", height, "x", width,
                                            " entry holds"));
  }
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return absl::NotFoundError(path);  // Gone meanwhile (gc, a concurrent writer's rename).
  absl::StatusOr<StoredPrediction> p = DecodeStoreEntry(*bytes, key, height, width, depth);
  if (!p.ok()) return absl::DataLossError(absl::StrCat(path, ": ", p.status().message()));
  return p;
}

absl::StatusOr<StoredPrediction> PredictionStore::Read(const StoreKey& key, int height, int width, int depth) const {
  if (!IsHex(key.model) || !IsHex(key.settings) || !IsHex(key.input)) return absl::InvalidArgumentError("store key: not hex");
  const std::string path = EntryPath(key);
  absl::StatusOr<StoredPrediction> p = ReadStoreEntry(path, key, height, width, depth);
  if (p.ok()) utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // Recently used: `tally store gc` keeps it longer.
  return p;
}

absl::Status PredictionStore::Write(const StoreKey& key, const StoredPrediction& prediction, int64_t* written) const {
  if (!IsHex(key.model) || !IsHex(key.settings) || !IsHex(key.input)) return absl::InvalidArgumentError("store key: not hex");
  if (!prediction.scores.empty() && prediction.scores.size() != prediction.labels.size()) {
    return absl::InvalidArgumentError("store entry: scores and labels of different sizes");
  }
  const std::string path = EntryPath(key);
  RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/'))));
  const std::string tmp = UniqueTemporaryPath(path);  // Writers on several hosts may share the folder.
  const std::string bytes = EncodeStoreEntry(key, prediction);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(e)));
  }
  if (written != nullptr) *written = static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

}  // namespace tally
