// A tar's members from its headers (common/sources/tar_listing.h).
#include "common/sources/tar_listing.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/text.h"

namespace tally {
namespace {

// Blocks read after the first zero block, looking for a header in the padding (GNU tar's
// default record is 20 blocks; 64 covers every common blocking factor).
constexpr int kZeroBlocksScanned = 64;

// A plain tar in a file: Read with pread through a small window (the headers of small members
// share one read, as the 10 KiB records of tar's own reader do), Skip by moving the position
// (checked against the size; data past the window is never read).
class FdStream : public TarStream {
 public:
  FdStream(int fd, int64_t size) : fd_(fd), size_(size) {}
  int64_t Read(char* out, int64_t n) override {
    int64_t done = 0;
    while (done < n) {
      const int64_t at = pos_ + done;
      if (at >= window_at_ && at < window_at_ + static_cast<int64_t>(window_.size())) {  // In the window.
        const int64_t k = std::min<int64_t>(n - done, window_at_ + static_cast<int64_t>(window_.size()) - at);
        std::memcpy(out + done, window_.data() + (at - window_at_), static_cast<size_t>(k));
        done += k;
        continue;
      }
      if (n - done >= kWindowBytes) {  // Large reads go straight to the caller's buffer.
        const int64_t r = PreadAll(out + done, n - done, at);
        if (r < 0) return -1;
        done += r;
        break;
      }
      window_.resize(kWindowBytes);
      const int64_t r = PreadAll(window_.data(), kWindowBytes, at);
      if (r < 0) return -1;
      window_.resize(static_cast<size_t>(r));
      window_at_ = at;
      if (r == 0) break;
    }
    pos_ += done;
    return done;
  }
  bool Skip(int64_t n) override {
    if (n < 0 || (size_ >= 0 && n > size_ - pos_)) return false;
    pos_ += n;
    return true;
  }
  int64_t position() const override { return pos_; }
  bool seekable() const override { return true; }
  std::string error() const override { return error_; }

 private:
  static constexpr int64_t kWindowBytes = 16 << 10;
  // Up to `n` bytes at `at` (fewer at the end of the file); -1 on an error.
  int64_t PreadAll(char* out, int64_t n, int64_t at) {
    int64_t done = 0;
    while (done < n) {
      const ssize_t r = pread(fd_, out + done, static_cast<size_t>(n - done), at + done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        error_ = std::strerror(errno);
        return -1;
      }
      if (r == 0) break;
      done += r;
    }
    return done;
  }

  int fd_;
  int64_t size_;
  int64_t pos_ = 0;
  std::string window_;     // File bytes from window_at_.
  int64_t window_at_ = 0;
  std::string error_;
};

class MemoryStream : public TarStream {
 public:
  explicit MemoryStream(absl::string_view bytes) : bytes_(bytes) {}
  int64_t Read(char* out, int64_t n) override {
    const int64_t k = std::min<int64_t>(n, static_cast<int64_t>(bytes_.size()) - pos_);
    std::memcpy(out, bytes_.data() + pos_, static_cast<size_t>(k));
    pos_ += k;
    return k;
  }
  bool Skip(int64_t n) override {
    if (n < 0 || n > static_cast<int64_t>(bytes_.size()) - pos_) return false;
    pos_ += n;
    return true;
  }
  int64_t position() const override { return pos_; }
  bool seekable() const override { return true; }
  std::string error() const override { return ""; }

