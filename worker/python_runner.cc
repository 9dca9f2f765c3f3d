#include "worker/python_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/process/subprocess.h"
#include "metrics/label_counts.h"
#include "google/protobuf/util/json_util.h"
#include "proto/tally.pb.h"

extern char** environ;

namespace tally {
namespace {


// Adds the k x k confusion counts (row = reference, column = prediction) of n pixels to `counts`;
// predictions must be < k, reference pixels that are ignored or >= k are left out.
constexpr uint32_t kMaxFrameBytes = 64u << 20;

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) out = "{}";
  return out;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  return "unknown status";
}

class ShmBuffer;

// A response, or the stub's death, for one request.
struct Reply {
  absl::Notification done;
  v1::StubResponse response;
  std::string died;  // Non-empty: the stub died before answering ("signal 9").
};

// The stub process and everything shared with the buffers and pending batches that outlive a
// call: the registry of shared-memory buffers (re-sent to a restarted stub) and the requests
// waiting for an answer.
class Channel {
 public:
  explicit Channel(ModelRunnerOptions options) : options_(std::move(options)) {}
  ~Channel() { Stop(); }

  // Starts the stub if it is not running (first call, or after it died): spawn, map every buffer,
  // init. Errors are those of CreatePythonRunner.
  absl::Status EnsureRunning() ABSL_LOCKS_EXCLUDED(start_mu_, mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(start_mu_, mu_);

  // Sends `request` (its id is set here) and returns where the answer will land.
  std::shared_ptr<Reply> Send(v1::StubRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  void SendNoReply(const v1::StubRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t RegisterBuffer(int fd, size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void UnregisterBuffer(int64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  int model_classes() const { return model_classes_.load(); }
  bool outputs_probabilities() const { return probabilities_.load(); }
  std::vector<GpuUsage> gpus() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return gpus_;
  }
  void NoteGpus(const v1::StubResponse& r) ABSL_LOCKS_EXCLUDED(mu_);
  const ModelRunnerOptions& options() const { return options_; }

  // Output buffers outlive their batch in a small pool: a new buffer costs a memfd, a mapping on
  // both sides and, on CUDA, page-locking it in the stub.
  std::unique_ptr<ShmBuffer> TakeOutput(std::shared_ptr<Channel> self, size_t bytes) ABSL_LOCKS_EXCLUDED(pool_mu_);
  void ReturnOutput(std::unique_ptr<ShmBuffer> buffer) ABSL_LOCKS_EXCLUDED(pool_mu_);
  // Drops the pool (its buffers refer back to this channel) and stops pooling.
  void ClosePool() ABSL_LOCKS_EXCLUDED(pool_mu_);

 private:
  absl::Status Spawn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(start_mu_);
  bool SendFrame(const std::string& json, int fd_to_pass) ABSL_LOCKS_EXCLUDED(mu_);
  // Passes a buffer's descriptor to the stub, which maps it.
  void SendMap(int64_t id, int fd, size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void SendExit() ABSL_LOCKS_EXCLUDED(mu_);
  void ReaderLoop(int sock, pid_t pid);

  const ModelRunnerOptions options_;
  absl::Mutex start_mu_;  // Serialises starts and stops.
  std::thread reader_ ABSL_GUARDED_BY(start_mu_);
  mutable absl::Mutex mu_;
  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);
  int sock_ ABSL_GUARDED_BY(mu_) = -1;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = -1;
  bool alive_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::shared_ptr<Reply>> waiting_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::pair<int, size_t>> buffers_ ABSL_GUARDED_BY(mu_);  // id -> (fd, size).
  int64_t next_buffer_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<GpuUsage> gpus_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> model_classes_{0};
  std::atomic<bool> probabilities_{false};
  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<ShmBuffer>> pool_ ABSL_GUARDED_BY(pool_mu_);
  bool pool_closed_ ABSL_GUARDED_BY(pool_mu_) = false;
};

class ShmBuffer final : public HostBuffer {
 public:
  static std::unique_ptr<ShmBuffer> Create(std::shared_ptr<Channel> channel, size_t bytes) {
    bytes = std::max<size_t>(bytes, 4096);
    const int fd = memfd_create("tally-shm", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      return nullptr;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return nullptr;
    }
    auto b = std::unique_ptr<ShmBuffer>(new ShmBuffer(channel, fd, static_cast<uint8_t*>(p), bytes));
    b->id_ = channel->RegisterBuffer(fd, bytes);
    return b;
  }
  ~ShmBuffer() override {
    channel_->UnregisterBuffer(id_);
    munmap(data_, size_);
    close(fd_);
  }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }
  int64_t id() const { return id_; }

 private:
  ShmBuffer(std::shared_ptr<Channel> channel, int fd, uint8_t* data, size_t size)
      : channel_(std::move(channel)), fd_(fd), data_(data), size_(size) {}
  std::shared_ptr<Channel> channel_;
  int fd_;
  uint8_t* data_;
  size_t size_;
  int64_t id_ = 0;
};

std::unique_ptr<ShmBuffer> Channel::TakeOutput(std::shared_ptr<Channel> self, size_t bytes) {
  {
    absl::MutexLock lock(&pool_mu_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if ((*it)->size() >= bytes && (*it)->size() <= 4 * bytes + (1 << 20)) {
        std::unique_ptr<ShmBuffer> b = std::move(*it);
        pool_.erase(it);
        return b;
      }
    }
  }
  return ShmBuffer::Create(std::move(self), bytes + bytes / 4);
}

void Channel::ReturnOutput(std::unique_ptr<ShmBuffer> buffer) {
  std::unique_ptr<ShmBuffer> drop;
  absl::MutexLock lock(&pool_mu_);
  if (pool_closed_) {
    drop = std::move(buffer);
    return;
  }
  pool_.push_back(std::move(buffer));
  if (pool_.size() > 8) {
    drop = std::move(pool_.front());
    pool_.erase(pool_.begin());
  }
}

void Channel::ClosePool() {
  std::vector<std::unique_ptr<ShmBuffer>> drop;
  absl::MutexLock lock(&pool_mu_);
  pool_closed_ = true;
  drop.swap(pool_);
}

int64_t Channel::RegisterBuffer(int fd, size_t size) {
  int64_t id = 0;
  bool alive = false;
  {
    absl::MutexLock lock(&mu_);
    id = next_buffer_++;
    buffers_[id] = {fd, size};
    alive = alive_;
  }
  if (alive) SendMap(id, fd, size);
  return id;
}

void Channel::SendMap(int64_t id, int fd, size_t size) {
  v1::StubRequest map;
  map.set_op("map");
  map.set_buffer(id);
  map.set_size(static_cast<int64_t>(size));
  SendFrame(ToJson(map), fd);
}

void Channel::SendExit() {
  v1::StubRequest exit;
  exit.set_op("exit");
  SendFrame(ToJson(exit), -1);
}

void Channel::UnregisterBuffer(int64_t id) {
  bool alive = false;
  {
    absl::MutexLock lock(&mu_);
    buffers_.erase(id);
    alive = alive_;
  }
  if (alive) {
    v1::StubRequest unmap;
    unmap.set_op("unmap");
    unmap.set_buffer(id);
    SendFrame(ToJson(unmap), -1);
  }
}

void Channel::NoteGpus(const v1::StubResponse& r) {
  if (r.gpus_size() == 0) return;
  absl::MutexLock lock(&mu_);
  gpus_.clear();
  for (const v1::GpuStats& g : r.gpus()) {
    gpus_.push_back(GpuUsage{g.device(), g.name(), g.peak_memory_bytes(), g.memory_used_bytes(), g.memory_total_bytes()});
  }
}

bool Channel::SendFrame(const std::string& json, int fd_to_pass) {
  int sock = -1;
  {
    absl::MutexLock lock(&mu_);
    sock = sock_;
  }
  if (sock < 0) return false;
  std::string frame(4, '\0');
  const uint32_t n = static_cast<uint32_t>(json.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  frame += json;
  absl::MutexLock lock(&write_mu_);
  if (fd_to_pass < 0) return WriteAll(sock, frame.data(), frame.size());
  // The descriptor rides on the frame's first bytes; the stub queues descriptors as they arrive
  // and takes one for each map message.
  struct msghdr msg = {};
  struct iovec iov = {const_cast<char*>(frame.data()), frame.size()};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
  ssize_t w;
  do {
    w = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w <= 0) return false;
  return static_cast<size_t>(w) == frame.size() ||
         WriteAll(sock, frame.data() + w, frame.size() - static_cast<size_t>(w));
}

std::shared_ptr<Reply> Channel::Send(v1::StubRequest request) {
  auto reply = std::make_shared<Reply>();
  {
    absl::MutexLock lock(&mu_);
    if (!alive_) {
      reply->died = "not running";
      reply->done.Notify();
      return reply;
    }
    request.set_id(next_id_++);
    waiting_[request.id()] = reply;
  }
  // A failed write means the stub is gone: the reader thread answers every waiting request.
  SendFrame(ToJson(request), -1);
  return reply;
}

void Channel::SendNoReply(const v1::StubRequest& request) { SendFrame(ToJson(request), -1); }

void Channel::ReaderLoop(int sock, pid_t pid) {
  std::string body;
  while (true) {
    unsigned char len[4];
    if (!ReadAll(sock, reinterpret_cast<char*>(len), 4)) break;
    const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
    if (n > kMaxFrameBytes) break;
    body.resize(n);
    if (!ReadAll(sock, body.data(), n)) break;
    v1::StubResponse r;
    google::protobuf::util::JsonParseOptions opts;
    opts.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(body, &r, opts).ok()) {
      Log("[model] unreadable message from the model process; stopping it");
      break;
    }
    NoteGpus(r);
    std::shared_ptr<Reply> reply;
    {
      absl::MutexLock lock(&mu_);
      auto it = waiting_.find(r.id());
      if (it != waiting_.end()) {
        reply = it->second;
        waiting_.erase(it);
      }
    }
    if (reply) {
      reply->response = std::move(r);
      reply->done.Notify();
    }
  }
  // The stub is gone (or broke the protocol): reap it and answer everything still waiting.
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string died = DescribeExit(status);
  std::map<int64_t, std::shared_ptr<Reply>> waiting;
  {
    absl::MutexLock lock(&mu_);
    alive_ = false;
    waiting.swap(waiting_);
    if (sock_ == sock) sock_ = -1;
  }
  close(sock);
  Log("[model] model process ", pid, " ended (", died, ")");
  for (auto& [id, reply] : waiting) {
    reply->died = died;
    reply->done.Notify();
  }
}

absl::Status Channel::Spawn() {
  const std::string dir = PythonPackageDir();
  struct stat st;
  if (dir.empty() || stat((dir + "/tally/stub.py").c_str(), &st) != 0) {
    return absl::NotFoundError("Tally's Python package (python/tally/stub.py) was not found on this host; set "
                               "TALLY_PYTHON_DIR to the repository's python/ folder");
  }
  int sv[2], out[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const std::string python = options_.python.empty() ? "python3" : options_.python;
  std::vector<std::string> args = {python, "-u", "-m", "tally.stub"};
  std::vector<std::string> env;
  std::string pythonpath = dir;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      if (kv.size() > 11) pythonpath += ":" + kv.substr(11);
      continue;
    }
    if (kv.rfind("TALLY_STUB_FD=", 0) == 0) continue;
    env.push_back(kv);
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  env.push_back("TALLY_STUB_FD=3");
  env.push_back("PYTHONUNBUFFERED=1");
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group (a Ctrl-C at the terminal reaches the worker, which stops the stub), an
  // empty signal mask (the worker blocks the termination signals it waits for) and default
  // dispositions.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, python.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(sv[1]);
  close(out[1]);
  if (rc != 0) {
    close(sv[0]);
    close(out[0]);
    return absl::NotFoundError(absl::StrCat("cannot start the Python interpreter '", python, "' (--python): ",
                                            strerror(rc)));
  }
  // The stub's output, line by line, into this worker's log. Detached: a process the model started
  // may hold the pipe open after the stub is gone.
  std::thread([fd = out[0]] {
    std::string pending;
    char buf[4096];
    while (true) {
      const ssize_t r = read(fd, buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      pending.append(buf, static_cast<size_t>(r));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        Log("[model] ", pending.substr(0, nl));
        pending.erase(0, nl + 1);
      }
      if (pending.size() > 65536) {
        Log("[model] ", pending);
        pending.clear();
      }
    }
    if (!pending.empty()) Log("[model] ", pending);
    close(fd);
  }).detach();
  std::vector<std::pair<int64_t, std::pair<int, size_t>>> buffers;
  {
    absl::MutexLock lock(&mu_);
    sock_ = sv[0];
    pid_ = pid;
    alive_ = true;
    buffers.assign(buffers_.begin(), buffers_.end());
  }
  reader_ = std::thread(&Channel::ReaderLoop, this, sv[0], pid);
  for (const auto& [id, b] : buffers) SendMap(id, b.first, b.second);
  return absl::OkStatus();
}

absl::Status Channel::EnsureRunning() {
  absl::MutexLock start(&start_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (alive_) return absl::OkStatus();
  }
  if (reader_.joinable()) reader_.join();
  if (absl::Status s = Spawn(); !s.ok()) return s;
  v1::StubRequest init;
  init.set_op("init");
  init.set_model_path(options_.model_path);
  init.set_class_name(options_.class_name);
  for (const std::string& d : options_.devices) init.add_devices(d);
  for (const auto& [k, v] : options_.model_options) (*init.mutable_options())[k] = v;
  std::shared_ptr<Reply> reply = Send(init);
  reply->done.WaitForNotification();
  if (!reply->died.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", options_.model_path, "': the model process died while "
                                                   "loading the model (", reply->died,
                                                   "); its output is in the worker's log"));
  }
  if (!reply->response.error().empty()) {
    SendExit();
    return absl::InvalidArgumentError(
        absl::StrCat("model '", options_.model_path, "' could not be loaded: ", reply->response.error()));
  }
  model_classes_ = reply->response.num_classes();
  probabilities_ = reply->response.outputs_probabilities();
  return absl::OkStatus();
}

void Channel::Stop() {
  absl::MutexLock start(&start_mu_);
  pid_t pid = -1;
  int sock = -1;
  {
    absl::MutexLock lock(&mu_);
    if (alive_) {
      pid = pid_;
      sock = sock_;
    }
  }
  if (pid > 0) {
    SendExit();
    shutdown(sock, SHUT_WR);
    // Up to 5 s to exit by itself (the reader thread reaps it), then SIGKILL.
    for (int i = 0; i < 50; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (!alive_) break;
      }
      usleep(100 * 1000);
    }
    bool still = false;
    {
      absl::MutexLock lock(&mu_);
      still = alive_;
    }
    if (still) kill(pid, SIGKILL);
  }
  if (reader_.joinable()) reader_.join();
}

