#include "server/follow/checkpoint_watch.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace tally {
namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Copies `from` to `to` (a temporary name beside it, then a rename), for a checkpoint on another
// filesystem than the state folder.
// Copies `from` to `to` (a temporary file, then a rename): a clone sharing the source's blocks where
// the filesystem can (FICLONE: btrfs, XFS with reflink, bcachefs; instant, copy-on-write), else the
// bytes (copy_file_range, which a filesystem may offload, then read/write). *cloned says which.
absl::Status CopyFile(const std::string& from, const std::string& to, bool* cloned) {
  const int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    const int e = errno;
    return e == ENOENT ? absl::NotFoundError(absl::StrCat(from, ": gone before it was taken"))
                       : absl::UnavailableError(absl::StrCat(from, ": ", std::strerror(e)));
  }
  const std::string tmp = UniqueTemporaryPath(to);
  const int out = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    const int e = errno;
    close(in);
    return absl::PermissionDeniedError(absl::StrCat(tmp, ": ", std::strerror(e)));
  }
  absl::Status s;
  *cloned = ioctl(out, FICLONE, in) == 0;
  while (!*cloned && s.ok()) {
    const ssize_t n = copy_file_range(in, nullptr, out, nullptr, size_t{1} << 30, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) break;
    if (n > 0) continue;
    if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
      s = absl::ResourceExhaustedError(absl::StrCat(tmp, ": ", std::strerror(errno)));
      break;
    }
    // Not offered here: the bytes through a buffer, from where copy_file_range stopped.
    std::string buffer(1 << 20, '\0');
    while (s.ok()) {
      const ssize_t r = read(in, buffer.data(), buffer.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) s = absl::UnavailableError(absl::StrCat(from, ": ", std::strerror(errno)));
      if (r <= 0) break;
      for (ssize_t done = 0; done < r && s.ok();) {
        const ssize_t w = write(out, buffer.data() + done, static_cast<size_t>(r - done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) s = absl::ResourceExhaustedError(absl::StrCat(tmp, ": ", std::strerror(errno)));
        done += std::max<ssize_t>(w, 0);
      }
    }
    break;
  }
  close(in);
  if (close(out) != 0 && s.ok()) s = absl::ResourceExhaustedError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  if (s.ok() && rename(tmp.c_str(), to.c_str()) != 0) s = absl::UnavailableError(absl::StrCat(to, ": ", std::strerror(errno)));
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

}  // namespace

absl::StatusOr<CheckpointWatch> CheckpointWatch::Create(CheckpointWatchOptions options) {
  CheckpointWatch w(std::move(options));
  if (!w.options_.step_regex.empty()) {
    try {
      w.step_regex_ = std::regex(w.options_.step_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrCat("--step-regex '", w.options_.step_regex, "': ", e.what()));
    }
    if (w.step_regex_.mark_count() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--step-regex '", w.options_.step_regex,
                                                     "' has no group: say which part is the step, e.g. 'step_(\\d+)'"));
    }
    w.has_regex_ = true;
  }
  if (!(w.options_.settle_seconds >= 0)) return absl::InvalidArgumentError("--settle: expected seconds >= 0");
  return w;
}

int64_t CheckpointWatch::StepOf(const std::string& name) const {
  std::string digits;
  if (has_regex_) {
    std::smatch m;
    if (std::regex_search(name, m, step_regex_) && m.size() > 1) digits = m[1].str();
  } else {
    size_t end = name.size();
    while (end > 0 && !std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
    size_t begin = end;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
    digits = name.substr(begin, end - begin);
  }
  const bool number = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits.empty() || digits.size() > 18 || !number) return -1;
  return std::stoll(digits);
}

bool CheckpointWatch::Marked(const std::string& name) const {
  if (options_.ready_marker.empty()) return false;
  const std::string marker = absl::StrReplaceAll(options_.ready_marker, {{"{}", name}});
  struct stat st;
  return stat(absl::StrCat(options_.folder, "/", marker).c_str(), &st) == 0;
}