 private:
  absl::string_view bytes_;
  int64_t pos_ = 0;
};

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};

// A compressed tar's decompressed bytes (libarchive's filters, its "raw" format: the stream as it
// is); Skip reads through, keeping to the deadline.
class DecompressedStream : public TarStream {
 public:
  DecompressedStream(archive* a, absl::Time deadline) : a_(a), deadline_(deadline) {}
  int64_t Read(char* out, int64_t n) override {
    int64_t done = 0;
    while (done < n) {
      const la_ssize_t r = archive_read_data(a_, out + done, static_cast<size_t>(n - done));
      if (r < 0) {
        error_ = archive_error_string(a_) ? archive_error_string(a_) : "corrupt compressed data";
        return -1;
      }
      if (r == 0) break;
      done += r;
    }
    pos_ += done;
    return done;
  }
  bool Skip(int64_t n) override {
    std::string buffer(static_cast<size_t>(std::min<int64_t>(n, 1 << 20)), '\0');
    while (n > 0) {
      if (absl::Now() > deadline_) {
        error_ = "the submission's time ran out";
        return false;
      }
      const int64_t r = Read(buffer.data(), std::min<int64_t>(n, static_cast<int64_t>(buffer.size())));
      if (r <= 0) return false;
      n -= r;
    }
    return true;
  }
  int64_t position() const override { return pos_; }
  bool seekable() const override { return false; }
  std::string error() const override { return error_; }

 private:
  archive* a_;
  absl::Time deadline_;
  int64_t pos_ = 0;
  std::string error_;
};

// Whether the bytes start as a compressed stream libarchive decompresses.
bool LooksCompressed(const unsigned char* b, size_t n) {
  auto starts = [&](std::initializer_list<unsigned char> magic) {
    if (n < magic.size()) return false;
    size_t i = 0;
    for (unsigned char c : magic) {
      if (b[i++] != c) return false;
    }
    return true;
  };
  return starts({0x1f, 0x8b}) || starts({'B', 'Z', 'h'}) || starts({0xfd, '7', 'z', 'X', 'Z', 0x00}) ||
         starts({0x28, 0xb5, 0x2f, 0xfd}) || starts({0x04, 0x22, 0x4d, 0x18}) || starts({0x1f, 0x9d}) ||
         starts({'L', 'Z', 'I', 'P'});
}

// What an entry of `type` is when it is not a regular member ("" when it is).
std::string EntryKind(char type, const std::string& link) {
  switch (type) {
    case '0':
    case '7':
      return "";
    case '1':
      return absl::StrCat("a hard link to '", Printable(link), "'");
    case '2':
      return absl::StrCat("a symbolic link to '", Printable(link), "'");
    case '3':
    case '4':
      return "a device";
    case '6':
      return "a FIFO";
    default:
      return absl::StrCat("a tar entry of type '", Printable(std::string(1, type)), "'");
  }
}

// What the extended headers before an entry said of it.
struct Pending {
  std::string name;
  std::string link;
  int64_t size = -1;
  bool sparse = false;
  bool name_lost = false;
  std::string problem;
};

// A pax extended header's records ("LEN key=value\n"): the path, the size and whether it marks a
// sparse member; anything malformed fails the entry it describes.
void ParsePax(absl::string_view text, Pending* p) {
  for (int records = 0; !text.empty(); ++records) {
    const size_t space = text.find(' ');
    int64_t len = 0;
    if (records >= kMaxPaxRecords || space == absl::string_view::npos ||
        !absl::SimpleAtoi(text.substr(0, space), &len) || len <= static_cast<int64_t>(space) + 1 ||
        len > static_cast<int64_t>(text.size()) || text[len - 1] != '\n') {
      p->problem = records >= kMaxPaxRecords ? absl::StrCat("its pax header holds more than ", kMaxPaxRecords, " records")
                                             : "its pax header is malformed";
      return;
    }
    const absl::string_view record = text.substr(space + 1, len - space - 2);
    text.remove_prefix(len);
    const size_t eq = record.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      if (static_cast<int64_t>(value.size()) > kMaxMemberNameBytes) {
        p->name_lost = true;
        p->problem = absl::StrCat("its pax path is ", value.size(), " bytes, more than the limit of ", kMaxMemberNameBytes);
        p->name = std::string(value.substr(0, 256));
      } else {
        p->name = std::string(value);
      }
    } else if (key == "linkpath") {
      p->link = std::string(value.substr(0, kMaxMemberNameBytes));
    } else if (key == "size") {
      if (!absl::SimpleAtoi(value, &p->size) || p->size < 0) p->problem = "its pax header gives a size that is no number";
    } else if (absl::StartsWith(key, "GNU.sparse.")) {
      p->sparse = true;
    }
  }
}