// What the stub answered for one batch, turned into the counts the pipeline reads.
class PythonPendingBatch final : public PendingBatch {
 public:
  PythonPendingBatch(std::shared_ptr<Channel> channel, v1::StubRequest request, BatchSpec spec,
                     std::unique_ptr<ShmBuffer> output, std::shared_ptr<Reply> reply)
      : channel_(std::move(channel)),
        request_(std::move(request)),
        spec_(std::move(spec)),
        output_(std::move(output)),
        reply_(std::move(reply)) {}
  ~PythonPendingBatch() override {
    // The stub has answered (or died): nothing writes to the buffer any more.
    if (reply_->done.HasBeenNotified()) channel_->ReturnOutput(std::move(output_));
  }

  absl::Status Wait() override;
  int num_classes() const override { return k_; }
  const int64_t* confusion(int i) const override { return counts_.data() + static_cast<size_t>(i) * k_ * k_; }
  const uint16_t* labels(int i) const override { return label_ptrs_[i]; }
  int64_t nonfinite(int i) const override { return nonfinite_[i]; }
  int64_t logit_ties() const override { return 0; }
  std::string error(int i) const override { return errors_[i]; }
  const int64_t* threshold_counts(int i) const override {
    return thresholds_.empty() ? nullptr : thresholds_.data() + static_cast<size_t>(i) * 4 * num_thresholds_;
  }

