// Internal to the Python backend (worker/python/python_runner.cc, worker/python/python_channel.cc): the stub
// process and the protocol spoken with it. Control messages are JSON forms of
// StubRequest/StubResponse (proto/tally.proto) over a socket pair, each a 4-byte length and the
// text; images, masks and outputs travel in memfd buffers whose descriptors are passed once
// (SCM_RIGHTS) and mapped on both sides. A reader thread hands answers to the requests waiting.
#ifndef TALLY_WORKER_PYTHON_PYTHON_CHANNEL_H_
#define TALLY_WORKER_PYTHON_PYTHON_CHANNEL_H_

#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/synchronization/notification.h"
#include "proto/tally.pb.h"
#include "worker/interfaces/model_runner.h"

namespace tally {
namespace python_internal {

class ShmBuffer;

// A response, or the stub's death, for one request.
struct Reply {
  absl::Notification done;
  v1::StubResponse response;
  std::string died;  // Non-empty: the stub died before answering ("signal 9").
};

// The last lines the stub printed (stdout and stderr), kept for the error a failed start gives,
// and whether its output has ended (the pipe closed).
class OutputTail {
 public:
  void Add(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_);
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // The lines so far, once the output has ended or `timeout` has passed.
  std::vector<std::string> Lines(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::deque<std::string> lines_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// "ModuleNotFoundError: No module named 'numpy'": the line of a Python traceback that says what
// went wrong (its last line naming an exception), else the last non-empty line; "" for none.
std::string StubFailureCause(const std::vector<std::string>& lines);

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
  // --compile: the stub's compile_trial is answered with the job's choice (ModelRunner::
  // SetCompileResolver); with a trial already run by this stub, it is proposed at once.
  void SetCompileResolver(CompileResolver resolver) ABSL_LOCKS_EXCLUDED(mu_);
  const ModelRunnerOptions& options() const { return options_; }

  // Output buffers outlive their batch in a small pool: a new buffer costs a memfd, a mapping on
  // both sides and, on CUDA, page-locking it in the stub.
  std::unique_ptr<ShmBuffer> TakeOutput(std::shared_ptr<Channel> self, size_t bytes) ABSL_LOCKS_EXCLUDED(pool_mu_);
  void ReturnOutput(std::unique_ptr<ShmBuffer> buffer) ABSL_LOCKS_EXCLUDED(pool_mu_);
  // Drops the pool (its buffers refer back to this channel) and stops pooling.
  void ClosePool() ABSL_LOCKS_EXCLUDED(pool_mu_);

 private:
  // The stub's environment (StubEnvironment) with Tally's package in `package_dir`.
  std::vector<std::string> StubEnv(const std::string& package_dir) const;
  // Starts the stub, or takes the spare one started for it (options_.spare_interpreter).
  absl::Status Spawn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(start_mu_);
  bool SendFrame(const std::string& json, int fd_to_pass) ABSL_LOCKS_EXCLUDED(mu_);
  // Passes a buffer's descriptor to the stub, which maps it.
  void SendMap(int64_t id, int fd, size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void SendExit() ABSL_LOCKS_EXCLUDED(mu_);
  void ReaderLoop(int sock, pid_t pid);
  // Agrees the job's choice for `trial` (the resolver, else the trial's own) and tells the stub.
  void DecideCompile(const v1::CompileTrial& trial, bool from_earlier_job) ABSL_LOCKS_EXCLUDED(mu_);

  const ModelRunnerOptions options_;
  std::shared_ptr<OutputTail> output_;  // The current stub's (Spawn).
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
  CompileResolver compile_resolver_ ABSL_GUARDED_BY(mu_);
  bool has_trial_ ABSL_GUARDED_BY(mu_) = false;  // This stub ran its trial (reset by a restart).
  v1::CompileTrial trial_ ABSL_GUARDED_BY(mu_);
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

}  // namespace python_internal


}  // namespace tally

#endif  // TALLY_WORKER_PYTHON_PYTHON_CHANNEL_H_