// Reads an extended header's data (at most `cap` bytes; more is skipped and reported): false when
// the stream ends first.
bool ReadExtended(TarStream* in, int64_t size, int64_t cap, std::string* data, bool* too_long) {
  const int64_t padded = (size + kTarBlock - 1) / kTarBlock * kTarBlock;
  *too_long = size > cap;
  if (*too_long) return in->Skip(padded);
  data->resize(static_cast<size_t>(padded));
  if (in->Read(data->data(), padded) != padded) return false;
  data->resize(static_cast<size_t>(size));
  return true;
}

class Lister {
 public:
  Lister(TarStream* in, const std::string& name, int64_t file_size, bool compressed, const TarListOptions& options)
      : in_(in), name_(name), file_size_(file_size), options_(options) {
    out_.compressed = compressed;
  }
  absl::StatusOr<TarListing> Run();

 private:
  // Handles one header: false when the listing ends (out_.ended_early says why, or the archive's end).
  absl::StatusOr<bool> Step(bool first);
  bool Extended(const TarHeader& h);
  bool Entry(const TarHeader& h, int64_t at);
  // After a zero block at `at`: the archive's end, unless a tar header follows in the padding.
  bool AfterZero(int64_t at);
  bool End(std::string why) {
    out_.ended_early = std::move(why);
    return false;
  }

  TarStream* in_;
  const std::string& name_;
  int64_t file_size_;
  TarListOptions options_;
  TarListing out_;
  Pending pending_;
};

absl::StatusOr<TarListing> Lister::Run() {
  for (int64_t n = 0;; ++n) {
    if ((n & 63) == 0 && absl::Now() > options_.deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shard '", name_, "': still being indexed when the submission's ",
                                                      "time ran out (tallyd --submit-read-timeout)"));
    }
    absl::StatusOr<bool> more = Step(n == 0);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  if (!out_.ended_early.empty() && in_->error() == "the submission's time ran out") {
    return absl::DeadlineExceededError(absl::StrCat("shard '", name_, "': still being indexed when the submission's ",
                                                    "time ran out (tallyd --submit-read-timeout)"));
  }
  return std::move(out_);
}

absl::StatusOr<bool> Lister::Step(bool first) {
  char block[kTarBlock];
  const int64_t at = in_->position();
  const int64_t n = in_->Read(block, kTarBlock);
  const TarHeader h = n == kTarBlock ? ParseTarHeader(block) : TarHeader{};
  if (first && (n != kTarBlock || !h.valid)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard '", name_, "' is not a tar Tally reads (",
                     n < 0 ? in_->error() : n < kTarBlock ? "shorter than one tar header" : "its first block is no tar header",
                     ")"));
  }
  if (n == 0) return false;  // Ended without the end-of-archive marker, after whole members: accepted.
  if (n < 0) return End(absl::StrCat("reading it failed at byte ", at, " (", in_->error(), ")"));
  if (n < kTarBlock) return End(absl::StrCat("it ends inside a header at byte ", at));
  if (h.zero) return AfterZero(at);
  if (!h.valid) return End(absl::StrCat("the block at byte ", at, " is no tar header (its checksum does not match)"));
  if (h.size < 0 || h.size > INT64_MAX / 2) return End(absl::StrCat("the header at byte ", at, " gives no size"));
  if (h.type == 'L' || h.type == 'K' || h.type == 'x' || h.type == 'g') return Extended(h);
  return Entry(h, at);
}