 private:
  absl::Status Evaluate();
  void EvaluateImage(size_t i, const v1::StubOutput& out);

  std::shared_ptr<Channel> channel_;
  v1::StubRequest request_;
  BatchSpec spec_;
  std::unique_ptr<ShmBuffer> output_;
  std::shared_ptr<Reply> reply_;
  bool waited_ = false;
  absl::Status status_;
  int k_ = 0;
  std::vector<int> item_k_;
  std::vector<int64_t> counts_;
  std::vector<const uint16_t*> label_ptrs_;
  std::vector<std::vector<uint16_t>> owned_labels_;
  std::vector<int64_t> nonfinite_;
  std::vector<std::string> errors_;
  size_t num_thresholds_ = 0;
  std::vector<int64_t> thresholds_;
};

absl::Status PythonPendingBatch::Wait() {
  if (waited_) return status_;
  waited_ = true;
  reply_->done.WaitForNotification();
  if (!reply_->died.empty() && spec_.items.size() == 1) {
    // One image: restart the stub and try once more before blaming the row.
    Log("[model] the model process died (", reply_->died, ") on row ",
        request_.items(0).index(), "; restarting it and retrying the row once");
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return status_ = absl::FailedPreconditionError(s.message());
    reply_ = channel_->Send(request_);
    reply_->done.WaitForNotification();
  }
  if (!reply_->died.empty()) {
    const std::string died = reply_->died;
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return status_ = absl::FailedPreconditionError(s.message());
    return status_ = absl::AbortedError(absl::StrCat("model process died (", died, ")"));
  }
  const v1::StubResponse& r = reply_->response;
  if (r.oom()) return status_ = absl::ResourceExhaustedError(r.error());
  if (!r.error().empty()) return status_ = absl::AbortedError(absl::StrCat("model raised ", r.error()));
  const double t0 = NowUnix();
  status_ = Evaluate();
  static const bool profile = std::getenv("TALLY_PIPELINE_PROFILE") != nullptr;
  if (profile) {
    // Counting on the CPU, per batch (worker/pipeline.h's profile has the rest).
    static std::atomic<int64_t> batches{0}, micros{0};
    micros += static_cast<int64_t>((NowUnix() - t0) * 1e6);
    if (++batches % 50 == 0) {
      Log("python runner profile: counting ", absl::StrFormat("%.2f", micros.load() / 1000.0 / batches.load()),
          " ms per batch over ", batches.load(), " batches");
    }
  }
  return status_;
}

