#include "common/sources/row_files.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/decode.h"
#include "common/security/data_roots.h"
#include "common/sources/tar_shards.h"

namespace tally {

absl::Status ReadFileBytes(const std::string& path, std::string* out) {
  if (IsMemberLocator(path)) return ReadMemberBytes(path, out);  // A tar shard's member.
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("", path);
  if (absl::IsInvalidArgument(file.status())) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is ", file.status().message(), ", not a regular file"));
  }
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot open '", path, "': ", file.status().message()));
  }
  const int fd = file->fd;
  out->resize(static_cast<size_t>(file->size));
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = read(fd, out->data() + done, out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return absl::DataLossError(absl::StrCat("error reading '", path, "': ", n == 0 ? "short read" : std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

namespace {
// Reads `path` into a per-thread buffer (released again after an outlier) and decodes it. Read
// errors are prefixed with `what` ("image: cannot open ...").
template <typename DecodeFn>
absl::Status ReadAndDecode(const char* what, const std::string& path, DecodeFn decode) {
  thread_local std::string bytes;
  absl::Status s = ReadFileBytes(path, &bytes);
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  } else {
    s = decode(bytes);
  }
  if (bytes.capacity() > kKeepBufferBytes) std::string().swap(bytes);
  return s;
}
}  // namespace

absl::Status LoadImage(const std::string& path, RgbImage* out, int64_t max_pixels, const DecodeOptions& options) {
  return ReadAndDecode("image", path, [&](const std::string& bytes) {
    return DecodeImage(bytes, DisplayPath(path), out, max_pixels, options);
  });
}

absl::Status LoadMask(const std::string& path, LabelMap* out, int64_t max_pixels, int page) {
  return ReadAndDecode("mask", path,
                       [&](const std::string& bytes) { return DecodeMask(bytes, DisplayPath(path), out, max_pixels, page); });
}

}  // namespace tally