bool Lister::AfterZero(int64_t at) {
  // Writers pad to their record size (10240 bytes for GNU tar); a header after a lone zero block
  // or in that padding is a member every tar reader would drop silently: the listing says so.
  char block[kTarBlock];
  for (int i = 0; i < kZeroBlocksScanned; ++i) {
    const int64_t here = in_->position();
    if (in_->Read(block, kTarBlock) != kTarBlock) return false;
    const TarHeader next = ParseTarHeader(block);
    if (next.zero) continue;
    if (!next.valid) return false;  // Padding that is not zeros but no header either: the end.
    return End(absl::StrCat("a tar header at byte ", here, " follows ", i == 0 ? "a lone zero block" : "the end-of-archive marker",
                            " at byte ", at, " (two archives joined?); the members from there on are not read"));
  }
  return false;
}

bool Lister::Extended(const TarHeader& h) {
  const bool name = h.type == 'L';
  const int64_t cap = h.type == 'x' || h.type == 'g' ? kMaxPaxHeaderBytes : kMaxMemberNameBytes;
  if (h.type == 'g' && h.size > cap && !in_->seekable()) {
    return End(absl::StrCat("a global pax header of ", h.size, " bytes, more than the limit of ", cap));
  }
  std::string data;
  bool too_long = false;
  if (!ReadExtended(in_, h.size, cap, &data, &too_long)) return End("it ends inside an extended header");
  if (h.type == 'g') return true;
  if (too_long) {
    pending_.name_lost = name;
    pending_.problem = absl::StrCat("its ", name ? "long-name header" : h.type == 'x' ? "pax header" : "long-link header",
                                    " is ", h.size, " bytes, more than the limit of ", cap);
    return true;
  }
  const std::string value(data.c_str());  // NUL-terminated in GNU's headers.
  if (h.type == 'x') {
    ParsePax(data, &pending_);
  } else if (name) {
    pending_.name = value;
  } else {
    pending_.link = value;
  }
  return true;
}

bool Lister::Entry(const TarHeader& h, int64_t at) {
  Pending p = std::move(pending_);
  pending_ = Pending{};
  const int64_t data_size = p.size >= 0 ? p.size : h.size;
  TarMember m;
  m.name = !p.name.empty() ? p.name : h.name;
  if (m.name.empty()) m.name = "(unnamed)";
  m.size = data_size;
  m.problem = p.problem;
  m.name_lost = p.name_lost;
  m.kind = h.type == 'S' ? "" : EntryKind(h.type, p.link.empty() ? h.linkname : p.link);
  m.regular = m.kind.empty();
  if (h.type == 'S' || p.sparse) m.problem = "it is a sparse member (Tally reads whole members only)";
  m.offset = in_->position();
  const int64_t padded = (data_size + kTarBlock - 1) / kTarBlock * kTarBlock;
  if (m.regular && m.problem.empty() && data_size > options_.max_member_bytes) {
    m.problem = absl::StrCat("it declares ", data_size, " bytes, more than the limit of ", options_.max_member_bytes,
                             " for one member");
  }
  const bool past_end = !out_.compressed && file_size_ >= 0 && m.offset + data_size > file_size_;
  if (past_end) {
    m.problem = absl::StrCat("its header claims ", data_size, " bytes, past the end of the shard (", file_size_,
                             " bytes): truncated or corrupt");
  }
  if (h.type != '5') out_.members.push_back(m);
  if (past_end) return End(absl::StrCat("member '", Printable(m.name), "' at byte ", at, ": ", m.problem));
  if (out_.compressed && data_size > options_.max_member_bytes) {
    return End(absl::StrCat("member '", Printable(m.name), "' declares ", data_size, " bytes, more than the limit of ",
                            options_.max_member_bytes, " for one member; a compressed shard is read front to back, ",
                            "so its samples after it are not indexed"));
  }
  int64_t read = 0;
  std::string ext = m.name.substr(m.name.rfind('/') == std::string::npos ? 0 : m.name.rfind('/') + 1);
  ext = ext.find('.') == std::string::npos ? "" : ext.substr(ext.find('.') + 1);
  if (h.type != '5' && options_.read_json && m.regular && m.problem.empty() && absl::EqualsIgnoreCase(ext, "json")) {
    if (data_size > kMaxJsonMemberBytes) {
      out_.members.back().problem = absl::StrCat("a JSON member of ", data_size, " bytes (the limit is ",
                                                 kMaxJsonMemberBytes, ")");
    } else {
      std::string& data = out_.members.back().data;
      data.resize(static_cast<size_t>(data_size));
      read = in_->Read(data.data(), data_size);
      if (read != data_size) data.clear();
      if (read < 0) read = 0;
    }
  }
  if (read > padded || !in_->Skip(padded - read)) {
    if (h.type != '5' && out_.members.back().problem.empty()) {
      out_.members.back().problem = "the shard ends inside it";
    }
    return End(absl::StrCat("it ends inside member '", Printable(m.name), "'",
                            in_->error().empty() ? "" : absl::StrCat(" (", in_->error(), ")")));
  }
  if (static_cast<int64_t>(out_.members.size()) >= kMaxMembersPerShard) {
    return End(absl::StrCat("it holds more than ", kMaxMembersPerShard, " members"));
  }
  return true;
}