absl::Status PythonPendingBatch::Evaluate() {
  const v1::StubResponse& r = reply_->response;
  const size_t n = spec_.items.size();
  if (static_cast<size_t>(r.outputs_size()) != n) {
    return absl::AbortedError(absl::StrCat("the model process answered ", r.outputs_size(), " outputs for ", n,
                                           " images"));
  }
  const ModelRunnerOptions& o = channel_->options();
  const int declared = channel_->model_classes() > 0 ? channel_->model_classes() : o.num_classes;
  item_k_.assign(n, 0);
  errors_.assign(n, std::string());
  nonfinite_.assign(n, 0);
  label_ptrs_.assign(n, nullptr);
  owned_labels_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const v1::StubOutput& out = r.outputs(static_cast<int>(i));
    nonfinite_[i] = out.nonfinite();
    if (!out.error().empty()) {
      errors_[i] = out.error();
    } else if (out.kind() == "argmax") {
      item_k_[i] = out.channels();
      if (declared > 0 && out.channels() != declared) {
        errors_[i] = absl::StrCat("the model returned ", out.channels(), " score channels, but it has ", declared,
                                  " classes (", channel_->model_classes() > 0 ? "Model.num_classes" : "--num-classes",
                                  ")");
      }
    } else if (out.kind() == "score") {
      item_k_[i] = 2;
    } else if (out.kind() == "labels") {
      if (declared <= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", o.model_path, "' returned label maps, but neither its num_classes attribute nor --num-classes "
            "says how many classes there are"));
      }
      item_k_[i] = declared;
    } else {
      errors_[i] = absl::StrCat("the model process answered an unknown output kind '", out.kind(), "'");
    }
    if (!o.thresholds.empty() && errors_[i].empty() && out.kind() != "score") {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", o.model_path, "': --thresholds needs a single-score output (H x W or 1 x H x W floats); it "
          "returned ", out.kind() == "argmax" ? absl::StrCat(out.channels(), " score channels") : "class labels"));
    }
  }
  for (size_t i = 0; i < n && k_ == 0; ++i) k_ = item_k_[i];
  if (k_ == 0) k_ = std::max(2, declared);
  counts_.assign(n * k_ * k_, 0);
  num_thresholds_ = o.thresholds.size();
  thresholds_.assign(n * 4 * num_thresholds_, 0);
  // Counting is per pixel: spread the images over a few threads.
  const size_t threads = std::min<size_t>(n, std::max<size_t>(1, std::min(8u, std::thread::hardware_concurrency() / 2)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      if (errors_[i].empty()) EvaluateImage(i, r.outputs(static_cast<int>(i)));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return absl::OkStatus();
}

void PythonPendingBatch::EvaluateImage(size_t i, const v1::StubOutput& out) {
  const BatchImage& it = spec_.items[i];
  const size_t hw = static_cast<size_t>(it.height) * it.width;
  const uint8_t* base = output_->data() + request_.items(static_cast<int>(i)).output_offset();
  const uint16_t* mask = reinterpret_cast<const uint16_t*>(spec_.masks->data()) + it.mask_offset;
  if (item_k_[i] != k_) {
    errors_[i] = absl::StrCat("the model returned ", item_k_[i], " classes for this image but ", k_,
                              " for others in its batch");
    return;
  }
  const int K = k_;
  const uint16_t* pred = nullptr;
  if (out.kind() == "score") {
    const float* score = reinterpret_cast<const float*>(base);
    const bool probs = channel_->outputs_probabilities();
    std::vector<uint16_t>& labels = owned_labels_[i];
    labels.resize(hw);
    int64_t bad = 0;
    const float cut = probs ? 0.5f : 0.0f;
    for (size_t p = 0; p < hw; ++p) {
      bad += !std::isfinite(score[p]);
      labels[p] = score[p] > cut ? 1 : 0;
    }
    nonfinite_[i] = bad;
    pred = labels.data();
    const std::vector<double>& ts = channel_->options().thresholds;
    if (!ts.empty()) {
      // Foreground where the probability is > t: for logits, sigmoid(x) > t <=> x > log(t / (1 - t)).
      int64_t* tc = thresholds_.data() + i * 4 * ts.size();
      for (size_t t = 0; t < ts.size(); ++t) {
        const double c = probs ? ts[t] : std::log(ts[t] / (1.0 - ts[t]));
        int64_t tp = 0, fp = 0, fn = 0, tn = 0;
        for (size_t p = 0; p < hw; ++p) {
          const uint16_t ref = mask[p];
          if (ref == kIgnoredPixel || ref >= 2) continue;
          const bool fg = static_cast<double>(score[p]) > c;
          tp += fg && ref == 1;
          fp += fg && ref == 0;
          fn += !fg && ref == 1;
          tn += !fg && ref == 0;
        }
        tc[4 * t] = tp;
        tc[4 * t + 1] = fp;
        tc[4 * t + 2] = fn;
        tc[4 * t + 3] = tn;
      }
    }
  } else {
    pred = reinterpret_cast<const uint16_t*>(base);
  }
  label_ptrs_[i] = pred;
  // A label >= K fails the row, named by its first pixel (the maximum first: one vectorised pass).
  uint16_t top = 0;
  for (size_t p = 0; p < hw; ++p) top = std::max(top, pred[p]);
  if (top >= K) {
    for (size_t p = 0; p < hw; ++p) {
      if (pred[p] >= K) {
        errors_[i] = absl::StrCat("the model's output has label ", pred[p], " at (y=", p / it.width, ", x=",
                                  p % it.width, ") >= number of classes ", K);
        return;
      }
    }
  }
  CountConfusionMatrix(pred, mask, hw, K, counts_.data() + i * K * K);
}

class PythonRunner final : public ModelRunner {
 public:
  explicit PythonRunner(std::shared_ptr<Channel> channel, double load_seconds)
      : channel_(std::move(channel)), load_seconds_(load_seconds) {}
  ~PythonRunner() override {
    channel_->Stop();
    channel_->ClosePool();
  }

  std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) override { return ShmBuffer::Create(channel_, bytes); }

  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) override {
    auto* images = dynamic_cast<ShmBuffer*>(batch.images);
    if (images == nullptr || batch.masks == nullptr || batch.items.empty()) {
      return absl::InternalError("Launch: buffers not allocated by this runner, or an empty batch");
    }
    if (absl::Status s = channel_->EnsureRunning(); !s.ok()) return absl::FailedPreconditionError(s.message());
    size_t need = 0;
    for (const BatchImage& it : batch.items) need += static_cast<size_t>(it.height) * it.width * 4;
    std::unique_ptr<ShmBuffer> output = channel_->TakeOutput(channel_, need);
    if (!output) return absl::ResourceExhaustedError("cannot allocate shared memory for the model's outputs");
    v1::StubRequest req;
    req.set_op("predict");
    req.set_image_buffer(images->id());
    req.set_output_buffer(output->id());
    const std::vector<std::string>& columns = channel_->options().columns;
    size_t off = 0;
    for (const BatchImage& it : batch.items) {
      v1::StubItem* item = req.add_items();
      item->set_image_offset(static_cast<int64_t>(it.image_offset));
      item->set_output_offset(static_cast<int64_t>(off));
      item->set_height(it.height);
      item->set_width(it.width);
      off += static_cast<size_t>(it.height) * it.width * 4;
      if (it.row != nullptr) {
        const v1::ManifestRow& row = *it.row;
        item->set_index(row.index());
        auto& m = *item->mutable_row();
        // Other columns first: the fixed keys win where a column shares their name.
        for (int c = 0; c < row.columns_size() && c < static_cast<int>(columns.size()); ++c) m[columns[c]] = row.columns(c);
        m["id"] = row.id();
        m["image"] = row.image_path();
        m["mask"] = row.mask_path();
      }
    }
    std::shared_ptr<Reply> reply = channel_->Send(req);
    return std::unique_ptr<PendingBatch>(
        new PythonPendingBatch(channel_, std::move(req), batch, std::move(output), std::move(reply)));
  }

  void ReleaseCachedMemory() override {
    v1::StubRequest req;
    req.set_op("empty_cache");
    channel_->SendNoReply(req);
  }

  void ResetPeakMemory() override {
    v1::StubRequest req;
    req.set_op("reset_peak");
    channel_->SendNoReply(req);
  }

  absl::StatusOr<int> FindMaxBatch(int, int, double, int, int fallback) override { return fallback; }

  RunnerStats Stats() override {
    RunnerStats s;
    const std::vector<std::string>& devices = channel_->options().devices;
    s.device = devices.empty() ? "cpu" : absl::StrJoin(devices, ",");
    s.load_seconds = load_seconds_;
    s.gpus = channel_->gpus();
    for (const GpuUsage& g : s.gpus) {
      if (s.gpu_name.empty()) s.gpu_name = g.name;
      s.peak_memory_bytes = std::max(s.peak_memory_bytes, g.peak_memory_bytes);
    }
    return s;
  }

  bool is_cuda() const override {
    const std::vector<std::string>& devices = channel_->options().devices;
    return !devices.empty() && devices[0].rfind("cuda", 0) == 0;
  }

 private:
  std::shared_ptr<Channel> channel_;
  double load_seconds_;
};

}  // namespace

std::string PythonPackageDir() {
  struct stat st;
  auto has_stub = [&](const std::string& d) { return stat((d + "/tally/stub.py").c_str(), &st) == 0; };
  if (const char* env = getenv("TALLY_PYTHON_DIR"); env != nullptr && *env != '\0') return env;
  const std::string exe = ExecutableDir();
  for (const std::string& d : {exe + "/../python", exe + "/../share/tally/python"}) {
    if (has_stub(d)) return d;
  }
#ifdef TALLY_PYTHON_SOURCE_DIR
  if (has_stub(TALLY_PYTHON_SOURCE_DIR)) return TALLY_PYTHON_SOURCE_DIR;
#endif
  return std::string();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreatePythonRunner(const ModelRunnerOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  struct stat st;
  if (stat(options.model_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", options.model_path, "' does not exist"));
  }
  auto channel = std::make_shared<Channel>(options);
  if (absl::Status s = channel->EnsureRunning(); !s.ok()) return s;
  const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log("Python model ", options.model_path, ":", options.class_name, " loaded in ", load, " s on ",
      absl::StrJoin(options.devices, ","));
  return std::unique_ptr<ModelRunner>(new PythonRunner(std::move(channel), load));
}

}  // namespace tally
