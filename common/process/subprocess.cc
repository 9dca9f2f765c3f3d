#include "common/process/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace tally {

std::string WithHugePageMalloc(const char* tunables) {
  const std::string current = tunables == nullptr ? "" : tunables;
  for (absl::string_view t : absl::StrSplit(current, ':')) {
    if (absl::StartsWith(t, "glibc.malloc.hugetlb=")) return current;  // The user's choice stands.
  }
  return current.empty() ? "glibc.malloc.hugetlb=1" : current + ":glibc.malloc.hugetlb=1";
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& kv : options.env) overridden |= kv.first == key;
    if (!overridden) env_strings.push_back(entry);
  }
  for (const auto& kv : options.env) env_strings.push_back(kv.first + "=" + kv.second);
  if (!options.keep_malloc_tunables &&
      std::none_of(options.env.begin(), options.env.end(), [](const auto& kv) { return kv.first == "GLIBC_TUNABLES"; })) {
    env_strings.erase(std::remove_if(env_strings.begin(), env_strings.end(),
                                     [](const std::string& e) { return e.rfind("GLIBC_TUNABLES=", 0) == 0; }),
                      env_strings.end());
    env_strings.push_back("GLIBC_TUNABLES=" + WithHugePageMalloc(std::getenv("GLIBC_TUNABLES")));
  }
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = options.argv;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open log '", options.log_path, "': ", std::strerror(errno)));
    }
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpu_affinity) CPU_SET(c, &cpus);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    if (!options.cpu_affinity.empty()) sched_setaffinity(0, sizeof(cpus), &cpus);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "exec failed\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (!exited_) Terminate(3.0);
}

void Subprocess::Reaped(int status) {
  exited_ = true;
  if (WIFEXITED(status)) {
    exit_code_ = WEXITSTATUS(status);
    exit_description_ = absl::StrCat("exit code ", exit_code_);
  } else if (WIFSIGNALED(status)) {
    exit_code_ = 128 + WTERMSIG(status);
    exit_description_ = absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
}

bool Subprocess::Running() {
  if (exited_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    Reaped(status);
    return false;
  }
  return r == 0;
}

void Subprocess::Signal(int sig) {
  if (!exited_) kill(pid_, sig);
}

void Subprocess::Terminate(double grace_seconds) {
  if (exited_) return;
  kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!Running()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  if (waitpid(pid_, &status, 0) == pid_) Reaped(status);
  exited_ = true;
}

std::string ExecutableDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  std::string path(buf);
  return path.substr(0, path.find_last_of('/'));
}

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

std::string FindExecutable(const std::string& name) {
  auto executable = [](const std::string& p) { return access(p.c_str(), X_OK) == 0; };
  std::string sibling = ExecutableDir() + "/" + name;
  if (executable(sibling)) return sibling;
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (executable(candidate)) return candidate;
  }
  return "";
}

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - max_bytes : 0;
  in.seekg(start);
  std::string out(static_cast<size_t>(size - start), '\0');
  in.read(out.data(), size - start);
  return out;
}

std::vector<int> AllowedCpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
  }
  if (out.empty()) {
    unsigned n = std::thread::hardware_concurrency();
    for (unsigned c = 0; c < std::max(1u, n); ++c) out.push_back(static_cast<int>(c));
  }
  return out;
}

}  // namespace tally
