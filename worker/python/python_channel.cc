// The Python backend's channel to its stub process (worker/python/python_channel.h): spawning and
// restarting the stub, framing and sending requests, the reader thread, and the shared buffers.
#include "worker/python/python_channel.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/process/subprocess.h"
#include "google/protobuf/util/json_util.h"
#include "proto/tally.pb.h"
#include "worker/python/stub_process.h"

namespace tally {
namespace python_internal {
namespace {

constexpr uint32_t kMaxFrameBytes = 64u << 20;  // The largest control message either side accepts.

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

// Where this worker's own output goes, where that is a file ("" for a terminal or a pipe).
std::string WorkerLogPath() {
  char target[4096];
  const ssize_t n = readlink("/proc/self/fd/2", target, sizeof(target) - 1);
  if (n <= 0) return "";
  target[n] = '\0';
  struct stat st;
  return target[0] == '/' && stat(target, &st) == 0 && S_ISREG(st.st_mode) ? std::string(target) : "";
}

}  // namespace

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

void Channel::SetCompileResolver(CompileResolver resolver) {
  v1::CompileTrial trial;
  {
    absl::MutexLock lock(&mu_);
    compile_resolver_ = std::move(resolver);
    if (!has_trial_ || !alive_) return;
    trial = trial_;
  }
  DecideCompile(trial, true);
}

void Channel::DecideCompile(const v1::CompileTrial& trial, bool from_earlier_job) {
  CompileResolver resolver;
  {
    absl::MutexLock lock(&mu_);
    resolver = compile_resolver_;
  }
  bool compiled = trial.faster();
  if (resolver) {
    absl::StatusOr<bool> agreed = resolver(trial.faster(), trial);
    if (agreed.ok()) {
      compiled = *agreed;
    } else {
      Log("[model] --compile: cannot agree on the job's choice with the coordinator (", agreed.status().message(),
          "); this worker keeps its own trial's");
    }
  }
  {
    absl::MutexLock lock(&mu_);
    has_trial_ = true;
    trial_ = trial;
  }
  v1::StubRequest decision;
  decision.set_op("compile_decision");
  decision.set_compiled(compiled);
  SendNoReply(decision);
  Log("[model] --compile: ", compiled ? "compiled" : "eager (compiling declined)", " for this job (",
      compiled == trial.faster() ? "" : "not ", "this worker's choice; ", from_earlier_job ? "an earlier job's " : "",
      absl::StrFormat("trial: eager %.2f ms, compiled %.2f ms a batch of %d, compiled in %.1f s", trial.eager_ms(),
                      trial.compiled_ms(), trial.batch(), trial.compile_seconds()),
      trial.precompiled().empty() ? "" : absl::StrCat("; precompiled: ", trial.precompiled()),
      trial.note().empty() ? "" : absl::StrCat("; ", trial.note()), ")");
}

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
    if (r.op() == "compile_trial") {  // The stub waits for the job's choice before it answers.
      DecideCompile(r.trial(), false);
      continue;
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

std::vector<std::string> Channel::StubEnv(const std::string& package_dir) const {
  return StubEnvironment(package_dir, options_.compile_cache_dir, options_.bytecode_cache_dir,
                         options_.preload_dir);
}

absl::Status Channel::Spawn() {
  const std::string dir = PythonPackageDir();
  struct stat st;
  if (dir.empty() || stat((dir + "/tally/stub.py").c_str(), &st) != 0) {
    return absl::NotFoundError("Tally's Python package (python/tally/stub.py) was not found on this host; set "
                               "TALLY_PYTHON_DIR to the repository's python/ folder");
  }
  const std::string python = options_.python.empty() ? "python3" : options_.python;
  const std::vector<std::string> env = StubEnv(dir);
  std::optional<StubProcess> spare;
  if (options_.spare_interpreter) spare = TakeSpareStub(python, env);
  StubProcess p;
  if (spare) {
    p = *spare;
  } else {
    ASSIGN_OR_RETURN(p, StartStubProcess(python, env));
  }
  output_ = p.output;
  std::vector<std::pair<int64_t, std::pair<int, size_t>>> buffers;
  {
    absl::MutexLock lock(&mu_);
    sock_ = p.sock;
    pid_ = p.pid;
    alive_ = true;
    has_trial_ = false;  // A new stub: a new trial on its first batch.
    buffers.assign(buffers_.begin(), buffers_.end());
  }
  reader_ = std::thread(&Channel::ReaderLoop, this, p.sock, p.pid);
  for (const auto& [id, b] : buffers) SendMap(id, b.first, b.second);
  return absl::OkStatus();
}

void OutputTail::Add(const std::string& line) {
  absl::MutexLock lock(&mu_);
  lines_.push_back(line.size() > 2000 ? line.substr(0, 2000) : line);
  if (lines_.size() > 40) lines_.pop_front();
}

void OutputTail::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

std::vector<std::string> OutputTail::Lines(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&closed_), timeout);
  return std::vector<std::string>(lines_.begin(), lines_.end());
}

std::string StubFailureCause(const std::vector<std::string>& lines) {
  // A traceback ends with "SomeError: message" (or "SomeError" alone) at the start of a line.
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const std::string& l = *it;
    const size_t colon = l.find(':');
    const std::string name = l.substr(0, colon);
    const bool exception = !name.empty() && std::isupper(static_cast<unsigned char>(name[0])) &&
                           (absl::EndsWith(name, "Error") || absl::EndsWith(name, "Exception") ||
                            absl::EndsWith(name, "Exit") || absl::EndsWith(name, "Interrupt")) &&
                           name.find(' ') == std::string::npos;
    if (exception) return l;
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (!absl::StripAsciiWhitespace(*it).empty()) return std::string(absl::StripAsciiWhitespace(*it));
  }
  return "";
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
  init.set_compile(options_.compile);
  std::shared_ptr<Reply> reply = Send(init);
  reply->done.WaitForNotification();
  if (!reply->died.empty()) {
    // What the interpreter said before it died: usually the cause (No module named 'numpy').
    const std::string cause = StubFailureCause(output_->Lines(absl::Seconds(2)));
    const std::string log = WorkerLogPath();
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options_.model_path, "': the model process (interpreter '",
        options_.python.empty() ? "python3" : options_.python, "', --python) died while loading the model (",
        reply->died, ")", cause.empty() ? "" : absl::StrCat(": ", cause), "; its whole output is in the worker's log",
        log.empty() ? "" : absl::StrCat(" (", log, ")")));
  }
  if (!reply->response.error().empty()) {
    SendExit();
    return absl::InvalidArgumentError(
        absl::StrCat("model '", options_.model_path, "' could not be loaded: ", reply->response.error()));
  }
  if (options_.compile) {
    Log("model ", options_.model_path, ": torch.compile applied to ", absl::StrJoin(reply->response.compiled(), ", "),
        options_.compile_cache_dir.empty() ? "" : absl::StrCat(" (inductor's cache in ", options_.compile_cache_dir, ")"));
  }
  model_classes_ = reply->response.num_classes();
  probabilities_ = reply->response.outputs_probabilities();
  if (options_.spare_interpreter) {
    // The next job's model process, started now so that its imports are done by the time this job
    // ends, even a short one (python/tally/spare.py).
    PrepareSpareStub(options_.python.empty() ? "python3" : options_.python, StubEnv(PythonPackageDir()));
  }
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

}  // namespace python_internal

}  // namespace tally