std::vector<CheckpointEvent> CheckpointWatch::Poll(double now, const std::set<std::string>& done) {
  std::vector<CheckpointEvent> events;
  std::set<std::string> present;
  for (const std::string& name : ListDirectory(options_.folder)) {
    if (fnmatch(options_.pattern.c_str(), name.c_str(), FNM_PERIOD) != 0 || done.count(name) > 0) continue;
    struct stat st;
    if (stat(absl::StrCat(options_.folder, "/", name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    present.insert(name);
    Seen& s = seen_[name];
    if (s.size != st.st_size || s.mtime_ns != MtimeNs(st)) {  // New, or written since the last look.
      const double first = s.size < 0 ? now : s.first_seen;
      s = Seen{st.st_size, MtimeNs(st), now, first, false};
    }
    if (s.reported) continue;
    const bool marked = Marked(name);
    if (!marked && now - s.unchanged_since < options_.settle_seconds) continue;
    s.reported = true;
    events.push_back({CheckpointEvent::Kind::kReady, name, StepOf(name), s.size, s.mtime_ns, marked});
  }
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (present.count(it->first) > 0) {
      ++it;
      continue;
    }
    // Gone: reported only when it vanished before it was taken (the manager puts taken ones in `done`).
    if (done.count(it->first) == 0) {
      events.push_back({CheckpointEvent::Kind::kGone, it->first, StepOf(it->first), it->second.size, it->second.mtime_ns, false});
    }
    it = seen_.erase(it);
  }
  std::sort(events.begin(), events.end(), [](const CheckpointEvent& a, const CheckpointEvent& b) {
    return std::tie(a.kind, a.step, a.name) < std::tie(b.kind, b.step, b.name);
  });
  return events;
}

int64_t CheckpointWatch::Settling(double* first_seen) const {
  int64_t n = 0;
  for (const auto& [name, s] : seen_) {
    if (s.reported) continue;
    *first_seen = n == 0 ? s.first_seen : std::min(*first_seen, s.first_seen);
    ++n;
  }
  return n;
}

void CheckpointWatch::Settle(const std::string& name, double now) {
  auto it = seen_.find(name);
  if (it == seen_.end()) return;
  it->second.unchanged_since = now;
  it->second.reported = false;
}

absl::StatusOr<TakenCheckpoint> CheckpointWatch::Take(const CheckpointEvent& event, const std::string& state_folder,
                                                      double now) {
  const std::string from = absl::StrCat(options_.folder, "/", event.name);
  RETURN_IF_ERROR(MakeDirs(state_folder));
  TakenCheckpoint t;
  t.path = absl::StrCat(state_folder, "/", event.step < 0 ? "x" : std::to_string(event.step), "-", event.name);
  unlink(t.path.c_str());  // A take a restart interrupted.
  // A copy, never a hard link: a trainer that saves over the same file in place (torch.save truncates
  // and rewrites its inode) would change a link's bytes under the job.
  if (absl::Status s = CopyFile(from, t.path, &t.cloned); !s.ok()) {
    if (absl::IsNotFound(s)) {
      Settle(event.name, now);
      return absl::UnavailableError(s.message());
    }
    return s;
  }
  // The bytes taken must be those that settled: a source written since (or while it was copied) is
  // not this checkpoint yet.
  struct stat st, source;
  const bool same = stat(t.path.c_str(), &st) == 0 && st.st_size == event.size && stat(from.c_str(), &source) == 0 &&
                    source.st_size == event.size && MtimeNs(source) == event.mtime_ns;
  if (!same) {
    unlink(t.path.c_str());
    Settle(event.name, now);
    return absl::UnavailableError(absl::StrCat(from, ": changed after it settled; it settles again"));
  }
  t.size = st.st_size;
  return t;
}

}  // namespace tally