// Whether the file's first bytes are a compressor's magic (gzip, bzip2, xz, zstd, ...).
bool FdLooksCompressed(int fd) {
  unsigned char magic[8] = {0};
  const ssize_t n = pread(fd, magic, sizeof(magic), 0);
  return n > 0 && LooksCompressed(magic, static_cast<size_t>(n));
}

}  // namespace

absl::StatusOr<TarListing> ListTarFd(int fd, const std::string& name, int64_t file_size, const TarListOptions& options) {
  if (FdLooksCompressed(fd)) {
    std::unique_ptr<archive, ArchiveCloser> a(archive_read_new());
    archive_read_support_filter_all(a.get());
    archive_read_support_format_raw(a.get());
    archive_entry* e = nullptr;
    if (lseek(fd, 0, SEEK_SET) != 0 || archive_read_open_fd(a.get(), fd, 1 << 20) != ARCHIVE_OK ||
        archive_read_next_header(a.get(), &e) != ARCHIVE_OK) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard '", name, "' cannot be decompressed (",
          archive_error_string(a.get()) ? archive_error_string(a.get()) : "unknown", ")"));
    }
    DecompressedStream in(a.get(), options.deadline);
    return Lister(&in, name, -1, true, options).Run();
  }
  FdStream in(fd, file_size);
  return Lister(&in, name, file_size, false, options).Run();
}

bool IsCompressedFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool compressed = FdLooksCompressed(fd);
  close(fd);
  return compressed;
}

absl::StatusOr<TarListing> ListTarBytes(absl::string_view bytes, const std::string& name,
                                        const TarListOptions& options) {
  if (LooksCompressed(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size())) {
    std::unique_ptr<archive, ArchiveCloser> a(archive_read_new());
    archive_read_support_filter_all(a.get());
    archive_read_support_format_raw(a.get());
    archive_entry* e = nullptr;
    if (archive_read_open_memory(a.get(), bytes.data(), bytes.size()) != ARCHIVE_OK ||
        archive_read_next_header(a.get(), &e) != ARCHIVE_OK) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard '", name, "' cannot be decompressed (",
          archive_error_string(a.get()) ? archive_error_string(a.get()) : "unknown", ")"));
    }
    DecompressedStream in(a.get(), options.deadline);
    return Lister(&in, name, -1, true, options).Run();
  }
  MemoryStream in(bytes);
  return Lister(&in, name, static_cast<int64_t>(bytes.size()), false, options).Run();
}

}  // namespace tally
