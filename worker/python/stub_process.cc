// Starting the Python backend's stub process, and the spare one (worker/python/stub_process.h).
#include "worker/python/stub_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "worker/python/python_channel.h"

namespace tally {
namespace python_internal {
namespace {

// The stub's output, line by line, into this worker's log and `tail`. Detached: a process the model
// started may hold the pipe open after the stub is gone.
void ForwardStubOutput(int fd, std::shared_ptr<OutputTail> tail) {
  std::thread([fd, tail] {
    std::string pending;
    char buf[4096];
    auto emit = [&](const std::string& line) {
      Log("[model] ", line);
      tail->Add(line);
    };
    while (true) {
      const ssize_t r = read(fd, buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      pending.append(buf, static_cast<size_t>(r));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        emit(pending.substr(0, nl));
        pending.erase(0, nl + 1);
      }
      if (pending.size() > 65536) {
        emit(pending);
        pending.clear();
      }
    }
    if (!pending.empty()) emit(pending);
    tail->Close();
    close(fd);
  }).detach();
}

// posix_spawnp of the stub (see StartStubProcess). Returns posix_spawnp's error number (0: started).
int SpawnStub(const std::string& python, std::vector<std::string> args, std::vector<std::string> env, int out_fd,
              int sock_fd, pid_t* pid) {
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  posix_spawn_file_actions_adddup2(&fa, sock_fd, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own process group: a Ctrl-C at the terminal reaches the worker, which stops the stub.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int rc = posix_spawnp(pid, python.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc;
}

void Kill(const StubProcess& p) {
  kill(p.pid, SIGKILL);
  while (waitpid(p.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  close(p.sock);
}

// Whether the process has exited (then reaped here, and marked so: `reaped`).
bool ExitedAndReaped(StubProcess& p) {
  if (!p.reaped && waitpid(p.pid, nullptr, WNOHANG) == p.pid) p.reaped = true;
  return p.reaped;
}

// The worker's one spare stub (TakeSpareStub, PrepareSpareStub).
class SpareStubs {
 public:
  static SpareStubs& Get() {
    static SpareStubs* const spares = new SpareStubs();
    return *spares;
  }

  std::optional<StubProcess> Take(const std::string& python, const std::vector<std::string>& env)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<Spare> spare;
    {
      absl::MutexLock lock(&mu_);
      spare.swap(spare_);
    }
    if (!spare) return std::nullopt;
    // Still running? (A spare whose interpreter failed has exited.)
    const bool exited = ExitedAndReaped(spare->process);
    if (exited || spare->python != python || spare->env != env) {
      Stop(*spare);
      Log("[model] the spare model process (pid ", spare->process.pid, ") ",
          exited ? "had exited" : "was prepared for another interpreter or environment", "; starting a new one");
      return std::nullopt;
    }
    Log("[model] the model process prepared while the last job ran (pid ", spare->process.pid, ") takes this job");
    return spare->process;
  }

  void Prepare(const std::string& python, const std::vector<std::string>& env) ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<Spare> old;
    {
      absl::MutexLock lock(&mu_);
      if (spare_ && spare_->python == python && spare_->env == env && !ExitedAndReaped(spare_->process)) {
        return;  // Prepared already, and still running.
      }
      old.swap(spare_);
    }
    if (old) Stop(*old);
    std::vector<std::string> spare_env = env;
    spare_env.push_back("TALLY_STUB_SPARE=1");
    absl::StatusOr<StubProcess> started = StartStubProcess(python, spare_env);
    if (!started.ok()) {
      Log("[model] no spare model process: ", started.status().message());
      return;
    }
    Log("[model] preparing a model process for the next job (pid ", started->pid, ")");
    std::optional<Spare> replaced;
    {
      absl::MutexLock lock(&mu_);
      replaced.swap(spare_);  // Another channel's, prepared meanwhile.
      spare_ = Spare{python, env, *started};
    }
    if (replaced) Stop(*replaced);
  }

 private:
  struct Spare {
    std::string python;
    std::vector<std::string> env;
    StubProcess process;
  };
  static void Stop(Spare& spare) {
    if (spare.process.reaped) {
      close(spare.process.sock);
    } else {
      Kill(spare.process);
    }
  }

  absl::Mutex mu_;
  std::optional<Spare> spare_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::vector<std::string> StubEnvironment(const std::string& package_dir, const std::string& inductor_cache,
                                         const std::string& bytecode_cache, const std::string& preload_dir) {
  std::vector<std::string> env;
  std::string pythonpath = package_dir;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      if (kv.size() > 11) pythonpath += ":" + kv.substr(11);
      continue;
    }
    bool ours = false;
    for (const char* name : {"TALLY_STUB_FD=", "TALLY_BYTECODE_DIR=", "TALLY_PRELOAD_DIR=", "TALLY_STUB_SPARE="}) {
      ours = ours || kv.rfind(name, 0) == 0;
    }
    if (!ours) env.push_back(kv);
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  env.push_back("TALLY_STUB_FD=3");
  env.push_back("PYTHONUNBUFFERED=1");
  if (!bytecode_cache.empty()) env.push_back("TALLY_BYTECODE_DIR=" + bytecode_cache);
  if (!preload_dir.empty()) env.push_back("TALLY_PRELOAD_DIR=" + preload_dir);
  if (!inductor_cache.empty()) {
    env.push_back("TORCHINDUCTOR_CACHE_DIR=" + inductor_cache);
    env.push_back("TORCHINDUCTOR_FX_GRAPH_CACHE=1");
    env.push_back("TORCHINDUCTOR_AUTOGRAD_CACHE=1");
  }
  return env;
}

absl::StatusOr<StubProcess> StartStubProcess(const std::string& python, const std::vector<std::string>& env) {
  int sv[2], out[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  StubProcess p;
  const int rc = SpawnStub(python, {python, "-u", "-m", "tally.stub"}, env, out[1], sv[1], &p.pid);
  close(sv[1]);
  close(out[1]);
  if (rc != 0) {
    close(sv[0]);
    close(out[0]);
    return absl::NotFoundError(absl::StrCat("cannot start the Python interpreter '", python, "' (--python): ",
                                            strerror(rc)));
  }
  p.sock = sv[0];
  p.output = std::make_shared<OutputTail>();
  ForwardStubOutput(out[0], p.output);
  return p;
}

std::optional<StubProcess> TakeSpareStub(const std::string& python, const std::vector<std::string>& env) {
  return SpareStubs::Get().Take(python, env);
}

void PrepareSpareStub(const std::string& python, const std::vector<std::string>& env) {
  SpareStubs::Get().Prepare(python, env);
}

}  // namespace python_internal
}  // namespace tally
